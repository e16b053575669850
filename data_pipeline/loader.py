"""Pretraining datasets and the data-parallel loader: shards -> blended, split, shuffled samples -> batches.

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

import dataclasses
import sys
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np
import torch

from data_pipeline.blending import BlendSchedule
from data_pipeline.indexed import IndexedDataset, index_file_path
from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, MLMMasker, sample_keys
from data_pipeline.samples import (A_END, A_START, B_END, B_START, MODES, NSP_LABEL, SampleIndexConfig,
                                   SampleIndexError, load_or_build_index, shard_max_token_id)

SPLIT_NAMES = ("train", "valid", "test")


class DataConfigError(ValueError):
    """A data setting is invalid; the message names the setting."""


def parse_data_path(data_path: Sequence[str] | str) -> list[tuple[float | None, str]]:
    """Megatron's ``--data-path``: ``w1 prefix1 w2 prefix2 ...`` -> [(weight, prefix)], or prefixes alone
    -> [(None, prefix)]: unweighted, each split then draws from every shard in proportion to its samples
    (one pass = the concatenation), as Megatron does for a blend without weights."""
    items = data_path.split() if isinstance(data_path, str) else [str(x) for x in data_path]
    if not items:
        raise DataConfigError("data_path is empty: give a shard prefix or 'weight prefix' pairs")

    def num(s: str) -> float | None:
        try:
            return float(s)
        except ValueError:
            return None

    numeric = [num(x) is not None for x in items]
    if not any(numeric):
        return [(None, p) for p in items]
    if len(items) % 2 or not all(numeric[0::2]) or any(numeric[1::2]):
        raise DataConfigError(f"data_path {items}: weights do not match paths; expected "
                              f"'weight1 prefix1 weight2 prefix2 ...' (e.g. 0.25 books 0.75 wiki), or prefixes "
                              f"without any weight")
    pairs = [(float(w), p) for w, p in zip(items[0::2], items[1::2])]
    if any(not np.isfinite(w) or w < 0 for w, _ in pairs) or sum(w for w, _ in pairs) <= 0:
        raise DataConfigError(f"data_path weights {[w for w, _ in pairs]}: must be non-negative and not all zero")
    return pairs


def parse_split(split: str) -> list[float]:
    """``"949,50,1"`` (or with ``/``) -> normalized train/valid/test proportions."""
    parts = [s for s in split.replace("/", ",").split(",") if s.strip()]
    try:
        vals = [float(s) for s in parts]
    except ValueError:
        raise DataConfigError(f"split {split!r}: expected up to three numbers like '949,50,1'") from None
    if not 1 <= len(vals) <= 3 or any(v < 0 for v in vals) or sum(vals) <= 0:
        raise DataConfigError(f"split {split!r}: expected up to three non-negative numbers, not all zero")
    vals += [0.0] * (3 - len(vals))
    total = sum(vals)
    return [v / total for v in vals]


def split_document_ranges(num_documents: int, split: str) -> list[tuple[int, int]]:
    """Contiguous document ranges per split, rounded like Megatron's ``get_split_indices``."""
    props = parse_split(split)
    idx = [0]
    for p in props:
        idx.append(idx[-1] + int(round(p * float(num_documents))))
    diff = idx[-1] - num_documents
    idx = [idx[0]] + [i - diff for i in idx[1:]]
    return [(idx[k], idx[k + 1]) for k in range(3)]


@dataclass
class DataConfig:
    """What the pretraining batches are made of. Tokenizer is passed separately."""

    data_path: list[str]
    """Megatron style: ["prefix"], ["0.25", "books_prefix", "0.75", "wiki_prefix"] (weight, prefix pairs), or
    several prefixes without weights (each drawn in proportion to its sample count)."""
    split: str = "949,50,1"
    """Train/valid/test proportions of each shard's documents (contiguous ranges, as Megatron)."""
    seq_length: int = 512
    """Maximum tokens per sample N, special tokens included (at least 8)."""
    mode: str = "doc-sentences"
    """doc-sentences (RoBERTa-1seq), full-sentences (crosses documents), or nsp (segment pair + label)."""
    seed: int = 1234
    """Seeds sample packing, epoch shuffles and masks: the global order depends only on it and the position."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random budget per sample, as BERT's --short_seq_prob."""
    cut_fraction: float = 0.1
    """doc/full-sentences: cut the sentence that does not fit when more than this fraction of N would stay
    empty (its tail opens the next sample; nothing is dropped). 1.0 = whole sentences only."""
    mlm_probability: float = 0.15
    """Share of non-special tokens chosen for prediction (80% [MASK], 10% random, 10% kept)."""
    whole_word_masking: bool = False
    """Choose whole words (WordPiece ## / SentencePiece ▁ aware) instead of single tokens."""
    max_predictions_per_seq: int | None = None
    """Cap on predicted tokens per sample (BERT's max_predictions_per_seq); None = no cap."""
    pad_to_multiple_of: int | None = None
    """Pad batch length up to a multiple of this (e.g. the sparse-attention block size)."""
    dynamic_padding: bool = False
    """Pad to the longest sample of the batch (rounded up to pad_to_multiple_of) instead of seq_length."""
    cache_dir: str | None = None
    """Where to cache sample indices; None = a cache/ sub-directory beside each shard."""

    def __post_init__(self) -> None:
        if isinstance(self.data_path, str):
            self.data_path = self.data_path.split()
        self.blend = parse_data_path(self.data_path)
        parse_split(self.split)
        if not isinstance(self.seq_length, int) or self.seq_length < 8:
            raise DataConfigError(f"seq_length={self.seq_length}: must be an integer >= 8")
        if self.mode not in MODES:
            raise DataConfigError(f"mode {self.mode!r}: choose one of {', '.join(MODES)}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise DataConfigError(f"short_seq_prob={self.short_seq_prob}: must be within [0, 1]")
        if not 0.0 <= self.cut_fraction <= 1.0:
            raise DataConfigError(f"cut_fraction={self.cut_fraction}: must be within [0, 1]")
        if not 0.0 < self.mlm_probability < 1.0:
            raise DataConfigError(f"mlm_probability={self.mlm_probability}: must be within (0, 1)")
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise DataConfigError(f"max_predictions_per_seq={self.max_predictions_per_seq}: must be >= 1 or None")
        if self.pad_to_multiple_of is not None and (not isinstance(self.pad_to_multiple_of, int)
                                                    or self.pad_to_multiple_of < 1):
            raise DataConfigError(f"pad_to_multiple_of={self.pad_to_multiple_of}: must be a positive integer or None")

    @classmethod
    def from_dict(cls, d: dict) -> "DataConfig":
        """Build from a JSON object; unknown keys are an error (typos must not pass silently)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise DataConfigError(f"unknown data config keys {unknown}; known: {sorted(names)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def index_config(self) -> SampleIndexConfig:
        return SampleIndexConfig(seq_length=self.seq_length, mode=self.mode, seed=self.seed,
                                 short_seq_prob=self.short_seq_prob, cut_fraction=self.cut_fraction)

    @property
    def masking_config(self) -> MaskingConfig:
        return MaskingConfig(mlm_probability=self.mlm_probability, whole_word_masking=self.whole_word_masking,
                             max_predictions=self.max_predictions_per_seq)


# ---------------------------------------------------------------------------------------------------------
# one shard, one split
# ---------------------------------------------------------------------------------------------------------
class ShardSplit:
    """The samples of one split (a document range) of one shard. Opens the shard lazily in each process."""

    def __init__(self, prefix: str, doc_range: tuple[int, int], index: np.ndarray, mode: str,
                 cls_id: int, sep_id: int) -> None:
        self.prefix = prefix
        self.doc_range = doc_range
        self.index = index
        self.mode = mode
        self.cls_id, self.sep_id = int(cls_id), int(sep_id)
        self._ds: IndexedDataset | None = None
        self._flat: np.ndarray | None = None
        self._rows: np.ndarray | None = None
        self._doc_bounds: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_ds"] = None  # memmaps are reopened in the worker, never pickled
        state["_flat"] = state["_rows"] = state["_doc_bounds"] = None
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
            seq = np.asarray(ds.document_indices[self.doc_range[0]:self.doc_range[1] + 1], dtype=np.int64)
            n = len(ds)
            ptr = np.where(seq < n, np.asarray(ds.sequence_pointers)[np.minimum(seq, max(n - 1, 0))]
                           // ds.dtype.itemsize, ds.num_tokens)
            self._doc_bounds = np.unique(ptr)
        return self._doc_bounds

    def sample_lengths(self) -> np.ndarray:
        """Real tokens of every sample (specials included), vectorized over the whole index."""
        idx = np.asarray(self.index)
        n = idx[:, A_END] - idx[:, A_START] + 2
        if self.mode == "nsp":
            n += idx[:, B_END] - idx[:, B_START] + 1
        elif self.mode == "full-sentences":
            b = self.doc_bounds
            n += np.searchsorted(b, idx[:, A_END], "left") - np.searchsorted(b, idx[:, A_START], "right")
        return n

    def tokens(self, s: int) -> tuple[np.ndarray, int, int]:
        """Token ids of sample ``s`` with its specials, the length of its first segment, its nsp label."""
        if self._flat is None:  # plain ndarray views: np.memmap's per-slice overhead is 3x the work here
            self._flat = np.asarray(self.shard.tokens)
            self._rows = np.asarray(self.index)
        row = self._rows[s]
        flat = self._flat
        a = np.asarray(flat[row[A_START]:row[A_END]], dtype=np.int64)
        if self.mode == "full-sentences":
            b = self.doc_bounds
            lo, hi = np.searchsorted(b, row[A_START], "right"), np.searchsorted(b, row[A_END], "left")
            if hi > lo:
                a = np.insert(a, b[lo:hi] - row[A_START], self.sep_id)
        if self.mode == "nsp":
            bseg = np.asarray(flat[row[B_START]:row[B_END]], dtype=np.int64)
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
    Items are ``(token ids, first-segment length, nsp label, position)``; ``Collator`` pads and masks.
    """

    def __init__(self, components: list[ShardSplit], weights: list[float], seed: int,
                 num_samples: int | None = None, name: str = "train") -> None:
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

    def __getitems__(self, positions: Sequence[int]) -> list[tuple[np.ndarray, int, int, int]]:
        positions = np.asarray(positions, dtype=np.int64)
        d, rows = self.locate(positions)
        return [(*self.components[k].tokens(int(r)), int(p)) for k, r, p in zip(d, rows, positions)]

    def __getitem__(self, position: int) -> tuple[np.ndarray, int, int, int]:
        return self.__getitems__([int(position)])[0]


# ---------------------------------------------------------------------------------------------------------
# collation + masking
# ---------------------------------------------------------------------------------------------------------
class Collator:
    """Pads, masks (vectorized over the batch) and returns torch tensors. Picklable into workers."""

    def __init__(self, tokenizer, config: DataConfig, mask_salt: int = 0) -> None:
        self.masker = MLMMasker.from_tokenizer(tokenizer, config.masking_config)
        self.pad_id = int(tokenizer.pad_id)
        self.seq_length = config.seq_length
        self.multiple = config.pad_to_multiple_of
        self.dynamic = config.dynamic_padding
        self.nsp = config.mode == "nsp"
        self.seed = config.seed
        self.salt = int(mask_salt)

    def padded_length(self, longest: int) -> int:
        n = longest if self.dynamic else self.seq_length
        if self.multiple:
            n = -(-n // self.multiple) * self.multiple
        return n

    def compact(self, items: list[tuple[np.ndarray, int, int, int]]) -> np.ndarray:
        """Pad + mask into one flat int32 array ``[ids (B*L) | labels (B*L) | lengths, first, nsp (3*B) | B, L]``.

        This is what dataloader workers send: one int32 numpy array, pickled through the worker pipe,
        instead of five int64 tensors, each moved to its own shared-memory segment (the transfer, not the
        masking, limited the loader: 3.3k -> 9k samples/s); ``expand`` rebuilds the batch."""
        B = len(items)
        lens = np.fromiter((len(it[0]) for it in items), dtype=np.int64, count=B)
        L = self.padded_length(int(lens.max()) if B else 0)
        ids_BL = np.full((B, L), self.pad_id, dtype=np.int64)
        for b, it in enumerate(items):
            ids_BL[b, :lens[b]] = it[0]
        positions = np.fromiter((it[3] for it in items), dtype=np.int64, count=B)
        masked_BL, labels_BL = self.masker(ids_BL, sample_keys(self.seed, positions, self.salt))
        out = np.empty(2 * B * L + 3 * B + 2, dtype=np.int32)
        out[:B * L] = masked_BL.ravel()
        out[B * L:2 * B * L] = labels_BL.ravel()
        meta = out[2 * B * L:2 * B * L + 3 * B].reshape(3, B)
        meta[0] = lens
        meta[1] = np.fromiter((it[1] for it in items), dtype=np.int64, count=B)
        meta[2] = np.fromiter((it[2] for it in items), dtype=np.int64, count=B)
        out[-2:] = (B, L)
        return out

    def expand(self, compact: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch dict from ``compact``'s array (cheap: a few broadcasts, run in the consuming process)."""
        flat = torch.from_numpy(compact)
        B, L = int(flat[-2]), int(flat[-1])
        ids = flat[:B * L].view(B, L).long()
        labels = flat[B * L:2 * B * L].view(B, L).long()
        meta = flat[2 * B * L:2 * B * L + 3 * B].view(3, B).long()
        pos_L = torch.arange(L)
        attention = pos_L[None, :] < meta[0][:, None]
        out = {"input_ids": ids, "attention_mask": attention.long()}
        if self.nsp:
            out["token_type_ids"] = ((pos_L[None, :] >= meta[1][:, None]) & attention).long()
            out["next_sentence_label"] = meta[2].clone()
        else:
            out["token_type_ids"] = torch.zeros((B, L), dtype=torch.int64)
        out["labels"] = labels
        return out

    def __call__(self, items: list[tuple[np.ndarray, int, int, int]]) -> dict[str, torch.Tensor]:
        return self.expand(self.compact(items))


# ---------------------------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------------------------
def _check_shard_fits_vocab(ds: IndexedDataset, vocab_size: int, cache_dir: str | None = None) -> None:
    idx = index_file_path(ds.prefix)
    if not np.issubdtype(ds.dtype, np.integer):
        raise DataConfigError(f"{idx}: token dtype {ds.dtype} is not an integer type; not a token shard")
    top = int(np.iinfo(ds.dtype).max)
    if top < vocab_size - 1:
        raise DataConfigError(f"{idx}: dtype {ds.dtype} holds ids up to {top} but the tokenizer has {vocab_size} "
                              f"entries; this shard was made with another tokenizer (re-run preprocess with "
                              f"this tokenizer, which picks {np.dtype(np.uint16) if vocab_size < 65500 else 'int32'})")
    if ds.num_tokens == 0:
        raise DataConfigError(f"{idx}: the shard holds no tokens (empty dataset)")
    m = shard_max_token_id(ds, cache_dir)
    if m >= vocab_size or int(np.asarray(ds.tokens[:1 << 16]).min()) < 0:
        raise DataConfigError(f"{idx}: token id {m} >= tokenizer vocab_size {vocab_size}; the shard was "
                              f"tokenized with a different vocabulary")


def _non_empty_documents(ds: IndexedDataset, lo: int, hi: int) -> int:
    seq = np.asarray(ds.document_indices[lo:hi + 1], dtype=np.int64)
    cum = np.r_[0, np.cumsum(np.asarray(ds.sequence_lengths[seq[0]:seq[-1]], dtype=np.int64))]
    return int((np.diff(cum[seq - seq[0]]) > 0).sum())


def build_datasets(config: DataConfig, tokenizer, num_samples: tuple[int, int, int] | None = None,
                   verbose: bool = False) -> tuple[PretrainingDataset | None, ...]:
    """Train/valid/test datasets (None where a split is empty), blended per the data_path weights.

    Every check (shard files, dtype vs vocabulary, token ids, empty splits) runs before any index is built.
    ``num_samples`` sets each split's nominal length (e.g. train_iters * global_batch); None = one pass.
    """
    if num_samples is not None and len(num_samples) != 3:
        raise DataConfigError(f"num_samples={num_samples}: expected (train, valid, test)")
    shards = []
    for weight, prefix in config.blend:
        ds = IndexedDataset(prefix)
        _check_shard_fits_vocab(ds, tokenizer.vocab_size, config.cache_dir)
        ranges = split_document_ranges(ds.num_documents, config.split)
        shards.append((weight, ds, ranges))
    for weight, ds, ranges in shards:
        lo, hi = ranges[0]
        if hi <= lo and weight != 0:
            raise DataConfigError(f"{index_file_path(ds.prefix)}: the train split '{config.split}' of its "
                                  f"{ds.num_documents} documents is empty; give it more documents or change split")
        if config.mode == "nsp":
            for k, (lo, hi) in enumerate(ranges):
                if hi > lo and _non_empty_documents(ds, lo, hi) < 2:
                    raise DataConfigError(f"{index_file_path(ds.prefix)}: nsp mode needs at least 2 non-empty "
                                          f"documents in the {SPLIT_NAMES[k]} split (documents {lo}..{hi - 1}); "
                                          f"use doc-sentences or change split")
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
                    raise DataConfigError(f"{index_file_path(ds.prefix)}: documents {lo}..{hi - 1} (train split) "
                                          f"yield no samples (all sentences empty?)")
                if verbose:
                    print(f"[loader] {name}: {ds.prefix} documents {lo}..{hi - 1} yield no samples; skipped",
                          file=sys.stderr)
                continue
            comps.append(ShardSplit(ds.prefix, (lo, hi), index, config.mode, tokenizer.cls_id, tokenizer.sep_id))
            weights.append(float(len(index)) if weight is None else weight)
        if not comps:
            out.append(None)
            continue
        n = None if num_samples is None else num_samples[k]
        out.append(PretrainingDataset(comps, weights, config.seed, n, name))
    return tuple(out)


class DistributedBatchSampler:
    """Positions of this rank's micro-batches: step t serves global batch
    ``[consumed + t*G, consumed + (t+1)*G)`` with G = micro_batch * world; rank r takes slice r of it."""

    def __init__(self, total: int | None, consumed_samples: int, micro_batch_size: int, dp_rank: int,
                 dp_world_size: int) -> None:
        if micro_batch_size < 1 or dp_world_size < 1 or not 0 <= dp_rank < dp_world_size:
            raise DataConfigError(f"micro_batch_size={micro_batch_size}, dp_rank={dp_rank}, "
                                  f"dp_world_size={dp_world_size}: need mbs >= 1 and 0 <= rank < world")
        if consumed_samples < 0:
            raise DataConfigError(f"consumed_samples={consumed_samples}: must be >= 0")
        self.total, self.consumed = total, int(consumed_samples)
        self.mbs, self.rank, self.world = int(micro_batch_size), int(dp_rank), int(dp_world_size)

    @property
    def global_batch(self) -> int:
        return self.mbs * self.world

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("an endless sampler has no length")
        return max(0, (self.total - self.consumed) // self.global_batch)

    def __iter__(self) -> Iterator[list[int]]:
        start = self.consumed
        while self.total is None or start + self.global_batch <= self.total:
            lo = start + self.rank * self.mbs
            yield list(range(lo, lo + self.mbs))
            start += self.global_batch


class PretrainingLoader:
    """Iterable of batches for one rank; a fresh iteration restarts at ``consumed_samples``."""

    def __init__(self, dataset: PretrainingDataset, collator: Collator, sampler: DistributedBatchSampler,
                 num_workers: int) -> None:
        self.dataset, self.collator, self.sampler, self.num_workers = dataset, collator, sampler, num_workers

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # Every random number of a batch comes from (seed, sample, position) hashes, so the DataLoader needs no
        # randomness; its own generator keeps it from drawing its worker base seed from torch's global RNG (which
        # would shift the model's dropout stream and break exact resume).
        generator = torch.Generator().manual_seed(0)
        if self.num_workers == 0:
            loader = torch.utils.data.DataLoader(self.dataset, batch_sampler=self.sampler,
                                                 collate_fn=self.collator, num_workers=0, generator=generator)
            yield from loader
            return
        loader = torch.utils.data.DataLoader(self.dataset, batch_sampler=self.sampler,
                                             collate_fn=self.collator.compact,
                                             num_workers=self.num_workers, prefetch_factor=4, generator=generator)
        for flat in loader:
            yield self.collator.expand(flat)


def build_dataloader(dataset: PretrainingDataset, tokenizer, config: DataConfig, micro_batch_size: int,
                     dp_rank: int, dp_world_size: int, consumed_samples: int = 0, num_workers: int = 2,
                     epoch_seed: int | None = None, cyclic: bool = False) -> Iterable[dict[str, torch.Tensor]]:
    """Batches of ``micro_batch_size`` for ``dp_rank``, starting after ``consumed_samples`` (global count).

    Stops when the next global batch would pass ``len(dataset)``, or never with ``cyclic=True``.
    ``epoch_seed`` salts the masks (e.g. a fixed one for evaluation), leaving the order unchanged.
    """
    if dataset is None:
        raise DataConfigError(f"build_dataloader: no dataset (the split is empty with split={config.split!r})")
    collator = Collator(tokenizer, config, mask_salt=0 if epoch_seed is None else int(epoch_seed) + 1)
    sampler = DistributedBatchSampler(None if cyclic else len(dataset), consumed_samples, micro_batch_size,
                                      dp_rank, dp_world_size)
    return PretrainingLoader(dataset, collator, sampler, num_workers)


# ---------------------------------------------------------------------------------------------------------
# statistics (CLI, docs)
# ---------------------------------------------------------------------------------------------------------
def dataset_stats(dataset: PretrainingDataset, collator: Collator, max_masked_samples: int = 20000,
                  batch_size: int = 256) -> dict:
    """Sample count, fill ratio (all samples), masked fraction and [MASK]/random/kept split (first positions)."""
    N = collator.seq_length
    lengths = [c.sample_lengths() for c in dataset.components]
    all_len = np.concatenate(lengths)
    stats = {
        "num_samples": int(len(all_len)),
        "dataset_length": int(len(dataset)),
        "num_samples_per_dataset": {c.prefix: int(len(c)) for c in dataset.components},
        "seq_length": N,
        "mean_fill_ratio": float(all_len.mean() / N),
        "mean_fill_ratio_per_dataset": {c.prefix: float(l.mean() / N) for c, l in zip(dataset.components, lengths)},
        # the price of cut_fraction < 1: samples whose text starts inside a sentence
        "mid_sentence_start_fraction": float(np.mean(np.concatenate([
            ~np.isin(np.asarray(c.index)[:, A_START], np.asarray(c.shard.sequence_pointers) // c.shard.dtype.itemsize)
            for c in dataset.components]))),
    }
    n_pred = n_cand = n_mask = n_rand = n_kept = 0
    nsp_pos = nsp_total = 0
    special = collator.masker.is_special
    limit = min(max_masked_samples, len(dataset))  # never into the next epoch's samples
    for start in range(0, limit, batch_size):
        stop = min(start + batch_size, limit)
        items = dataset.__getitems__(list(range(start, stop)))
        batch = collator(items)
        ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        orig = np.full_like(ids, collator.pad_id)
        for b, it in enumerate(items):
            orig[b, :len(it[0])] = it[0]
        pred = labels != IGNORE_INDEX
        n_cand += int((~special[orig] & (batch["attention_mask"].numpy() > 0)).sum())
        n_pred += int(pred.sum())
        n_mask += int((pred & (ids == collator.masker.mask_id)).sum())
        n_kept += int((pred & (ids == labels)).sum())
        n_rand += int((pred & (ids != labels) & (ids != collator.masker.mask_id)).sum())
        if "next_sentence_label" in batch:
            nsp_pos += int(batch["next_sentence_label"].sum())
            nsp_total += len(items)
    stats.update({
        "masked_samples": int(min(max_masked_samples, len(dataset))),
        "masked_fraction": n_pred / max(n_cand, 1),
        "mask_split": {"mask": n_mask / max(n_pred, 1), "random": n_rand / max(n_pred, 1),
                       "kept": n_kept / max(n_pred, 1)},
    })
    if nsp_total:
        stats["random_next_fraction"] = nsp_pos / nsp_total
    return stats
