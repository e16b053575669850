"""Attention patterns come in two kinds, each in its own registry, found through one lookup.

- a **block layout** (:data:`model.attention.layouts.BLOCK_LAYOUTS`, ``attention.sparsity: {"mode": name}``) says
  which (query block, key block) tiles exist: the block kernels (``block_gather``, ``flex``) compute only those, so it
  costs about density x dense. BlockBERT, DeepSpeed's layouts, BigBird/Longformer at block granularity.
- a **token mask** (:data:`model.attention.token_patterns.TOKEN_MASKS`, ``attention.token_mask: {"pattern": name}``)
  is a per-token pattern as SparseBERT's paper defines them (any (query, key) pair on or off): ``dense`` applies it
  as an element mask, ``flex`` in its ``mask_mod``, ``block_gather`` inside the tiles it computes; only blocks the
  mask empties entirely are skipped, so its cost follows the blocks it touches, not its token density.

Why two kinds: a block layout is a cost decision (it runs on block kernels), a token mask is a modelling decision
(the paper's patterns, token by token). Both kinds have ``fixed``, ``bigbird`` and ``longformer``-style entries with
different meanings, so a bare name is ambiguous: :func:`lookup` takes the kind, and refuses a bare name that both
kinds register, naming both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

BLOCK_LAYOUT = "block_layout"
TOKEN_MASK = "token_mask"


@dataclass(frozen=True)
class PatternKind:
    """One kind of attention pattern: where a model config selects it and what runs it."""

    name: str
    config_key: str
    """The model config entry that selects one (``attention.sparsity`` / ``attention.token_mask``)."""
    name_key: str
    """The key inside that entry that names it (``mode`` / ``pattern``)."""
    runs_on: str
    """What computes it, in a few words (the docs table's column)."""


KINDS: dict[str, PatternKind] = {
    BLOCK_LAYOUT: PatternKind(
        BLOCK_LAYOUT, "attention.sparsity", "mode", "block kernels skip the blocks it leaves out (~density x dense)"
    ),
    TOKEN_MASK: PatternKind(
        TOKEN_MASK,
        "attention.token_mask",
        "pattern",
        "an element mask on every kernel (only blocks it empties are skipped)",
    ),
}

REGISTRIES: dict[str, dict[str, Any]] = {kind: {} for kind in KINDS}
"""The registries by kind; :mod:`model.attention.layouts` and :mod:`model.attention.token_patterns` fill theirs."""


def setting(kind: str, name: str) -> str:
    """How a model config selects ``name`` of ``kind``, e.g. ``attention.sparsity: {"mode": "fixed"}``."""
    k = KINDS[kind]
    return f'{k.config_key}: {{"{k.name_key}": "{name}"}}'


def names(kind: str) -> list[str]:
    """The registered names of one kind, sorted (CLI choices, docs and test parameters read this)."""
    return sorted(REGISTRIES[_kind(kind)])


def lookup(name: str, kind: str | None = None) -> Any:
    """The registered entry (a layout class or a ``TokenPattern``) called ``name``.

    ``kind`` is ``"block_layout"`` or ``"token_mask"``; without it, ``name`` must be registered in one kind only
    (``fixed`` is both, so it needs the kind). A name of the other kind is named as such in the error, with the
    config entry that takes it."""
    if kind is None:
        hits = [k for k in KINDS if name in REGISTRIES[k]]
        if len(hits) > 1:
            raise ValueError(
                f"{name!r} names both a block layout ({setting(BLOCK_LAYOUT, name)}) and a token mask "
                f"({setting(TOKEN_MASK, name)}); say which kind: {BLOCK_LAYOUT!r} or {TOKEN_MASK!r} (docs/model.md, "
                "'Block layout or token mask?')"
            )
        if not hits:
            raise ValueError(
                f"{name!r} is neither a block layout ({names(BLOCK_LAYOUT)}) nor a token mask ({names(TOKEN_MASK)})"
            )
        kind = hits[0]
    registry = REGISTRIES[_kind(kind)]
    if name not in registry:
        other = [k for k in KINDS if k != kind and name in REGISTRIES[k]]
        hint = f"; it is a {other[0].replace('_', ' ')}: set {setting(other[0], name)}" if other else ""
        raise ValueError(f"{name!r} is not a registered {kind.replace('_', ' ')} (choose one of {names(kind)}){hint}")
    return registry[name]


def _kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"pattern kind must be one of {sorted(KINDS)}, got {kind!r}")
    return kind
