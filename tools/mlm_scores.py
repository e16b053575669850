"""Scores of masked-token predictions: a model's, and the unigram baseline's, the loss of a model that learned only
how often each token occurs in the training text and nothing from the context. A model below the baseline's loss
has learned something from the context; one at it has learned word frequencies only."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

TOP_K = (1, 5)
"""The top-k accuracies reported (top-1 is the MLM accuracy the trainer logs)."""


def unigram_distribution(token_arrays: Sequence[np.ndarray], weights: Sequence[float], vocab_size: int) -> np.ndarray:
    """Each array's token frequencies, add-one smoothed (a held-out token never seen in training must not make the
    loss infinite), blended by ``weights`` as the training data blend is."""
    p = np.zeros(vocab_size)
    for tokens, w in zip(token_arrays, weights):
        counts = np.bincount(np.asarray(tokens), minlength=vocab_size).astype(np.float64)
        counts += 1.0
        p += w / sum(weights) * counts / counts.sum()
    return p


def _scores(nll_M: np.ndarray, hits: dict[int, np.ndarray]) -> dict[str, float]:
    loss = float(nll_M.mean())
    out = {"loss": loss, "perplexity": math.exp(loss), "tokens": int(len(nll_M))}
    out.update({f"top{k}_accuracy": float(h.mean()) for k, h in hits.items()})
    return out


def unigram_scores(p_V: np.ndarray, labels_M: np.ndarray) -> dict[str, float]:
    """Loss, perplexity and top-k accuracy of always predicting the distribution ``p_V`` for the masked tokens
    ``labels_M``: top-1 is the most frequent token (the first of equals), top-5 the five most frequent."""
    order = np.argsort(-p_V, kind="stable")  # stable: ties keep the lower id first, as argmax does
    hits = {k: np.isin(labels_M, order[:k]) for k in TOP_K}
    return _scores(-np.log(p_V[labels_M]), hits)


def model_scores(logits_MV: np.ndarray, labels_M: np.ndarray) -> dict[str, float]:
    """Loss (mean cross-entropy), perplexity and top-k accuracy of a model's logits at the masked positions."""
    logits = logits_MV.astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    nll = -log_probs[np.arange(len(labels_M)), labels_M]
    # a label is in the top k when fewer than k tokens score strictly higher
    rank = (logits > logits[np.arange(len(labels_M)), labels_M][:, None]).sum(axis=1)
    return _scores(nll, {k: rank < k for k in TOP_K})
