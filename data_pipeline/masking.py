"""Dynamic MLM masking, vectorized over a whole batch and keyed by sample, not by call order.

Every random number is a counter-based hash of ``(mask seed, sample key, position)`` (splitmix64), so the
mask of a sample depends only on its key: the same batch is masked identically whatever the worker that
builds it, the batch it shares, or the order of calls (exact resume, independence from ``num_workers``).
The loader makes the key from the sample's stream position, which differs every epoch, so every epoch
gets a fresh mask.

Selection follows BERT/RoBERTa: each non-special token is chosen with probability ``mask_prob``
(Bernoulli, as RoBERTa's dynamic masking and Hugging Face's collator do); a chosen token becomes [MASK]
with probability ``mask_token_prob``, a random non-special token with ``random_prob``, and is kept otherwise.
With whole-word masking the choice is made once per word (WordPiece ``##`` continuations and
SentencePiece pieces without ``▁`` follow their word start), and every piece of a chosen word is
predicted.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

IGNORE_INDEX = -100

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_U24 = float(1 << 24)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, elementwise on uint64 (wrapping arithmetic): a fast, good 64-bit hash.

    Always works on arrays (at least 1-D): numpy wraps integer array arithmetic silently."""
    z = np.array(x, dtype=np.uint64, ndmin=1) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def sample_keys(seed: int, positions: np.ndarray, salt: int = 0) -> np.ndarray:
    """One 64-bit key per sample from the masking seed, an optional salt and the sample's stream position."""
    base = splitmix64(np.array([(seed & 0xFFFFFFFF) << 32 | (salt & 0xFFFFFFFF)], dtype=np.uint64))
    return splitmix64(splitmix64(positions) ^ base)


SLOT_TAIL = 1e-6
"""The share of samples the derived cap may cut (:func:`derived_max_predictions`)."""


def _binomial_pmf(n: int, p: float, j: int) -> float:
    """P(X = j) for X ~ Binomial(n, p), computed in log space (no overflow at large n)."""
    return math.exp(
        math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + j * math.log(p) + (n - j) * math.log1p(-p)
    )


def binomial_above(n: int, p: float, k: int) -> float:
    """P(X > k) for X ~ Binomial(n, p), summed exactly in log space."""
    return sum(_binomial_pmf(n, p, j) for j in range(k + 1, n + 1))


def six_sigma_slots(seq_length: int, mask_prob: float) -> int:
    """``p x N`` plus 6 binomial standard deviations, rounded up to a multiple of 8 (at most N): 128 at N=512 with
    p=0.15. The whole-word cap of :func:`derived_max_predictions`, and every sample's cap before issue #47 (what
    ``benchmarks.step``'s ``head_main`` variant runs)."""
    k = math.ceil(mask_prob * seq_length + 6.0 * math.sqrt(seq_length * mask_prob * (1.0 - mask_prob)))
    return max(1, min(seq_length, -(-k // 8) * 8))


def derived_max_predictions(seq_length: int, mask_prob: float, whole_word: bool = False) -> int:
    """The default per-sample cap on predicted tokens (the MLM head's slots per row): the smallest multiple of 8
    (at most N) that a Binomial(N, p) count of chosen tokens exceeds with probability at most :data:`SLOT_TAIL`
    (1e-6): 120 at N=512 and 48 at N=128 with p=0.15 (the 77 tokens chosen on average at N=512 fill 64% of the
    slots). With whole-word masking, whose counts vary more than a binomial's (a word's pieces are chosen
    together), p x N plus 6 binomial standard deviations instead (128 at N=512).

    BERT chooses exactly ``round(p x N)`` tokens and caps them at ``max_predictions_per_seq`` (20 at N=128, 80 at
    N=512). Our masking draws every token on its own (a sample's count is binomial), so a cap near the mean would
    cut about half the samples; this one cuts about one sample in a million, which keeps its first choices (the
    smallest selection hashes), as with an explicit cap: the masker drops them, the model never does (a row with
    more labels than slots is a device-side assert).
    """
    if whole_word:
        return six_sigma_slots(seq_length, mask_prob)
    return _binomial_slots(seq_length, mask_prob)


@functools.lru_cache(maxsize=64)
def _binomial_slots(n: int, p: float) -> int:
    """The smallest multiple of 8 (at most n) with P(Binomial(n, p) > k) <= SLOT_TAIL: one pass down the tail."""
    tail = 0.0  # P(X > j) while j walks down from n
    for j in range(n, 0, -1):
        tail += _binomial_pmf(n, p, j)
        if tail > SLOT_TAIL:  # P(X > j - 1) > SLOT_TAIL: the cap must be at least j
            return min(n, -(-j // 8) * 8)
    return min(n, 8)


@dataclass
class MaskingConfig:
    """How tokens are chosen and replaced for masked-language-model training."""

    mask_prob: float = 0.15
    """Probability that a non-special token (or word, with whole-word masking) is chosen for prediction
    (Megatron's --mask-prob)."""
    mask_token_prob: float = 0.8
    """Of the chosen tokens, the share replaced by [MASK]."""
    random_prob: float = 0.1
    """Of the chosen tokens, the share replaced by a random non-special token; the rest stay unchanged."""
    whole_word_masking: bool = False
    """Choose whole words: all pieces of a word are predicted together (needs the tokenizer's word starts)."""
    max_predictions_per_seq: int | None = None
    """At most this many predicted tokens per sample (BERT's max_predictions_per_seq); None: no cap. A sample that
    drew more keeps those with the smallest selection hashes (whole words, with whole-word masking), so the model
    can gather a fixed number of positions per batch (static shapes: no host sync, one compiled graph)."""

    def __post_init__(self) -> None:
        if self.max_predictions_per_seq is not None and self.max_predictions_per_seq < 1:
            raise ValueError(f"max_predictions_per_seq={self.max_predictions_per_seq}: must be >= 1 (or None)")
        for name in ("mask_prob", "mask_token_prob", "random_prob"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name}={v}: must be within [0, 1]")
        if self.mask_token_prob + self.random_prob > 1.0 + 1e-9:
            raise ValueError(f"mask_token_prob + random_prob = {self.mask_token_prob + self.random_prob} > 1")


def _cap_per_row(chosen_BL: np.ndarray, rank_u: np.ndarray, cap: int) -> np.ndarray:
    """Keep at most ``cap`` chosen tokens per row: those with the smallest ``rank_u`` (ties by position). Tokens
    that share a rank value (the pieces of one word) are kept or dropped together, so a word is never split; a word
    that does not fit in what is left of the cap is skipped and smaller later ones may still fill it."""
    counts = chosen_BL.sum(axis=1)
    over = np.flatnonzero(counts > cap)
    if not len(over):
        return chosen_BL
    chosen_BL = chosen_BL.copy()
    for b in over:  # rare by construction (the cap sits above the expected count), so a loop per row is fine
        pos = np.flatnonzero(chosen_BL[b])
        order = pos[np.lexsort((pos, rank_u[b, pos]))]
        ranks = rank_u[b, order]
        # runs of equal rank are words: take them in rank order, skipping one that no longer fits (as BERT's
        # create_masked_lm_predictions does), so the cap is filled as far as whole words allow
        starts = np.flatnonzero(np.r_[True, ranks[1:] != ranks[:-1]])
        ends = np.r_[starts[1:], len(order)]
        keep = np.zeros(len(order), dtype=bool)
        room = cap
        for s, e in zip(starts, ends):
            if e - s <= room:
                keep[s:e] = True
                room -= e - s
        chosen_BL[b] = False
        chosen_BL[b, order[keep]] = True
    return chosen_BL


class MLMMasker:
    """Masks a padded batch ``[B, L]`` of token ids in one vectorized pass.

    Special ids and the vocabulary's word starts come from the tokenizer; nothing is hard-coded, so
    BERT vocabularies and SentencePiece models work alike. Holds only small numpy arrays (picklable
    into dataloader workers).
    """

    def __init__(
        self,
        config: MaskingConfig,
        vocab_size: int,
        mask_id: int,
        special_ids: np.ndarray,
        word_start: np.ndarray | None = None,
    ) -> None:
        self.config = config
        self.vocab_size = int(vocab_size)
        self.mask_id = int(mask_id)
        special = np.zeros(self.vocab_size, dtype=bool)
        special[np.asarray(special_ids, dtype=np.int64)] = True
        self.is_special = special
        #: ids a "random token" replacement may take: everything but specials
        self.random_ids = np.flatnonzero(~special).astype(np.int64)
        if config.whole_word_masking:
            if word_start is None:
                raise ValueError("whole_word_masking needs the tokenizer's word_start_mask()")
            ws = np.asarray(word_start, dtype=bool)
            if ws.shape != (self.vocab_size,):
                raise ValueError(f"word_start mask has shape {ws.shape}, expected ({self.vocab_size},)")
            self.word_start = ws | special
        else:
            self.word_start = None
        self._t_select = np.uint64(min(int(round(config.mask_prob * _U24)), 1 << 24))
        self._t_mask = np.uint64(int(round(config.mask_token_prob * _U24)))
        self._t_random = np.uint64(int(round((config.mask_token_prob + config.random_prob) * _U24)))

    @classmethod
    def from_tokenizer(cls, tokenizer, config: MaskingConfig) -> "MLMMasker":
        ws = tokenizer.word_start_mask() if config.whole_word_masking else None
        return cls(config, tokenizer.vocab_size, tokenizer.mask_id, tokenizer.special_ids, ws)

    def __call__(self, input_ids: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(masked_ids, labels)`` for ``input_ids [B, L]`` (int64) and per-sample ``keys [B]`` (uint64).

        ``labels`` holds the original id where a token is predicted and -100 elsewhere.
        """
        ids_BL = np.asarray(input_ids, dtype=np.int64)
        B, L = ids_BL.shape
        if B == 0:
            return ids_BL.copy(), np.full_like(ids_BL, IGNORE_INDEX)
        pos_L = np.arange(L, dtype=np.uint64)
        h_BL = splitmix64(keys.astype(np.uint64)[:, None] ^ (pos_L[None, :] * _GOLDEN))
        sel_u = h_BL & np.uint64(0xFFFFFF)  # 24-bit uniform: is this token chosen?
        act_u = (h_BL >> np.uint64(24)) & np.uint64(0xFFFFFF)  # 24-bit uniform: [MASK] / random / keep
        special_BL = self.is_special[ids_BL]

        if self.word_start is None:
            chosen_BL = (sel_u < self._t_select) & ~special_BL
        else:
            # a token starts a word if its vocabulary entry does, or if it follows a special token
            # (a sample may begin mid-word after [CLS] when a long sentence was split)
            start_BL = self.word_start[ids_BL]
            start_BL[:, 1:] |= special_BL[:, :-1]
            start_BL[:, 0] = True
            idx_BL = np.where(start_BL, np.arange(L, dtype=np.int64)[None, :], 0)
            np.maximum.accumulate(idx_BL, axis=1, out=idx_BL)  # position of each token's word start
            word_u = np.take_along_axis(sel_u, idx_BL, axis=1)
            chosen_BL = (word_u < self._t_select) & ~special_BL
        if self.config.max_predictions_per_seq is not None:
            rank_u = sel_u if self.word_start is None else word_u
            chosen_BL = _cap_per_row(chosen_BL, rank_u, self.config.max_predictions_per_seq)

        labels_BL = np.where(chosen_BL, ids_BL, IGNORE_INDEX)
        out_BL = ids_BL.copy()
        to_mask = chosen_BL & (act_u < self._t_mask)
        to_random = chosen_BL & (act_u >= self._t_mask) & (act_u < self._t_random)
        out_BL[to_mask] = self.mask_id
        n_rand = int(to_random.sum())
        if n_rand:
            r = splitmix64(h_BL[to_random]) % np.uint64(len(self.random_ids))
            out_BL[to_random] = self.random_ids[r.astype(np.int64)]
        return out_BL, labels_BL
