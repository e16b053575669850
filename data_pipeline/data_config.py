"""The data settings of pretraining: one dataclass (:class:`DataConfig`) whose field names are the trainer's flag
names; it inherits the sample-index and masking fields, so each is defined and checked once. Plus Megatron's
``--data-path`` and ``--split`` parsing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from common.errors import UserError
from common.strict_config import from_dict
from data_pipeline.masking import MaskingConfig, derived_max_predictions
from data_pipeline.samples import SampleIndexConfig

SPLIT_NAMES = ("train", "valid", "test")


class DataConfigError(UserError, ValueError):
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
class DataConfig(MaskingConfig, SampleIndexConfig):
    """What the pretraining batches are made of (the tokenizer is passed separately).

    One family: the sample-index fields (:class:`SampleIndexConfig`) and the masking fields (:class:`MaskingConfig`)
    are inherited, each defined, documented and checked once there; :attr:`index_config` and
    :attr:`masking_config` hand exactly those fields to the index builder and the masker."""

    data_path: list[str] = field(default_factory=list)
    """Megatron style: ["prefix"], ["0.25", "books_prefix", "0.75", "wiki_prefix"] (weight, prefix pairs), or
    several prefixes without weights (each drawn in proportion to its sample count)."""
    split: str = "949,50,1"
    """Train/valid/test proportions of each shard's documents (contiguous ranges, as Megatron)."""
    pad_to_multiple_of: int | None = None
    """Pad batch length up to a multiple of this (e.g. the sparse-attention block size)."""
    dynamic_padding: bool = False
    """Pad to the longest sample of the batch (rounded up to pad_to_multiple_of) instead of seq_length."""
    cache_dir: str | None = None
    """Where to cache sample indices; None = a cache/ sub-directory beside each shard."""
    max_predictions_per_seq: int | None = None
    """At most this many predicted tokens per sample (BERT's max_predictions_per_seq), gathered by the MLM head with
    static shapes (no device-to-host sync). None: derived from mask_prob and seq_length (the smallest multiple of 8
    that the binomial count of chosen tokens exceeds with probability 1e-6: 120 at N=512, 48 at N=128 with p=0.15;
    with whole-word masking p x N plus 6 binomial standard deviations), so the cap almost never binds. A
    sample that drew more keeps those with the smallest selection hashes (whole words, with whole-word masking)."""
    dynamic_mlm_gather: bool = False
    """Select the masked positions with a boolean mask instead: no cap, a dynamic shape and one device-to-host sync
    per micro-batch (the path before the static gather became the default)."""

    def __post_init__(self) -> None:
        if isinstance(self.data_path, str):
            self.data_path = self.data_path.split()
        self.blend = parse_data_path(self.data_path)
        parse_split(self.split)
        try:  # the inherited fields are checked by the configs that define them
            SampleIndexConfig.__post_init__(self)
            MaskingConfig.__post_init__(self)
        except ValueError as e:
            raise DataConfigError(str(e)) from None
        if self.dynamic_mlm_gather and self.max_predictions_per_seq is not None:
            raise DataConfigError(
                f"max_predictions_per_seq={self.max_predictions_per_seq} and dynamic_mlm_gather: the dynamic gather "
                "has no cap; give one or the other"
            )
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq > self.seq_length:
            raise DataConfigError(
                f"max_predictions_per_seq={self.max_predictions_per_seq}: must be at most seq_length {self.seq_length}"
            )
        if not 0.0 < self.mask_prob < 1.0:  # stricter than MaskingConfig's [0, 1]: training needs both kinds
            raise DataConfigError(f"mask_prob={self.mask_prob}: must be within (0, 1)")
        if self.pad_to_multiple_of is not None and (
            not isinstance(self.pad_to_multiple_of, int) or self.pad_to_multiple_of < 1
        ):
            raise DataConfigError(f"pad_to_multiple_of={self.pad_to_multiple_of}: must be a positive integer or None")

    @property
    def index_config(self) -> SampleIndexConfig:
        """The fields that define the sample index (and its cache name)."""
        return _project(self, SampleIndexConfig)

    @property
    def max_predictions(self) -> int | None:
        """The per-sample cap the masker applies and the MLM head gathers: ``max_predictions_per_seq`` if given,
        else derived from mask_prob and seq_length; None with ``dynamic_mlm_gather``."""
        if self.dynamic_mlm_gather:
            return None
        if self.max_predictions_per_seq is not None:
            return self.max_predictions_per_seq
        return derived_max_predictions(self.seq_length, self.mask_prob, self.whole_word_masking)

    @property
    def masking_config(self) -> MaskingConfig:
        """The fields that define masking (with the effective cap, :attr:`max_predictions`)."""
        return dataclasses.replace(_project(self, MaskingConfig), max_predictions_per_seq=self.max_predictions)

    @classmethod
    def from_dict(cls, d: dict) -> "DataConfig":
        """Build from a JSON object; unknown keys are an error (typos must not pass silently)."""
        try:
            return from_dict(cls, d, "the data config")
        except DataConfigError:
            raise
        except ValueError as e:
            raise DataConfigError(str(e)) from None

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def _project(config: DataConfig, cls: type):
    """``cls`` built from the same-named fields of ``config`` (a DataConfig is both of its bases)."""
    return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})
