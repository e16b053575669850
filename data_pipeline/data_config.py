"""The data settings of pretraining: one dataclass (:class:`DataConfig`) whose field names are the trainer's flag
names, with every check written once; the sample-index and masking configs are derived from it. Plus Megatron's
``--data-path`` and ``--split`` parsing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from data_pipeline.masking import MaskingConfig
from data_pipeline.samples import SampleIndexConfig

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
        raise DataConfigError(
            f"data_path {items}: weights do not match paths; expected "
            f"'weight1 prefix1 weight2 prefix2 ...' (e.g. 0.25 books 0.75 wiki), or prefixes "
            f"without any weight"
        )
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
    sample_mode: str = "doc-sentences"
    """doc-sentences (RoBERTa-1seq), full-sentences (crosses documents), or nsp (segment pair + label)."""
    seed: int = 1234
    """Seeds sample packing, epoch shuffles and masks: the global order depends only on it and the position."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random budget per sample, as BERT's --short_seq_prob."""
    cut_fraction: float = 0.1
    """doc/full-sentences: cut the sentence that does not fit when more than this fraction of N would stay
    empty (its tail opens the next sample; nothing is dropped). 1.0 = whole sentences only."""
    mask_prob: float = 0.15
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
        if self.max_predictions_per_seq is not None and not 0 < self.max_predictions_per_seq <= self.seq_length:
            raise DataConfigError(
                f"max_predictions_per_seq={self.max_predictions_per_seq}: must be in [1, seq_length {self.seq_length}]"
            )
        if not 0.0 < self.mask_prob < 1.0:  # stricter than MaskingConfig's [0, 1]: training needs both kinds
            raise DataConfigError(f"mask_prob={self.mask_prob}: must be within (0, 1)")
        if self.pad_to_multiple_of is not None and (
            not isinstance(self.pad_to_multiple_of, int) or self.pad_to_multiple_of < 1
        ):
            raise DataConfigError(f"pad_to_multiple_of={self.pad_to_multiple_of}: must be a positive integer or None")
        try:  # the sample-index and masking settings are checked by the configs they become
            self.index_config, self.masking_config = self._index_config(), self._masking_config()
        except ValueError as e:
            raise DataConfigError(str(e)) from None

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

    def _index_config(self) -> SampleIndexConfig:
        return SampleIndexConfig(
            seq_length=self.seq_length,
            sample_mode=self.sample_mode,
            seed=self.seed,
            short_seq_prob=self.short_seq_prob,
            cut_fraction=self.cut_fraction,
        )

    def _masking_config(self) -> MaskingConfig:
        return MaskingConfig(
            mask_prob=self.mask_prob,
            whole_word_masking=self.whole_word_masking,
            max_predictions=self.max_predictions_per_seq,
        )
