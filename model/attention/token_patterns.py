"""SparseBERT token-level attention masks as registered patterns, and the config that selects one.

A pattern is one function registered with :func:`register_pattern` under its name, with its own small parameter
dataclass (a docstring per field, checks in ``__post_init__``). In JSON the parameters sit beside ``"pattern"``:
``{"pattern": "strided", "stride": 16, "seq_len": 128}``; a key the chosen pattern does not take is refused, naming
the keys it takes. ``--help`` texts, docs/configuration.md and the tests read :data:`TOKEN_MASKS`.

A fixed mask is a bool ``[H|1, n, n]`` tensor (True = query i may attend key j) made once at ``seq_len`` and cropped
(top-left) for shorter sequences, like the block layouts. The attention module ANDs it with the block layout and
derives the block layout from it (a block is on iff any of its elements is allowed), so ``block_gather``/``flex``
skip fully masked blocks while partial blocks carry the element mask.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from common.strict_config import check_keys, field_names
from model.attention.band import BandMask
from model.attention.patterns import REGISTRIES, TOKEN_MASK, lookup

MASK_FILE_FORMAT = "sparsebert-token-masks/1"

MakeMask = Callable[[Any, int, int, torch.Generator, int], "torch.Tensor | None"]


@dataclass(frozen=True)
class TokenPattern:
    """A registered pattern: its parameter dataclass and the function that makes its mask."""

    name: str
    params: type
    make: MakeMask
    """``make(params, num_heads, n, generator, layer)`` -> bool ``[H|1, n, n]``, or None for a learned mask."""
    doc: str
    kind: str = "fixed"
    """fixed (made from its parameters), file (read from a mask file) or learned (no fixed mask)."""


TOKEN_MASKS: dict[str, TokenPattern] = REGISTRIES[TOKEN_MASK]
"""Registered token patterns by name (the token-mask kind of :mod:`model.attention.patterns`; block layouts are the
other kind)."""


def register_pattern(name: str, params: type | None = None, kind: str = "fixed") -> Callable[[MakeMask], MakeMask]:
    """Function decorator: register a mask function under ``name`` with its parameter dataclass."""
    if kind not in ("fixed", "file", "learned"):
        raise ValueError(f"token pattern kind must be fixed, file or learned, got {kind!r}")

    def deco(fn: MakeMask) -> MakeMask:
        if name in TOKEN_MASKS:
            raise ValueError(f"token pattern {name!r} is registered twice")
        doc = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        TOKEN_MASKS[name] = TokenPattern(name, params or NoParams, fn, doc, kind)
        return fn

    return deco


def pattern_names(kind: str | None = None) -> list[str]:
    """Registered pattern names (of one kind: fixed, file or learned)."""
    return [n for n, p in TOKEN_MASKS.items() if kind is None or p.kind == kind]


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(f"attention.token_mask.{message}")


# -- parameter dataclasses ---------------------------------------------------------------------------------------------
@dataclass
class NoParams:
    """The pattern takes no parameters."""


@dataclass
class StridedParams:
    stride: int = 16
    """Local band |i-j| < stride plus every stride-th offset ((i-j) % stride == 0)."""

    def __post_init__(self) -> None:
        _check(int(self.stride) >= 1, f"stride must be >= 1, got {self.stride}")


@dataclass
class FixedParams:
    block_len: int = 32
    """Tokens attend within their block of block_len tokens ..."""
    num_summary: int = 1
    """... and to the last num_summary tokens of every block (Child et al.'s c)."""

    def __post_init__(self) -> None:
        _check(
            int(self.block_len) >= 1 and int(self.num_summary) >= 1,
            f"block_len and num_summary must be >= 1, got {self.block_len}, {self.num_summary}",
        )
        _check(self.num_summary <= self.block_len, "num_summary must be <= block_len")


@dataclass
class LongformerParams:
    window: int | None = None
    """Band |i-j| <= window (None = the paper's 2)."""
    num_global: int = 2
    """Global tokens (attend everywhere and are attended by all); paper: 2."""
    global_positions: list[int] | None = None
    """Global token positions; None = random (paper: "randomly selected")."""

    def __post_init__(self) -> None:
        _check(self.window is None or self.window >= 0, f"window must be >= 0, got {self.window}")
        _check(self.num_global >= 0, f"num_global must be >= 0, got {self.num_global}")


@dataclass
class BigBirdParams:
    window: int | None = None
    """Band |i-j| <= window (None = the paper's 1)."""
    num_global: int = 2
    """Global tokens (attend everywhere and are attended by all); paper: 2."""
    global_positions: list[int] | None = None
    """Global token positions; None = the first and the last token (then 1, 2, ... when num_global > 2)."""
    num_random: int = 2
    """Random keys per query row (drawn per head)."""

    def __post_init__(self) -> None:
        _check(self.window is None or self.window >= 0, f"window must be >= 0, got {self.window}")
        _check(self.num_global >= 0 and self.num_random >= 0, "num_global and num_random must be >= 0")


@dataclass
class SlidingWindowParams:
    window: int = 128
    """ModernBERT's local_attention: query i attends key j iff |i - j| <= window // 2 (128: 64 keys each side)."""

    def __post_init__(self) -> None:
        _check(int(self.window) >= 0, f"window must be >= 0, got {self.window}")


@dataclass
class StarParams:
    relay: int = 0
    """The relay token (attends and is attended by all); the others see a ring |i-j| <= 1 (wrapping)."""


@dataclass
class FileParams:
    path: str = ""
    """A mask file written by :func:`save_masks` (e.g. DAM's export); layer i uses its ``layer{i}`` mask."""

    def __post_init__(self) -> None:
        _check(bool(self.path), "path: pattern 'file' needs 'path' (a mask file from DAM export)")


# -- the config --------------------------------------------------------------------------------------------------------
@dataclass
class TokenMaskConfig:
    """One token-level mask (JSON: ``attention.token_mask``): the settings every pattern has, plus the chosen
    pattern's parameters (:attr:`params`, whose fields sit beside ``pattern`` in JSON)."""

    pattern: str
    """Name of a registered token mask (see the pattern table in docs/model.md, 'Block layout or token mask?')."""
    seq_len: int | None = None
    """Length the mask is built for (None = max_position_embeddings); shorter inputs use the top-left crop. Set it
    to the training length: Strided/Fixed/Star depend on n (paper: n = 128)."""
    block: int = 16
    """Block size of the block layout derived from the mask when ``attention.sparsity`` is null."""
    drop_diagonal: bool = False
    """Also set M_ii = 0 (combine any pattern with the no-diagonal finding)."""
    seed: int = 0
    """Seed of every random choice (same mask on every rank and every rebuild)."""
    params: Any = dataclasses.field(default=None, metadata={"json": "inline"})
    """The pattern's parameter dataclass (None = its defaults; a dict is checked against its fields)."""

    def __post_init__(self) -> None:
        try:
            lookup(self.pattern, TOKEN_MASK)
        except ValueError as e:  # an unknown name, or a block layout's: the message names the choices
            raise ValueError(f"attention.token_mask.pattern: {e}") from None
        _check(int(self.block) >= 1, f"block must be >= 1, got {self.block}")
        _check(self.seq_len is None or self.seq_len >= 2, f"seq_len must be >= 2 or null, got {self.seq_len}")
        kind = TOKEN_MASKS[self.pattern].params
        if self.params is None:
            self.params = kind()
        elif isinstance(self.params, dict):
            self.params = _params_from_dict(self.pattern, self.params, "attention.token_mask")
        elif not isinstance(self.params, kind):
            raise ValueError(
                f"attention.token_mask: pattern {self.pattern!r} takes {kind.__name__}, got "
                f"{type(self.params).__name__}"
            )

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "attention.token_mask") -> "TokenMaskConfig":
        """The flat JSON form: common keys plus the pattern's own; anything else is refused with the allowed keys."""
        if not isinstance(d, dict):
            raise ValueError(f"{where} must be a JSON object, got {type(d).__name__}")
        if "pattern" not in d:
            raise ValueError(f"{where} needs a 'pattern': one of {pattern_names()}")
        try:
            lookup(d["pattern"], TOKEN_MASK)
        except ValueError as e:
            raise ValueError(f"{where}.pattern: {e}") from None
        common = {f.name for f in dataclasses.fields(cls)} - {"params"}
        own = {k: v for k, v in d.items() if k not in common}
        return cls(**{k: v for k, v in d.items() if k in common}, params=_params_from_dict(d["pattern"], own, where))

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON form :meth:`from_dict` reads."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "params"}
        return {**out, **dataclasses.asdict(self.params)}


def common_keys() -> list[str]:
    return [f.name for f in dataclasses.fields(TokenMaskConfig) if f.name != "params"]


def _params_from_dict(pattern: str, d: dict[str, Any], where: str) -> Any:
    kind = TOKEN_MASKS[pattern].params
    check_keys(d, field_names(kind), f"{where} (pattern {pattern!r}; common keys: {common_keys()})")
    return kind(**d)


# -- fixed patterns (all bidirectional, as BERT is) --------------------------------------------------------------------
def _offsets(n: int) -> torch.Tensor:
    i = torch.arange(n)
    return i[None, :] - i[:, None]  # [i, j] = j - i


def _globals(m: torch.Tensor, positions: list[int]) -> torch.Tensor:
    n = m.shape[-1]
    bad = [p for p in positions if not -n <= p < n]
    if bad:
        raise ValueError(f"attention.token_mask.global_positions {bad} out of range for seq_len {n}")
    for p in positions:
        m[..., p, :] = True
        m[..., :, p] = True
    return m


@register_pattern("no_diagonal")
def no_diagonal(p: NoParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """Everything but the diagonal (SparseBERT's finding: attending to oneself is not needed)."""
    return _offsets(n) != 0


@register_pattern("strided", StridedParams)
def strided(p: StridedParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """Child et al. 2019, both directions: a local band plus every stride-th offset."""
    off = _offsets(n)
    return (off.abs() < p.stride) | (off % p.stride == 0)


@register_pattern("fixed", FixedParams)
def fixed(p: FixedParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """Child et al. 2019: own block plus the summary columns of every block."""
    i = torch.arange(n)
    return (i[:, None] // p.block_len == i[None, :] // p.block_len) | (
        (i[None, :] % p.block_len >= p.block_len - p.num_summary).expand(n, n)
    )


@register_pattern("longformer", LongformerParams)
def longformer(p: LongformerParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """Beltagy et al. 2020: a band plus global tokens."""
    w = 2 if p.window is None else p.window
    pos = p.global_positions
    if pos is None:
        pos = torch.randperm(n, generator=gen)[: p.num_global].tolist()
    return _globals(_offsets(n).abs() <= w, list(pos))


@register_pattern("logsparse")
def logsparse(p: NoParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """Li et al. 2019: self and offsets +-2^k, both directions."""
    a = _offsets(n).abs()
    return (a == 0) | ((a & (a - 1)) == 0)


@register_pattern("bigbird", BigBirdParams)
def bigbird(p: BigBirdParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """Zaheer et al. 2020 at token level (the paper drops the block structure): band, globals, random keys."""
    w = 1 if p.window is None else p.window
    pos = p.global_positions
    if pos is None:
        pos = [0, n - 1][: p.num_global] + list(range(1, max(0, p.num_global - 2) + 1))
    base = _offsets(n).abs() <= w
    heads = []
    for _ in range(num_heads):
        r = torch.rand(n, n, generator=gen).argsort(-1)[:, : p.num_random]
        mh = base.clone()
        mh.scatter_(1, r, True)
        heads.append(_globals(mh, list(pos)))
    return torch.stack(heads)


@register_pattern("sliding_window", SlidingWindowParams)
def sliding_window(p: SlidingWindowParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """ModernBERT's local attention, exact at token level: the band |i - j| <= window // 2 (Hugging Face
    ModernBERT's sliding-window mask; a block ``local`` layout can only approximate it)."""
    return _offsets(n).abs() <= p.window // 2


@register_pattern("star", StarParams)
def star(p: StarParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """Guo et al. 2019: a ring of neighbours (wrapping) plus one relay token."""
    a = _offsets(n).abs()
    return _globals((a <= 1) | (a == n - 1), [p.relay])


@register_pattern("file", FileParams, kind="file")
def from_file(p: FileParams, num_heads: int, n: int, gen: torch.Generator, layer: int) -> torch.Tensor:
    """A mask file (e.g. DAM's export): layer i uses its ``layer{i}`` mask, at the length it was saved with."""
    return load_mask(p.path, layer, num_heads)


def build_token_mask(cfg: TokenMaskConfig | None, num_heads: int, n: int, layer: int) -> torch.Tensor | None:
    """The fixed bool ``[H, n', n']`` mask of a layer (None for no mask or a learned one such as DAM's)."""
    if cfg is None:
        return None
    m = TOKEN_MASKS[cfg.pattern].make(cfg.params, num_heads, n, torch.Generator().manual_seed(int(cfg.seed)), layer)
    if m is None:
        return None
    m = m.expand(num_heads, *m.shape[-2:]).clone() if m.dim() == 2 else m
    if cfg.drop_diagonal:
        m = m & ~torch.eye(m.shape[-1], dtype=torch.bool)
    return m


def build_layer_mask(cfg: TokenMaskConfig | None, num_heads: int, n: int, layer: int) -> torch.Tensor | BandMask | None:
    """What a layer's attention keeps of its fixed mask: a :class:`BandMask` for a sliding window (its radius, never
    ``[H, n, n]``: ModernBERT's local layers at n=8192), else :func:`build_token_mask`'s tensor."""
    if cfg is not None and cfg.pattern == "sliding_window" and not cfg.drop_diagonal:
        return BandMask(cfg.params.window // 2, n, num_heads)
    return build_token_mask(cfg, num_heads, n, layer)


def make_pattern(cfg: TokenMaskConfig, num_heads: int, n: int) -> torch.Tensor:
    """Bool ``[H, n, n]`` mask of a pattern that needs no file and learns nothing."""
    if TOKEN_MASKS[cfg.pattern].kind != "fixed":
        raise ValueError(f"make_pattern: pattern {cfg.pattern!r} is not a fixed pattern")
    return build_token_mask(cfg, num_heads, n, 0)


def block_layout_from_mask(mask_HNN: torch.Tensor, block: int) -> torch.Tensor:
    """int64 ``[H, M, M]``: a block is on iff any of its elements is allowed (mask padded with False to a multiple)."""
    H, n, _ = mask_HNN.shape
    nb = math.ceil(n / block)
    p = nb * block - n
    m = F.pad(mask_HNN, (0, p, 0, p), value=False) if p else mask_HNN
    return m.view(H, nb, block, nb, block).any(4).any(2).to(torch.int64)


def sparsity(mask: torch.Tensor | BandMask) -> float:
    """The paper's rho = 1 - |M| / n^2 (over all heads given); counted without a float copy of the mask."""
    if isinstance(mask, BandMask):
        return mask.sparsity()
    return 1.0 - int(torch.count_nonzero(mask)) / max(1, mask.numel())


TABLE3 = {"strided": 70.4, "fixed": 72.7, "longformer": 88.7, "logsparse": 89.8, "bigbird": 93.2, "star": 96.1}
"""SparseBERT Table 3 sparsity (%) at n = 128."""


def sparsity_table(n: int = 128, num_heads: int = 12) -> dict[str, dict[str, float]]:
    """Our sparsity for each Table 3 pattern (default settings) next to the paper's."""
    out = {}
    for name in ("no_diagonal", *TABLE3):
        m = make_pattern(TokenMaskConfig(pattern=name), num_heads, n)
        out[name] = {"ours": round(100 * sparsity(m), 2), "paper": TABLE3.get(name, round(100 / n, 2))}
    return out


# -- mask files --------------------------------------------------------------------------------------------------------
def save_masks(path: str, masks: dict[str, torch.Tensor]) -> None:
    """Write ``{"layer{i}": bool [H, n, n]}`` (e.g. :meth:`BertForPreTraining.export_learned_masks`) for
    ``{"pattern": "file", "path": ...}``; written to a temporary name first, so a crash leaves no half file."""
    shapes = {tuple(m.shape) for m in masks.values()}
    if len(shapes) != 1 or len(next(iter(shapes))) != 3:
        raise ValueError(f"masks must all be bool [H, n, n] of one shape, got shapes {sorted(shapes)}")
    H, n, _ = next(iter(shapes))
    tmp = f"{path}.tmp"
    torch.save(
        {
            "format": MASK_FILE_FORMAT,
            "num_heads": H,
            "seq_len": n,
            "masks": {k: v.detach().cpu().bool() for k, v in masks.items()},
        },
        tmp,
    )
    os.replace(tmp, path)


def load_mask(path: str, layer: int, num_heads: int) -> torch.Tensor:
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"attention.token_mask.path: mask file {path} not found") from None
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same clear message
        raise ValueError(f"attention.token_mask.path: {path} is not a mask file written by save_masks ({e})") from e
    if not isinstance(d, dict) or d.get("format") != MASK_FILE_FORMAT:
        raise ValueError(f"{path}: not a {MASK_FILE_FORMAT} file (write it with model.attention.sparsebert.save_masks)")
    key = f"layer{layer}"
    if key not in d["masks"]:
        raise ValueError(f"{path}: has masks for {sorted(d['masks'])}, the model needs {key!r}")
    m = d["masks"][key].bool()
    if m.shape[0] != num_heads:
        raise ValueError(f"{path}: {key} has {m.shape[0]} heads, the model has {num_heads}")
    return m
