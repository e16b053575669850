"""Megatron-LM compatible indexed token shards (``MMapIndexedDataset``: ``.bin`` + ``.idx``).

Layout of ``.idx`` (little-endian, unaligned)::

    magic  b"MMIDIDX\\x00\\x00"   9 bytes
    <Q     version = 1
    <B     dtype code (see DTYPE_CODES)
    <Q     sequence count N
    <Q     document-index length D (= documents + 1)
    int32  lengths[N]
    int64  byte pointers[N]     running sum of length * itemsize
    int64  document indices[D] starts at 0, ends at N
    [int8  modes[N]]            only in multimodal files

``.bin`` holds the token arrays back to back with no header. Files written here open with Megatron's
reader and Megatron's files open here (tested byte for byte against shards Megatron wrote itself).

The writer streams: lengths and document boundaries go to scratch files on disk, not Python lists,
so memory does not grow with the corpus; the final files appear by atomic rename in ``finalize()``,
so a killed run never leaves a half-written shard under the final name.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from common.errors import UserError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER_SIZE = len(MAGIC) + 8 + 1 + 8 + 8  # 34 bytes

DTYPE_CODES: dict[int, type] = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}
_CODE_OF = {np.dtype(v): k for k, v in DTYPE_CODES.items()}


class IndexedDatasetError(UserError, ValueError):
    """A shard is missing, corrupt, truncated or inconsistent; the message names the file."""


def best_dtype(vocab_size: int) -> np.dtype:
    """The dtype Megatron picks: uint16 below 65,500 entries, else int32."""
    if vocab_size is not None and vocab_size < 65500:
        return np.dtype(np.uint16)
    return np.dtype(np.int32)


def dtype_code(dtype: np.dtype | type) -> int:
    try:
        return _CODE_OF[np.dtype(dtype)]
    except KeyError:
        raise ValueError(
            f"dtype {np.dtype(dtype)} has no Megatron code; use one of "
            f"{sorted(str(np.dtype(d)) for d in DTYPE_CODES.values())}"
        ) from None


def data_file_path(prefix: str | os.PathLike) -> str:
    return str(prefix) + ".bin"


def index_file_path(prefix: str | os.PathLike) -> str:
    return str(prefix) + ".idx"


def shard_exists(prefix: str | os.PathLike) -> bool:
    return os.path.isfile(index_file_path(prefix)) and os.path.isfile(data_file_path(prefix))


def write_index(path: str | os.PathLike, dtype: np.dtype, lengths: np.ndarray, document_indices: np.ndarray) -> None:
    """Write a complete ``.idx`` file from in-memory arrays (used for small files and tests)."""
    lengths = np.asarray(lengths, dtype=np.int32)
    document_indices = np.asarray(document_indices, dtype=np.int64)
    itemsize = np.dtype(dtype).itemsize
    pointers = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
    with open(path, "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", VERSION))
        f.write(struct.pack("<B", dtype_code(dtype)))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(document_indices)))
        f.write(lengths.astype("<i4").tobytes(order="C"))
        f.write(pointers.astype("<i8").tobytes(order="C"))
        f.write(document_indices.astype("<i8").tobytes(order="C"))


class IndexedDatasetBuilder:
    """Streaming writer of one shard.

    ``add_item`` appends one sequence (a sentence, or a whole document); ``end_document`` closes the
    current document. ``finalize`` writes the ``.idx`` and renames both files into place.
    Use as a context manager to clean the scratch files if an exception escapes.
    """

    _CHUNK = 1 << 20  # elements copied per step when assembling the index

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype | type = np.uint16) -> None:
        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        dtype_code(self.dtype)  # validate early
        Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        self._tmp = self.prefix + ".tmp"
        self._bin = open(self._tmp + ".bin", "wb")
        self._lengths = open(self._tmp + ".lengths", "wb")
        self._docs = open(self._tmp + ".docs", "wb")
        self._docs.write(struct.pack("<q", 0))
        self.num_sequences = 0
        self.num_documents = 0
        self.num_tokens = 0
        self._seq_at_doc_start = 0
        self._open_item_tokens = 0
        self._closed = False

    # -- writing -----------------------------------------------------------------------------
    def add_item(self, tokens: Sequence[int] | np.ndarray) -> None:
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ValueError(f"add_item expects a 1-D sequence of token ids, got shape {arr.shape}")
        if arr.size and np.issubdtype(arr.dtype, np.integer):
            info = np.iinfo(self.dtype) if np.issubdtype(self.dtype, np.integer) else None
            if info is not None and (arr.min() < info.min or arr.max() > info.max):
                raise ValueError(
                    f"token id out of range for {self.dtype} in {self.prefix}: "
                    f"[{arr.min()}, {arr.max()}]; use a wider dtype"
                )
        self._bin.write(arr.astype(self.dtype, copy=False).tobytes(order="C"))
        self._lengths.write(struct.pack("<i", arr.size))
        self.num_sequences += 1
        self.num_tokens += int(arr.size)

    def append_tokens(self, tokens: np.ndarray) -> None:
        """Stream part of one long sequence (a document arriving in pieces); ``end_item`` closes it.
        Memory stays bounded by the piece, not the document."""
        arr = np.asarray(tokens)
        self._bin.write(arr.astype(self.dtype, copy=False).tobytes(order="C"))
        self._open_item_tokens += int(arr.size)

    def end_item(self) -> None:
        """Close the sequence built by ``append_tokens`` (records its length)."""
        self._lengths.write(struct.pack("<i", self._open_item_tokens))
        self.num_sequences += 1
        self.num_tokens += self._open_item_tokens
        self._open_item_tokens = 0

    def end_document(self) -> None:
        self._docs.write(struct.pack("<q", self.num_sequences))
        self.num_documents += 1
        self._seq_at_doc_start = self.num_sequences

    def add_document(self, sequences: Iterable[Sequence[int] | np.ndarray]) -> None:
        for seq in sequences:
            self.add_item(seq)
        self.end_document()

    def add_raw(self, tokens: np.ndarray, lengths: np.ndarray, document_ends: np.ndarray) -> None:
        """Append pre-tokenized sequences in bulk: ``document_ends`` are sequence counts (relative
        to this call) at which documents end."""
        tokens = np.asarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int32)
        if int(lengths.sum()) != tokens.size:
            raise ValueError("add_raw: lengths do not sum to the token count")
        self._bin.write(tokens.astype(self.dtype, copy=False).tobytes(order="C"))
        self._lengths.write(lengths.astype("<i4").tobytes())
        ends = np.asarray(document_ends, dtype=np.int64) + self.num_sequences
        self._docs.write(ends.astype("<i8").tobytes())
        self.num_sequences += len(lengths)
        self.num_documents += len(ends)
        self.num_tokens += int(tokens.size)
        self._seq_at_doc_start = int(ends[-1]) if len(ends) else self._seq_at_doc_start

    def merge_file(self, prefix: str | os.PathLike) -> None:
        """Append every document of another shard (same dtype), streaming."""
        other = IndexedDataset(prefix)
        if other.dtype != self.dtype:
            raise IndexedDatasetError(
                f"cannot merge {index_file_path(prefix)}: dtype {other.dtype} "
                f"differs from {self.dtype} of {self.prefix}"
            )
        if self.num_sequences != self._seq_at_doc_start:
            raise ValueError("merge_file called inside an open document; call end_document first")
        with open(data_file_path(prefix), "rb") as src:
            shutil.copyfileobj(src, self._bin, 16 << 20)
        n = len(other)
        for start in range(0, n, self._CHUNK):
            self._lengths.write(np.asarray(other.sequence_lengths[start : start + self._CHUNK], dtype="<i4").tobytes())
        docs = np.asarray(other.document_indices[1:], dtype=np.int64) + self.num_sequences
        self._docs.write(docs.astype("<i8").tobytes())
        self.num_sequences += n
        self.num_documents += len(docs)
        self.num_tokens += int(other.num_tokens)
        self._seq_at_doc_start = self.num_sequences
        other.close()

    # -- finishing ---------------------------------------------------------------------------
    def finalize(self) -> None:
        if self.num_sequences != self._seq_at_doc_start:
            self.end_document()  # Megatron closes a trailing open document too
        self._bin.close()
        self._lengths.close()
        self._docs.close()
        tmp_idx = self._tmp + ".idx"
        itemsize = self.dtype.itemsize
        lengths = np.memmap(self._tmp + ".lengths", dtype="<i4", mode="r") if self.num_sequences else np.zeros(0, "<i4")
        docs = np.fromfile(self._tmp + ".docs", dtype="<i8")
        with open(tmp_idx, "wb") as f:
            f.write(MAGIC)
            f.write(struct.pack("<Q", VERSION))
            f.write(struct.pack("<B", dtype_code(self.dtype)))
            f.write(struct.pack("<Q", self.num_sequences))
            f.write(struct.pack("<Q", len(docs)))
            for start in range(0, self.num_sequences, self._CHUNK):
                f.write(np.asarray(lengths[start : start + self._CHUNK]).tobytes())
            offset = 0
            for start in range(0, self.num_sequences, self._CHUNK):
                chunk = np.asarray(lengths[start : start + self._CHUNK], dtype=np.int64) * itemsize
                ptr = np.empty_like(chunk)
                ptr[0] = offset
                if len(chunk) > 1:
                    np.cumsum(chunk[:-1], out=ptr[1:])
                    ptr[1:] += offset
                offset = int(ptr[-1] + chunk[-1])
                f.write(ptr.astype("<i8").tobytes())
            f.write(docs.astype("<i8").tobytes())
        del lengths
        os.replace(self._tmp + ".bin", data_file_path(self.prefix))
        os.replace(tmp_idx, index_file_path(self.prefix))
        self._cleanup()
        self._closed = True

    def abort(self) -> None:
        for fh in (self._bin, self._lengths, self._docs):
            fh.close()
        self._cleanup(include_outputs=True)
        self._closed = True

    def _cleanup(self, include_outputs: bool = False) -> None:
        for suffix in (".lengths", ".docs") + ((".bin", ".idx") if include_outputs else ()):
            try:
                os.remove(self._tmp + suffix)
            except FileNotFoundError:
                pass

    def __enter__(self) -> "IndexedDatasetBuilder":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._closed:
            if exc_type is None:
                self.finalize()
            else:
                self.abort()


class IndexedDataset:
    """Memory-mapped reader of a Megatron ``.bin``/``.idx`` pair; validates before returning tokens."""

    def __init__(self, prefix: str | os.PathLike) -> None:
        self.prefix = str(prefix)
        idx_path, bin_path = index_file_path(prefix), data_file_path(prefix)
        for p in (idx_path, bin_path):
            if not os.path.isfile(p):
                raise IndexedDatasetError(
                    f"{p}: file not found (expected a Megatron shard pair {self.prefix}.bin/.idx); check the prefix "
                    "(the path without .bin/.idx, e.g. data/wiki_text_sentence)"
                )
        idx_size = os.path.getsize(idx_path)
        if idx_size < HEADER_SIZE:
            raise IndexedDatasetError(f"{idx_path}: truncated index ({idx_size} bytes, header needs {HEADER_SIZE})")
        with open(idx_path, "rb") as f:
            header = f.read(HEADER_SIZE)
        if header[:9] != MAGIC:
            raise IndexedDatasetError(
                f"{idx_path}: wrong magic {header[:9]!r} (expected {MAGIC!r}); not a Megatron MMapIndexedDataset index"
            )
        (version,) = struct.unpack("<Q", header[9:17])
        if version != VERSION:
            raise IndexedDatasetError(f"{idx_path}: unsupported index version {version} (expected {VERSION})")
        code = header[17]
        if code not in DTYPE_CODES:
            raise IndexedDatasetError(f"{idx_path}: unknown dtype code {code}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        n, d = struct.unpack("<QQ", header[18:34])
        body = n * 4 + n * 8 + d * 8
        if idx_size == HEADER_SIZE + body:
            self.multimodal = False
        elif idx_size == HEADER_SIZE + body + n:
            self.multimodal = True
        else:
            raise IndexedDatasetError(
                f"{idx_path}: size {idx_size} does not match its header "
                f"({n} sequences, {d} document-index entries need {HEADER_SIZE + body} bytes); "
                f"the index is truncated or corrupt: copy the pair again, or preprocess its corpus again"
            )
        self._idx = np.memmap(idx_path, dtype=np.uint8, mode="r")
        off = HEADER_SIZE
        self.sequence_lengths = np.frombuffer(self._idx, dtype="<i4", count=n, offset=off)
        off += n * 4
        self.sequence_pointers = np.frombuffer(self._idx, dtype="<i8", count=n, offset=off)
        off += n * 8
        self.document_indices = np.frombuffer(self._idx, dtype="<i8", count=d, offset=off)
        off += d * 8
        self.sequence_modes = np.frombuffer(self._idx, dtype="<i1", count=n, offset=off) if self.multimodal else None

        if d < 1 or self.document_indices[0] != 0 or self.document_indices[-1] != n:
            raise IndexedDatasetError(
                f"{idx_path}: document index must start at 0 and end at {n} "
                f"(found {self.document_indices[:1].tolist()}.."
                f"{self.document_indices[-1:].tolist()})"
            )
        if d > 1 and np.any(np.diff(self.document_indices) < 0):
            raise IndexedDatasetError(f"{idx_path}: document index is not non-decreasing")
        if n and self.sequence_lengths.min() < 0:
            raise IndexedDatasetError(f"{idx_path}: negative sequence length")
        self.num_tokens = int(self.sequence_lengths.sum(dtype=np.int64))
        expected_bin = self.num_tokens * self.dtype.itemsize
        bin_size = os.path.getsize(bin_path)
        if bin_size != expected_bin:
            raise IndexedDatasetError(
                f"{bin_path}: size {bin_size} bytes does not match {idx_path} "
                f"({self.num_tokens} tokens x {self.dtype.itemsize} bytes = {expected_bin}); "
                f"the pair is truncated or mismatched: copy the pair again, or preprocess its corpus again"
            )
        if n:
            expect_ptr = np.zeros(n, dtype=np.int64)
            np.cumsum(self.sequence_lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=expect_ptr[1:])
            if not np.array_equal(expect_ptr, self.sequence_pointers):
                raise IndexedDatasetError(f"{idx_path}: byte pointers disagree with sequence lengths; index is corrupt")
        self._bin = np.memmap(bin_path, dtype=self.dtype, mode="r") if bin_size else np.zeros(0, self.dtype)

    # -- access --------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.sequence_lengths)

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1

    def _start(self, i: int) -> int:
        return int(self.sequence_pointers[i]) // self.dtype.itemsize

    def __getitem__(self, i: int) -> np.ndarray:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range for {self.prefix} ({len(self)} sequences)")
        start = self._start(i)
        return self._bin[start : start + int(self.sequence_lengths[i])]

    def get(self, i: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        """Tokens ``[offset, offset+length)`` of sequence ``i`` (Megatron's ``get``)."""
        seq = self[i]
        end = len(seq) if length is None else offset + length
        return seq[offset:end]

    def document(self, d: int) -> np.ndarray:
        """All tokens of document ``d`` (its sequences concatenated)."""
        lo, hi = int(self.document_indices[d]), int(self.document_indices[d + 1])
        if lo == hi:
            return np.zeros(0, dtype=self.dtype)
        start = self._start(lo)
        end = self._start(hi - 1) + int(self.sequence_lengths[hi - 1])
        return self._bin[start:end]

    def document_sequences(self, d: int) -> list[np.ndarray]:
        lo, hi = int(self.document_indices[d]), int(self.document_indices[d + 1])
        return [self[j] for j in range(lo, hi)]

    @property
    def tokens(self) -> np.ndarray:
        """The whole ``.bin`` as one flat memory-mapped array."""
        return self._bin

    def close(self) -> None:
        for name in ("_bin", "_idx"):
            arr = getattr(self, name, None)
            mm = getattr(arr, "_mmap", None)
            if mm is not None:
                try:
                    mm.close()
                except (BufferError, ValueError):
                    pass  # still referenced by a view handed out; the OS frees it with the last view


def merge_shards(prefixes: Sequence[str | os.PathLike], output_prefix: str | os.PathLike) -> None:
    """Concatenate shards (same dtype) into one, documents in the order given."""
    if not prefixes:
        raise ValueError("merge_shards: no input shards")
    dtype = IndexedDataset(prefixes[0]).dtype
    with IndexedDatasetBuilder(output_prefix, dtype) as builder:
        for p in prefixes:
            builder.merge_file(p)
