"""Pretraining datasets: the samples of one split of one shard (:class:`ShardSplit`), the blended and shuffled
dataset of a split (:class:`PretrainingDataset`), and :func:`build_datasets`, which checks every shard before it
builds any index.

Pretraining datasets and the data-parallel loader: shards -> blended, split, shuffled samples -> batches.

Data position is a single integer: the *stream position*. Position ``p`` maps, with no state, to a
dataset of the blend (``blending.BlendSchedule``), to that dataset's ``j``-th sample over all its epochs,
and through the epoch's permutation (seeded by ``seed`` and the epoch) to a row of the sample index.
The MLM mask of the sample at ``p`` is keyed by ``p`` too. So:

- global order depends only on ``seed`` and ``consumed_samples``; step ``t`` after resuming serves
  positions ``consumed + t * global_batch + rank * micro_batch + [0, micro_batch)``: ranks are disjoint;
- resuming at ``consumed_samples`` reproduces the uninterrupted batches tensor for tensor, whatever
  ``num_workers``;
- an epoch of a dataset that comes round again is reshuffled and remasked (its positions are new).
"""

from __future__ import annotations

import sys
from typing import Sequence

import numpy as np
import torch

from data_pipeline import resume
from data_pipeline.blending import BlendSchedule
from data_pipeline.data_config import SPLIT_NAMES, DataConfig, DataConfigError, split_document_ranges
from data_pipeline.indexed import IndexedDataset, index_file_path
from data_pipeline.samples import (
    A_END,
    A_START,
    B_END,
    B_START,
    NSP_LABEL,
    PACKED,
    SampleIndexError,
    load_or_build_index,
    packed_sample_rows,
    shard_max_token_id,
)


# ---------------------------------------------------------------------------------------------------------
# one shard, one split
# ---------------------------------------------------------------------------------------------------------
class ShardSplit:
    """The samples of one split (a document range) of one shard. Opens the shard lazily in each process."""

    def __init__(
        self, prefix: str, doc_range: tuple[int, int], index: np.ndarray, mode: str, cls_id: int, sep_id: int
    ) -> None:
        self.prefix = prefix
        self.doc_range = doc_range
        self.index = index
        self.mode = mode
        self.cls_id, self.sep_id = int(cls_id), int(sep_id)
        self._ds: IndexedDataset | None = None
        self._flat: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._doc_bounds: np.ndarray | None = None
        self._pack_rows: np.ndarray | None = None

    @property
    def pack_rows(self) -> np.ndarray:
        """packed-docs: ``[S + 1]`` offsets of each sample's piece rows in the index."""
        if self._pack_rows is None:
            self._pack_rows = packed_sample_rows(np.asarray(self.index))
        return self._pack_rows

    def __len__(self) -> int:
        return len(self.pack_rows) - 1 if self.mode == PACKED else len(self.index)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_ds"] = None  # memmaps are reopened in the worker, never pickled
        state["_flat"] = state["_rows"] = state["_doc_bounds"] = state["_pack_rows"] = None
        if isinstance(self.index, np.memmap) or getattr(self.index, "filename", None):
            state["index"] = None
            state["_index_path"] = self.index.filename
        return state

    def __setstate__(self, state: dict) -> None:
        path = state.pop("_index_path", None)
        self.__dict__.update(state)
        if self.index is None:
            self.index = np.load(path, mmap_mode="r")

    @property
    def shard(self) -> IndexedDataset:
        if self._ds is None:
            self._ds = IndexedDataset(self.prefix)
        return self._ds

    @property
    def doc_bounds(self) -> np.ndarray:
        """Token offsets where documents of the split start (full-sentences inserts [SEP] there)."""
        if self._doc_bounds is None:
            ds = self.shard
            seq = np.asarray(ds.document_indices[self.doc_range[0] : self.doc_range[1] + 1], dtype=np.int64)
            n = len(ds)
            ptr = np.where(
                seq < n,
                np.asarray(ds.sequence_pointers)[np.minimum(seq, max(n - 1, 0))] // ds.dtype.itemsize,
                ds.num_tokens,
            )
            self._doc_bounds = np.unique(ptr)
        return self._doc_bounds

    def sample_lengths(self) -> np.ndarray:
        """Real tokens of every sample (specials included), vectorized over the whole index."""
        idx = np.asarray(self.index)
        n = idx[:, A_END] - idx[:, A_START] + 2
        if self.mode == PACKED:  # the pieces of a sample, each with its [CLS] and [SEP]
            return np.add.reduceat(n, self.pack_rows[:-1]) if len(n) else n
        if self.mode == "nsp":
            n += idx[:, B_END] - idx[:, B_START] + 1
        elif self.mode == "full-sentences":
            b = self.doc_bounds
            n += np.searchsorted(b, idx[:, A_END], "left") - np.searchsorted(b, idx[:, A_START], "right")
        return n

    def sample_text_starts(self) -> np.ndarray:
        """Token offset where the text of every sample begins (packed-docs: its first piece)."""
        idx = np.asarray(self.index)
        return idx[self.pack_rows[:-1], A_START] if self.mode == PACKED else idx[:, A_START]

    def doc_lengths(self, s: int) -> np.ndarray | None:
        """packed-docs: tokens of each document piece of sample ``s``, specials included (None in other modes)."""
        if self.mode != PACKED:
            return None
        rows = np.asarray(self.index[self.pack_rows[s] : self.pack_rows[s + 1]])
        return rows[:, A_END] - rows[:, A_START] + 2

    def tokens(self, s: int) -> tuple[np.ndarray, int, int]:
        """Token ids of sample ``s`` with its specials, the length of its first segment, its nsp label."""
        if self._flat is None:  # plain ndarray views: np.memmap's per-slice overhead is 3x the work here
            self._flat = np.asarray(self.shard.tokens)
            self._rows = np.asarray(self.index)
        flat = self._flat
        if self.mode == PACKED:  # [CLS] piece [SEP] per document piece
            rows = self._rows[self.pack_rows[s] : self.pack_rows[s + 1]]
            parts = []
            for r in rows:
                parts += [[self.cls_id], flat[r[A_START] : r[A_END]], [self.sep_id]]
            ids = np.concatenate(parts).astype(np.int64)
            return ids, len(ids), -1
        row = self._rows[s]
        a = np.asarray(flat[row[A_START] : row[A_END]], dtype=np.int64)
        if self.mode == "full-sentences":
            b = self.doc_bounds
            lo, hi = np.searchsorted(b, row[A_START], "right"), np.searchsorted(b, row[A_END], "left")
            if hi > lo:
                a = np.insert(a, b[lo:hi] - row[A_START], self.sep_id)
        if self.mode == "nsp":
            bseg = np.asarray(flat[row[B_START] : row[B_END]], dtype=np.int64)
            ids = np.concatenate(([self.cls_id], a, [self.sep_id], bseg, [self.sep_id]))
            return ids, len(a) + 2, int(row[NSP_LABEL])
        ids = np.concatenate(([self.cls_id], a, [self.sep_id]))
        return ids, len(ids), -1


# ---------------------------------------------------------------------------------------------------------
# the blended, shuffled dataset of one split
# ---------------------------------------------------------------------------------------------------------
class PretrainingDataset(torch.utils.data.Dataset):
    """Unmasked samples of one split, blended by weight and shuffled per epoch of each component.

    Index = stream position. ``len`` is the nominal size (``num_samples`` or the components' total), but
    any position >= 0 is valid: components simply continue into their next, reshuffled epochs.
    Items are ``(token ids, first-segment length, nsp label, position, document lengths)`` (the last is None outside
    packed-docs); ``Collator`` pads and masks.
    """

    def __init__(
        self,
        components: list[ShardSplit],
        weights: list[float],
        seed: int,
        num_samples: int | None = None,
        name: str = "train",
    ) -> None:
        self.components = components
        self.schedule = BlendSchedule(weights)
        self.seed = int(seed)
        self.name = name
        self.sizes = np.array([len(c) for c in components], dtype=np.int64)
        self.num_samples = int(num_samples) if num_samples is not None else int(self.sizes.sum())
        self._perms: dict[tuple[int, int], np.ndarray] = {}

    def __len__(self) -> int:
        return self.num_samples

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_perms"] = {}
        return state

    def _perm(self, d: int, epoch: int) -> np.ndarray:
        key = (d, epoch)
        p = self._perms.get(key)
        if p is None:
            if len(self._perms) >= 2 * len(self.components):
                self._perms.clear()
            rng = np.random.default_rng([self.seed, d, epoch, 0x5A4D])
            p = self._perms[key] = rng.permutation(int(self.sizes[d]))
        return p

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(component, row of its sample index) of each stream position."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and positions.min() < 0:
            raise IndexError(f"negative stream position in {self.name} dataset")
        d, j = self.schedule.locate(positions)
        rows = np.empty_like(j)
        for k in np.unique(d):
            sel = d == k
            size = int(self.sizes[k])
            ep, r = np.divmod(j[sel], size)
            out = np.empty(int(sel.sum()), dtype=np.int64)
            for e in np.unique(ep):
                m = ep == e
                out[m] = self._perm(int(k), int(e))[r[m]]
            rows[sel] = out
        return d, rows

    def __getitems__(self, positions: Sequence[int]) -> list[tuple]:
        positions = np.asarray(positions, dtype=np.int64)
        d, rows = self.locate(positions)
        return [
            (*self.components[k].tokens(int(r)), int(p), self.components[k].doc_lengths(int(r)))
            for k, r, p in zip(d, rows, positions)
        ]

    def __getitem__(self, position: int) -> tuple:
        return self.__getitems__([int(position)])[0]


# ---------------------------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------------------------
def _check_shard_fits_vocab(ds: IndexedDataset, vocab_size: int, cache_dir: str | None = None) -> None:
    idx = index_file_path(ds.prefix)
    if not np.issubdtype(ds.dtype, np.integer):
        raise DataConfigError(f"{idx}: token dtype {ds.dtype} is not an integer type; not a token shard")
    top = int(np.iinfo(ds.dtype).max)
    if top < vocab_size - 1:
        raise DataConfigError(
            f"{idx}: dtype {ds.dtype} holds ids up to {top} but the tokenizer has {vocab_size} "
            f"entries; this shard was made with another tokenizer (re-run preprocess with "
            f"this tokenizer, which picks {np.dtype(np.uint16) if vocab_size < 65500 else 'int32'})"
        )
    if ds.num_tokens == 0:
        raise DataConfigError(
            f"{idx}: the shard holds no tokens ({ds.num_documents} documents); preprocess its corpus again and read "
            "the bad-input report, or leave it out of --data-path"
        )
    m = shard_max_token_id(ds, cache_dir)
    if m >= vocab_size or int(np.asarray(ds.tokens[: 1 << 16]).min()) < 0:
        raise DataConfigError(
            f"{idx}: token id {m} >= tokenizer vocab_size {vocab_size}; the shard was "
            f"tokenized with a different vocabulary"
        )


def check_shard_vocab(prefix: str, tokenizer) -> None:
    """Refuse a shard whose preprocessing report records another vocabulary than ``tokenizer``'s (the ids would
    mean other words, and nothing else notices: a retrained vocab of the same size passes every id check).
    Shards without a report (Megatron's, merged ones) are not checked."""
    found = resume.find_report(prefix)
    rec = (found[1].get("tokenizer") if found else None) or {}
    if not rec.get("fingerprint"):
        return
    have = tokenizer.fingerprint()
    if rec["fingerprint"] != have:
        made = rec.get("vocab_file") or rec.get("tokenizer_model") or "another vocabulary"
        raise DataConfigError(
            f"{prefix}: these shards were made with {made} (vocabulary fingerprint {rec['fingerprint']}, "
            f"{rec.get('vocab_size')} entries; report {found[0]}), not with this tokenizer ({tokenizer.vocab_size} "
            f"entries, fingerprint {have}); give that --vocab-file/--tokenizer-model, or re-run preprocess with "
            "this one"
        )


def _non_empty_documents(ds: IndexedDataset, lo: int, hi: int) -> int:
    seq = np.asarray(ds.document_indices[lo : hi + 1], dtype=np.int64)
    cum = np.r_[0, np.cumsum(np.asarray(ds.sequence_lengths[seq[0] : seq[-1]], dtype=np.int64))]
    return int((np.diff(cum[seq - seq[0]]) > 0).sum())


def build_datasets(
    config: DataConfig, tokenizer, num_samples: tuple[int, int, int] | None = None, verbose: bool = False
) -> tuple[PretrainingDataset | None, ...]:
    """Train/valid/test datasets (None where a split is empty), blended per the data_path weights.

    Every check (shard files, dtype vs vocabulary, token ids, empty splits) runs before any index is built.
    ``num_samples`` sets each split's nominal length (e.g. train_iters * global_batch); None = one pass.
    """
    if num_samples is not None and len(num_samples) != 3:
        raise DataConfigError(f"num_samples={num_samples}: expected (train, valid, test)")
    shards = []
    for weight, prefix in config.blend:
        ds = IndexedDataset(prefix)
        check_shard_vocab(prefix, tokenizer)
        _check_shard_fits_vocab(ds, tokenizer.vocab_size, config.cache_dir)
        ranges = split_document_ranges(ds.num_documents, config.split)
        shards.append((weight, ds, ranges))
    for weight, ds, ranges in shards:
        lo, hi = ranges[0]
        if hi <= lo and weight != 0:
            raise DataConfigError(
                f"{index_file_path(ds.prefix)}: the train split '{config.split}' of its "
                f"{ds.num_documents} documents is empty; give it more documents or change split"
            )
        if config.sample_mode == "nsp":
            for k, (lo, hi) in enumerate(ranges):
                if hi > lo and _non_empty_documents(ds, lo, hi) < 2:
                    raise DataConfigError(
                        f"{index_file_path(ds.prefix)}: nsp mode needs at least 2 non-empty "
                        f"documents in the {SPLIT_NAMES[k]} split (documents {lo}..{hi - 1}); "
                        f"use doc-sentences or change split"
                    )
    out: list[PretrainingDataset | None] = []
    for k, name in enumerate(SPLIT_NAMES):
        comps, weights = [], []
        for weight, ds, ranges in shards:
            lo, hi = ranges[k]
            if hi <= lo or weight == 0:
                continue
            try:
                index = load_or_build_index(ds, (lo, hi), config.index_config, config.cache_dir, verbose)
            except SampleIndexError as e:
                raise DataConfigError(f"{name} split: {e}") from None
            if len(index) == 0:
                if name == "train":
                    raise DataConfigError(
                        f"{index_file_path(ds.prefix)}: documents {lo}..{hi - 1} (train split) "
                        f"yield no samples (all sentences empty?)"
                    )
                if verbose:
                    print(
                        f"[loader] {name}: {ds.prefix} documents {lo}..{hi - 1} yield no samples; skipped",
                        file=sys.stderr,
                    )
                continue
            comps.append(ShardSplit(ds.prefix, (lo, hi), index, config.sample_mode, tokenizer.cls_id, tokenizer.sep_id))
            weights.append(float(len(index)) if weight is None else weight)
        if not comps:
            out.append(None)
            continue
        n = None if num_samples is None else num_samples[k]
        out.append(PretrainingDataset(comps, weights, config.seed, n, name))
    return tuple(out)
