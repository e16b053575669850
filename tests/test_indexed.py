"""Megatron .bin/.idx format: byte-compatibility both ways, validation of corrupt shards, merging."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from data_pipeline.indexed import (
    HEADER_SIZE,
    IndexedDataset,
    IndexedDatasetBuilder,
    IndexedDatasetError,
    best_dtype,
    merge_shards,
    write_index,
)


@pytest.fixture(scope="module")
def megatron_shards(corpus: Path) -> Path:
    d = corpus / "megatron-shards"
    if not (d / "wiki60_text_sentence.idx").is_file():
        pytest.skip(f"Megatron reference shards not found in {d}")
    return d


def _rewrite(src: IndexedDataset, prefix: Path) -> None:
    with IndexedDatasetBuilder(prefix, src.dtype) as b:
        for d in range(src.num_documents):
            b.add_document(src.document_sequences(d))


@pytest.mark.parametrize("level", ["sentence", "document"])
def test_megatron_shards_read_and_rewrite_byte_identical(megatron_shards, tmp_path, level):
    src = IndexedDataset(megatron_shards / f"wiki60_text_{level}")
    assert src.dtype == np.uint16 and src.num_documents == 60 and src.num_tokens == 304_914
    if level == "sentence":
        assert len(src) == 11_026
    _rewrite(src, tmp_path / "ours")
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (megatron_shards / f"wiki60_text_{level}{ext}").read_bytes()


def test_megatron_reader_opens_our_shard(tmp_path):
    mcore = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    rng = np.random.default_rng(0)
    docs = [[rng.integers(0, 30522, rng.integers(1, 50)) for _ in range(rng.integers(1, 6))] for _ in range(20)]
    with IndexedDatasetBuilder(tmp_path / "s", np.uint16) as b:
        for d in docs:
            b.add_document(d)
    theirs = mcore.IndexedDataset(str(tmp_path / "s"))
    flat = [s for d in docs for s in d]
    assert len(theirs) == len(flat)
    assert list(theirs.document_indices) == list(np.cumsum([0] + [len(d) for d in docs]))
    for i, s in enumerate(flat):
        np.testing.assert_array_equal(theirs[i], s)


def test_streaming_append_tokens_equals_add_item(tmp_path):
    a = np.arange(1000, dtype=np.int64)
    with IndexedDatasetBuilder(tmp_path / "x", np.int32) as b:
        b.add_item(a)
        b.end_document()
    with IndexedDatasetBuilder(tmp_path / "y", np.int32) as b:
        for part in np.array_split(a, 7):
            b.append_tokens(part)
        b.end_item()
        b.end_document()
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"x{ext}").read_bytes() == (tmp_path / f"y{ext}").read_bytes()


def test_best_dtype_follows_megatron():
    assert best_dtype(30522) == np.uint16 and best_dtype(65499) == np.uint16
    assert best_dtype(65500) == np.int32 and best_dtype(250_000) == np.int32


def test_token_id_out_of_range_is_refused(tmp_path):
    b = IndexedDatasetBuilder(tmp_path / "z", np.uint16)
    with pytest.raises(ValueError, match="out of range"):
        b.add_item([70000])
    b.abort()
    assert not list(tmp_path.iterdir())  # abort leaves nothing behind


def _shard(tmp_path: Path, name: str = "c") -> Path:
    p = tmp_path / name
    with IndexedDatasetBuilder(p, np.uint16) as b:
        b.add_document([[1, 2, 3], [4, 5]])
        b.add_document([[6]])
    return p


@pytest.mark.parametrize(
    "damage,message",
    [
        ("magic", "wrong magic"),
        ("version", "unsupported index version"),
        ("dtype", "unknown dtype code"),
        ("truncate_idx", "does not match its header"),
        ("truncate_bin", "does not match"),
        ("extend_bin", "does not match"),
        ("pointers", "byte pointers disagree"),
        ("doc_index", "document index"),
        ("missing_bin", "file not found"),
    ],
)
def test_corrupt_shards_give_clear_errors(tmp_path, damage, message):
    p = _shard(tmp_path)
    idx, bin_ = Path(str(p) + ".idx"), Path(str(p) + ".bin")
    raw = bytearray(idx.read_bytes())
    if damage == "magic":
        raw[:4] = b"XXXX"
    elif damage == "version":
        raw[9:17] = struct.pack("<Q", 2)
    elif damage == "dtype":
        raw[17] = 42
    elif damage == "truncate_idx":
        raw = raw[:-3]
    elif damage == "pointers":
        n = struct.unpack("<Q", raw[18:26])[0]
        off = HEADER_SIZE + 4 * n + 8
        raw[off : off + 8] = struct.pack("<q", 999)
    elif damage == "doc_index":
        raw[-8:] = struct.pack("<q", 77)
    idx.write_bytes(bytes(raw))
    if damage == "truncate_bin":
        bin_.write_bytes(bin_.read_bytes()[:-2])
    elif damage == "extend_bin":
        bin_.write_bytes(bin_.read_bytes() + b"\0\0")
    elif damage == "missing_bin":
        bin_.unlink()
    with pytest.raises(IndexedDatasetError, match=message) as e:
        IndexedDataset(p)
    assert str(p) in str(e.value)  # the message names the file


def test_merge_shards_concatenates_in_order(tmp_path):
    a = _shard(tmp_path, "a")
    with IndexedDatasetBuilder(tmp_path / "b", np.uint16) as b:
        b.add_document([[9, 9], [8]])
    merge_shards([a, tmp_path / "b", a], tmp_path / "m")
    m = IndexedDataset(tmp_path / "m")
    assert m.num_documents == 5
    assert [m.document(d).tolist() for d in range(5)] == [[1, 2, 3, 4, 5], [6], [9, 9, 8], [1, 2, 3, 4, 5], [6]]
    # the same as writing it in one go
    write_index(tmp_path / "ref.idx", np.uint16, [3, 2, 1, 2, 1, 3, 2, 1], [0, 2, 3, 5, 7, 8])
    assert (tmp_path / "ref.idx").read_bytes() == (tmp_path / "m.idx").read_bytes()


def test_merge_refuses_mixed_dtypes(tmp_path):
    a = _shard(tmp_path, "a")
    with IndexedDatasetBuilder(tmp_path / "w", np.int32) as b:
        b.add_document([[1]])
    with pytest.raises(IndexedDatasetError, match="dtype"):
        merge_shards([a, tmp_path / "w"], tmp_path / "m")


def test_merge_shards_tool(tmp_path):
    from tools.merge_shards import main

    a = _shard(tmp_path, "a")
    shutil.copy(str(a) + ".bin", tmp_path / "a2.bin")
    shutil.copy(str(a) + ".idx", tmp_path / "a2.idx")
    assert main(["--inputs", str(tmp_path / "a*.idx"), "--output-prefix", str(tmp_path / "out")]) == 0
    assert IndexedDataset(tmp_path / "out").num_documents == 4
    assert main(["--inputs", str(tmp_path / "nothing*.idx"), "--output-prefix", str(tmp_path / "o2")]) == 2
