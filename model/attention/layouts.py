"""Block-sparse attention layouts as data.

A layout is an ``int64`` tensor ``[heads, N/block, N/block]`` of 0/1: entry ``[h, i, j]`` says whether query block
``i`` of head ``h`` may attend to key block ``j``. The DeepSpeed-compatible classes keep DeepSpeed's constructor
arguments, defaults, validation messages and block patterns (last shipped in deepspeed 0.19.5,
``deepspeed/ops/sparse_attention/sparsity_config.py``; re-implemented here, checked against goldens made with that
file, see ``tests/data/README.md``). Differences, all additive:

- random blocks come from a ``torch.Generator`` seeded with ``seed`` (keyword, default 0), so every rank builds the
  same layout without a broadcast; DeepSpeed drew from Python's global ``random``;
- ``padded_length(n)`` says to what length a sequence is padded (DeepSpeed raised instead of padding);
- ``layout_for_length(master, n)`` says how a layout made once at ``max_seq_length`` serves a shorter sequence
  (DeepSpeed's ``SparseSelfAttention`` sliced its master layout; BlockBERT depends on ``n`` and rebuilds).
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Sequence

import torch

from model.attention.patterns import BLOCK_LAYOUT, REGISTRIES, lookup

__all__ = [
    "SparsityConfig",
    "DenseSparsityConfig",
    "FixedSparsityConfig",
    "VariableSparsityConfig",
    "BigBirdSparsityConfig",
    "BSLongformerSparsityConfig",
    "LocalSlidingWindowSparsityConfig",
    "DilatedSlidingWindowSparsityConfig",
    "BlockBERTSparsityConfig",
    "from_ds_config",
    "layout_density",
    "BLOCK_LAYOUTS",
    "register_layout",
    "accepted_keys",
]

_DIRECTIONS = ("unidirectional", "bidirectional")


def _check_attention(attention: str, horizontal_global_attention: bool = False) -> None:
    if attention not in _DIRECTIONS:
        raise NotImplementedError('only "uni/bi-directional" attentions are supported for now!')
    if attention != "bidirectional" and horizontal_global_attention:
        raise ValueError('only "bi-directional" attentions can support horizontal global attention!')


def _check_global_ranges(starts: Sequence[int], ends: Sequence[int] | None) -> None:
    if ends is None:
        return
    if len(starts) != len(ends):
        raise ValueError(
            f"Global block start indices length, {len(starts)}, must be same as global block end indices length, "
            f"{len(ends)}!"
        )
    for s, e in zip(starts, ends):
        if s >= e:
            raise ValueError(f"Global block start index, {s}, must be smaller than global block end index, {e}!")


BLOCK_LAYOUTS: dict[str, type["SparsityConfig"]] = REGISTRIES[BLOCK_LAYOUT]
"""Registered block layout classes by ``mode`` (the block-layout kind of :mod:`model.attention.patterns`; token
masks are the other kind): ``from_ds_config``, ``--sparsity-config``, the docs, the benchmarks' choices and the
tests' parametrisations read this. Every class must build from ``num_heads`` alone (its defaults): the benchmarks
run a mode they have no tuned settings for that way."""


def register_layout(cls: type["SparsityConfig"]) -> type["SparsityConfig"]:
    """Class decorator: register a layout family under its ``mode``. The keys a ds_config block may give for it are
    its constructor's parameters (:func:`accepted_keys`), so there is no second list to keep in step."""
    if cls.mode in BLOCK_LAYOUTS:
        raise ValueError(f"layout mode {cls.mode!r} is registered twice")
    BLOCK_LAYOUTS[cls.mode] = cls
    return cls


def accepted_keys(cls: type["SparsityConfig"]) -> set[str]:
    """``mode`` plus the constructor's parameters other than ``num_heads`` (which comes from the model)."""
    params = inspect.signature(cls.__init__).parameters
    return {"mode"} | {p for p in params if p not in ("self", "num_heads")}


class SparsityConfig:
    """Base class: number of heads, block size, and whether heads get different layouts."""

    mode = "base"

    def __init__(self, num_heads: int, block: int = 16, different_layout_per_head: bool = False, *, seed: int = 0):
        if num_heads < 1 or block < 1:
            raise ValueError(f"num_heads ({num_heads}) and block ({block}) must be positive integers")
        self.num_heads = num_heads
        self.block = block
        self.different_layout_per_head = different_layout_per_head
        self.num_layout_heads = num_heads if different_layout_per_head else 1
        self.seed = seed

    # -- shared helpers -------------------------------------------------------------------------------------------
    def setup_layout(self, seq_len: int) -> torch.Tensor:
        """All-zero layout for ``seq_len`` (which must be a multiple of ``block``, as in DeepSpeed)."""
        if seq_len % self.block != 0:
            raise ValueError(f"Sequence Length, {seq_len}, needs to be dividable by Block size {self.block}!")
        nb = seq_len // self.block
        return torch.zeros((self.num_heads, nb, nb), dtype=torch.int64)

    def check_and_propagate_first_head_layout(self, layout: torch.Tensor) -> torch.Tensor:
        if not self.different_layout_per_head:
            layout[1:] = layout[0]
        return layout

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(int(self.seed))

    def _random_generator(self) -> torch.Generator:
        """The generator of the make_layout call in progress (set_random_layout draws from it), else a fresh one."""
        gen = self.__dict__.get("_gen")
        return gen if gen is not None else self._generator()

    def _public_vars(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if not k.startswith("_")}

    def make_layout(self, seq_len: int) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- extensions -----------------------------------------------------------------------------------------------
    def padded_length(self, seq_len: int) -> int:
        """Smallest length >= seq_len this layout family can serve (padding is masked as keys, cut from outputs)."""
        return math.ceil(seq_len / self.block) * self.block

    def layout_for_length(self, master: torch.Tensor, seq_len: int) -> torch.Tensor:
        """Layout for a (padded) length from the layout made once at max length: DeepSpeed sliced it."""
        nb = seq_len // self.block
        if nb > master.shape[-1]:
            raise ValueError(
                f"sequence length {seq_len} exceeds the layout's max_seq_length {master.shape[-1] * self.block}; "
                "raise max_seq_length (or max_position_embeddings) in the attention config"
            )
        return master[:, :nb, :nb]

    def family(self) -> str:
        """The layout family ``auto``'s measured table is keyed by (the kernel table's layout names): the mode and
        the block size, which set the kernels' tiling; subclasses add what changes the pattern's shape."""
        return f"{self.mode}_b{self.block}"

    def to_dict(self) -> dict[str, Any]:
        """The ds_config-style dict that ``from_ds_config`` turns back into this object."""
        d = {"mode": self.mode}
        d.update({k: v for k, v in self._public_vars().items() if k not in ("num_heads", "num_layout_heads")})
        return d

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._public_vars().items() if k != "num_layout_heads")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._public_vars() == other._public_vars()

    def _make(self, seq_len: int, steps: Sequence[str]) -> torch.Tensor:
        """DeepSpeed's make_layout: for each layout head, the named ``set_*`` steps in order, then the first head
        propagated. Steps are looked up on the instance, so a subclass that overrides one is honoured."""
        layout = self.setup_layout(seq_len)
        self._gen = self._generator()
        try:
            for h in range(self.num_layout_heads):
                for name in steps:
                    layout = getattr(self, name)(h, layout)
        finally:
            self._gen = None
            del self._gen
        return self.check_and_propagate_first_head_layout(layout)


@register_layout
class DenseSparsityConfig(SparsityConfig):
    """Every block on (for comparison)."""

    mode = "dense"

    def make_layout(self, seq_len: int) -> torch.Tensor:
        layout = self.setup_layout(seq_len)
        layout[:] = 1
        return layout


@register_layout
class FixedSparsityConfig(SparsityConfig):
    """Sparse Transformer 'fixed' pattern: local windows plus global representative blocks per window."""

    mode = "fixed"

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        different_layout_per_head: bool = False,
        num_local_blocks: int = 4,
        num_global_blocks: int = 1,
        attention: str = "bidirectional",
        horizontal_global_attention: bool = False,
        num_different_global_patterns: int = 1,
        *,
        seed: int = 0,
    ):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        if num_local_blocks % num_global_blocks != 0:
            raise ValueError(
                f"Number of blocks in a local window, {num_local_blocks}, must be dividable by number of global "
                f"blocks, {num_global_blocks}!"
            )
        _check_attention(attention, horizontal_global_attention)
        if num_different_global_patterns > 1 and not different_layout_per_head:
            raise ValueError(
                "Number of different layouts cannot be more than one when you have set a single layout for all "
                "heads! Set different_layout_per_head to True."
            )
        if num_different_global_patterns > num_local_blocks // num_global_blocks:
            raise ValueError(
                f"Number of layout versions (num_different_global_patterns), {num_different_global_patterns}, cannot "
                f"be larger than number of local window blocks divided by number of global blocks, "
                f"{num_local_blocks} / {num_global_blocks} = {num_local_blocks // num_global_blocks}!"
            )
        self.num_local_blocks = num_local_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention
        self.num_different_global_patterns = num_different_global_patterns

    def set_local_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Local windows of ``num_local_blocks`` blocks (lower triangle only when unidirectional)."""
        nb = layout.shape[1]
        uni = self.attention == "unidirectional"
        for start in range(0, nb, self.num_local_blocks):
            stop = min(start + self.num_local_blocks, nb)
            window = torch.ones(stop - start, stop - start, dtype=layout.dtype)
            layout[h, start:stop, start:stop] = torch.tril(window) if uni else window
        return layout

    def set_global_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """The representative blocks of each window (the last one for head 0, earlier ones for other patterns)."""
        nb = layout.shape[1]
        g = self.num_global_blocks
        first = self.num_local_blocks - (1 + h % self.num_different_global_patterns) * g
        full_end = nb - nb % self.num_local_blocks
        starts = list(range(first, full_end, self.num_local_blocks))
        if full_end < nb:  # the trailing partial window gets a representative too, clipped to the end
            starts.append(min(full_end + first, nb - g))
        for s in starts:
            top = 0 if self.attention == "bidirectional" else s
            layout[h, top:, s : s + g] = 1
            if self.horizontal_global_attention:
                layout[h, s : s + g, :] = 1
        return layout

    def make_layout(self, seq_len: int) -> torch.Tensor:
        return self._make(seq_len, ("set_local_layout", "set_global_layout"))


def _random_rows(layout: torch.Tensor, h: int, k: int, gen: torch.Generator, causal: bool) -> None:
    """k distinct random key blocks per query row (from the row's allowed range), drawn from ``gen``."""
    nb = layout.shape[1]
    if nb < k:
        raise ValueError(f"Number of random blocks, {k}, must be smaller than overall number of blocks in a row, {nb}!")
    if k == 0:
        return
    for row in range(nb):
        span = row + 1 if causal else nb
        if span < k:
            raise ValueError(
                f"Number of random blocks, {k}, must be smaller than the {span} blocks row {row} may attend to"
            )
        cols = torch.randperm(span, generator=gen)[:k]
        layout[h, row, cols] = 1


def _sliding(layout: torch.Tensor, h: int, w_blocks: int, causal: bool) -> None:
    nb = layout.shape[1]
    if nb < w_blocks:
        raise ValueError(
            f"Number of sliding window blocks, {w_blocks}, must be smaller than overall number of blocks in a row, "
            f"{nb}!"
        )
    w = w_blocks // 2
    for row in range(nb):
        start = max(0, row - w)
        end = row + 1 if causal else min(row + w + 1, nb)
        layout[h, row, start:end] = 1


def _global_ranges(
    layout: torch.Tensor, h: int, starts: Sequence[int], ends: Sequence[int] | None, *, horizontal: bool, top_rows: bool
) -> None:
    """Global key blocks (all rows attend to them); ``horizontal`` also lets them attend to all keys.

    ``top_rows`` False (unidirectional Variable) starts the vertical stripe at the global block itself.
    """
    nb = layout.shape[1]
    ranges = [(s, s + 1) for s in starts] if ends is None else list(zip(starts, ends))
    for s, e in ranges:
        if s >= nb:
            continue
        e = min(e, nb)
        if horizontal:
            layout[h, s:e, :] = 1
        layout[h, (0 if top_rows else s) :, s:e] = 1


@register_layout
class VariableSparsityConfig(SparsityConfig):
    """Fixed pattern generalised: random blocks, a list of local window sizes, explicit global blocks."""

    mode = "variable"

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        different_layout_per_head: bool = False,
        num_random_blocks: int = 0,
        local_window_blocks: Sequence[int] = (4,),
        global_block_indices: Sequence[int] = (0,),
        global_block_end_indices: Sequence[int] | None = None,
        attention: str = "bidirectional",
        horizontal_global_attention: bool = False,
        *,
        seed: int = 0,
    ):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        _check_attention(attention, horizontal_global_attention)
        self.num_random_blocks = num_random_blocks
        self.local_window_blocks = list(local_window_blocks)
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = None if global_block_end_indices is None else list(global_block_end_indices)
        self.attention = attention
        self.horizontal_global_attention = horizontal_global_attention

    def set_random_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """``num_random_blocks`` random key blocks per row (any direction, as in DeepSpeed), seeded."""
        _random_rows(layout, h, self.num_random_blocks, self._random_generator(), causal=False)
        return layout

    def set_global_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Global blocks at ``global_block_indices`` (ranges with ``global_block_end_indices``)."""
        _global_ranges(
            layout,
            h,
            self.global_block_indices,
            self.global_block_end_indices,
            horizontal=self.horizontal_global_attention,
            top_rows=self.attention == "bidirectional",
        )
        return layout

    def set_local_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Windows of the sizes in ``local_window_blocks``; the last size repeats to the end."""
        nb = layout.shape[1]
        uni = self.attention == "unidirectional"

        def window(a: int, b: int) -> None:
            if b > a:
                ones = torch.ones(b - a, b - a, dtype=layout.dtype)
                layout[h, a:b, a:b] = torch.tril(ones) if uni else ones

        start = 0
        for size in self.local_window_blocks:
            window(start, min(start + size, nb))
            start += size
        size = self.local_window_blocks[-1]  # the last size repeats over the remaining blocks
        for a in range(start, nb, size):
            window(a, min(a + size, nb))
        return layout

    def make_layout(self, seq_len: int) -> torch.Tensor:
        return self._make(seq_len, ("set_random_layout", "set_local_layout", "set_global_layout"))


@register_layout
class BigBirdSparsityConfig(SparsityConfig):
    """BigBird: random blocks, a sliding window and leading global blocks."""

    mode = "bigbird"

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        different_layout_per_head: bool = False,
        num_random_blocks: int = 1,
        num_sliding_window_blocks: int = 3,
        num_global_blocks: int = 1,
        attention: str = "bidirectional",
        *,
        seed: int = 0,
    ):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        _check_attention(attention)
        self.num_random_blocks = num_random_blocks
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.num_global_blocks = num_global_blocks
        self.attention = attention

    def set_random_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """``num_random_blocks`` random key blocks per row (only past blocks when unidirectional), seeded."""
        _random_rows(
            layout, h, self.num_random_blocks, self._random_generator(), causal=self.attention == "unidirectional"
        )
        return layout

    def set_sliding_window_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """A window of ``num_sliding_window_blocks`` blocks centred on the diagonal."""
        _sliding(layout, h, self.num_sliding_window_blocks, causal=False)
        return layout

    def set_global_layout_itc(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """The first ``num_global_blocks`` blocks attend to and are attended by everything (BigBird's ITC); the whole
        layout is cut to its lower triangle when unidirectional, as DeepSpeed does here."""
        nb = layout.shape[1]
        if nb < self.num_global_blocks:
            raise ValueError(
                f"Number of global blocks, {self.num_global_blocks}, must be smaller than overall number of "
                f"blocks in a row, {nb}!"
            )
        layout[h, : self.num_global_blocks, :] = 1
        layout[h, :, : self.num_global_blocks] = 1
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        return layout

    def make_layout(self, seq_len: int) -> torch.Tensor:
        return self._make(seq_len, ("set_random_layout", "set_sliding_window_layout", "set_global_layout_itc"))


@register_layout
class BSLongformerSparsityConfig(SparsityConfig):
    """Block-sparse Longformer: sliding window plus global blocks that attend and are attended everywhere."""

    mode = "bslongformer"

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        different_layout_per_head: bool = False,
        num_sliding_window_blocks: int = 3,
        global_block_indices: Sequence[int] = (0,),
        global_block_end_indices: Sequence[int] | None = None,
        attention: str = "bidirectional",
        *,
        seed: int = 0,
    ):
        super().__init__(num_heads, block, different_layout_per_head, seed=seed)
        _check_global_ranges(global_block_indices, global_block_end_indices)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.global_block_indices = list(global_block_indices)
        self.global_block_end_indices = None if global_block_end_indices is None else list(global_block_end_indices)
        self.attention = attention

    def set_sliding_window_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """A window of ``num_sliding_window_blocks`` blocks centred on the diagonal."""
        _sliding(layout, h, self.num_sliding_window_blocks, causal=False)
        return layout

    def set_global_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """Global blocks that attend everywhere and are attended from everywhere (lower triangle if unidirectional)."""
        _global_ranges(
            layout, h, self.global_block_indices, self.global_block_end_indices, horizontal=True, top_rows=True
        )
        if self.attention == "unidirectional":
            layout = torch.tril(layout)
        return layout

    def make_layout(self, seq_len: int) -> torch.Tensor:
        return self._make(seq_len, ("set_sliding_window_layout", "set_global_layout"))


@register_layout
class LocalSlidingWindowSparsityConfig(SparsityConfig):
    """Purely local sliding window (DeepSpeed's default direction here is unidirectional)."""

    mode = "local"

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        num_sliding_window_blocks: int = 3,
        attention: str = "unidirectional",
        *,
        seed: int = 0,
    ):
        super().__init__(num_heads, block, seed=seed)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.attention = attention

    def family(self) -> str:
        return f"local_{'bi' if self.attention == 'bidirectional' else 'uni'}_b{self.block}"

    def set_sliding_window_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """A window of ``num_sliding_window_blocks`` blocks (only the past half when unidirectional)."""
        _sliding(layout, h, self.num_sliding_window_blocks, causal=self.attention != "bidirectional")
        return layout

    def make_layout(self, seq_len: int) -> torch.Tensor:
        return self._make(seq_len, ("set_sliding_window_layout",))


@register_layout
class DilatedSlidingWindowSparsityConfig(SparsityConfig):
    """Longformer's dilated sliding window at block granularity: query block i attends key blocks i + k * dilation
    for |k| <= num_sliding_window_blocks // 2 (bidirectional), or -(num_sliding_window_blocks - 1) <= k <= 0
    (unidirectional). Not a DeepSpeed mode (the worked example of docs/architecture.md)."""

    mode = "dilated_local"

    def __init__(
        self,
        num_heads: int,
        block: int = 16,
        num_sliding_window_blocks: int = 3,
        dilation: int = 2,
        attention: str = "bidirectional",
        *,
        seed: int = 0,
    ):
        super().__init__(num_heads, block, seed=seed)
        if num_sliding_window_blocks < 1 or dilation < 1:
            raise ValueError(
                f"num_sliding_window_blocks ({num_sliding_window_blocks}) and dilation ({dilation}) "
                "must be positive integers"
            )
        _check_attention(attention)
        self.num_sliding_window_blocks = num_sliding_window_blocks
        self.dilation = dilation
        self.attention = attention

    def set_dilated_window_layout(self, h: int, layout: torch.Tensor) -> torch.Tensor:
        """The blocks i + k * dilation of each query block i that exist."""
        nb = layout.shape[-1]
        w = self.num_sliding_window_blocks
        ks = range(-(w - 1), 1) if self.attention == "unidirectional" else range(-(w // 2), w // 2 + 1)
        i = torch.arange(nb)
        for k in ks:
            j = i + k * self.dilation
            ok = (j >= 0) & (j < nb)
            layout[h, i[ok], j[ok]] = 1
        return layout

    def make_layout(self, seq_len: int) -> torch.Tensor:
        return self._make(seq_len, ("set_dilated_window_layout",))


def parse_head_assignment(spec: str | Sequence[int], num_heads: int, num_blocks: int) -> list[int]:
    """'10:2' -> [10, 2]: heads per cyclic shift k = 0, 1, ...; must sum to num_heads, at most num_blocks groups."""
    if isinstance(spec, str):
        try:
            counts = [int(p) for p in spec.split(":")]
        except ValueError:
            raise ValueError(f"head_assignment {spec!r} must look like '10:2' (heads per shift, ':'-separated)")
    else:
        counts = [int(c) for c in spec]
    if any(c < 0 for c in counts) or sum(counts) != num_heads:
        raise ValueError(f"head_assignment {spec!r} must be non-negative counts summing to num_heads={num_heads}")
    if len(counts) > num_blocks:
        raise ValueError(
            f"head_assignment {spec!r} has {len(counts)} groups but num_blocks={num_blocks} allows shifts "
            f"0..{num_blocks - 1}"
        )
    return counts


@register_layout
class BlockBERTSparsityConfig(SparsityConfig):
    """BlockBERT (blockwise attention paper, Eq. 2-3): n chunks; heads of group k use the k-fold cyclic shift.

    Query chunk i of a head in group k attends to key chunk (i + k) mod n. ``block`` is the tile size of the layout
    tensor; the layout is made at N rounded up to a multiple of ``num_blocks * block`` (paper footnote 4), never
    truncated. Its chunks are the chunks of that grid: block_gather computes a shorter N on them unpadded (the last
    chunks cut), other kernels pad to it.
    """

    mode = "blockbert"

    def __init__(
        self,
        num_heads: int,
        num_blocks: int = 2,
        head_assignment: str | Sequence[int] = "10:2",
        block: int = 16,
        *,
        seed: int = 0,
    ):
        super().__init__(num_heads, block, different_layout_per_head=True, seed=seed)
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        counts = parse_head_assignment(head_assignment, num_heads, num_blocks)
        self.shifts = [k for k, c in enumerate(counts) for _ in range(c)]
        self.head_assignment = (
            head_assignment if isinstance(head_assignment, str) else ":".join(map(str, head_assignment))
        )

    def family(self) -> str:
        """``blockbert_n{n}``: the chunk count sets the pattern (``block`` is only the layout tensor's tile)."""
        return f"blockbert_n{self.num_blocks}"

    def padded_length(self, seq_len: int) -> int:
        unit = self.num_blocks * self.block
        return math.ceil(seq_len / unit) * unit

    def make_layout(self, seq_len: int) -> torch.Tensor:
        if seq_len % (self.num_blocks * self.block):
            raise ValueError(
                f"BlockBERT needs seq_len divisible by num_blocks*block = {self.num_blocks * self.block}; "
                f"got {seq_len}. "
                f"Pad to padded_length({seq_len}) = {self.padded_length(seq_len)} (SparseSelfAttention does this)."
            )
        layout = self.setup_layout(seq_len)
        tiles = seq_len // self.block // self.num_blocks  # layout tiles per chunk
        chunk = torch.arange(layout.shape[1]) // tiles
        for h, k in enumerate(self.shifts):
            layout[h] = (chunk[None, :] == (chunk[:, None] + k) % self.num_blocks).to(torch.int64)
        return layout

    def layout_for_length(self, master: torch.Tensor, seq_len: int) -> torch.Tensor:
        return self.make_layout(seq_len)

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "num_blocks": self.num_blocks,
            "head_assignment": self.head_assignment,
            "block": self.block,
            "seed": self.seed,
        }


# Old ds_config keys that DeepSpeed's own modes ignored when a mode did not use them; accepted (and ignored) for those
# modes (DEEPSPEED_MODES) so old configs still load. Modes DeepSpeed never had refuse them.
_OLD_DS_KEYS = {
    "num_local_blocks",
    "num_global_blocks",
    "attention",
    "horizontal_global_attention",
    "num_different_global_patterns",
    "num_random_blocks",
    "local_window_blocks",
    "global_block_indices",
    "global_block_end_indices",
    "num_sliding_window_blocks",
    "different_layout_per_head",
    "block",
}


DEEPSPEED_MODES = frozenset({"dense", "fixed", "variable", "bigbird", "bslongformer"})
"""The modes DeepSpeed 0.19.5's own ds_config parser knew (its defaults for them are in
:mod:`model.attention.deepspeed.ds_config`): they tolerate, and ignore, DeepSpeed's keys they do not use."""


def check_ds_config(cfg: Any) -> dict[str, Any]:
    """The constructor arguments of ``cfg``'s layout class (``mode`` removed), after checking its mode and keys; no
    head count needed, so a config is checked when it is parsed, before any model is built.

    Unknown keys raise with their names. For DeepSpeed's own modes (dense, fixed, variable, bigbird, bslongformer),
    keys DeepSpeed knew but the mode does not use are ignored, as DeepSpeed did; other modes accept only their
    constructor parameters."""
    if not isinstance(cfg, dict) or "mode" not in cfg:
        raise ValueError(
            f"sparse_attention config must be a dict with a 'mode' key (one of {sorted(BLOCK_LAYOUTS)}); got {cfg!r}"
        )
    mode = cfg["mode"]
    try:
        cls = lookup(mode, BLOCK_LAYOUT)
    except ValueError as e:  # DeepSpeed raised NotImplementedError for a mode it did not have
        raise NotImplementedError(f"sparse_attention mode {mode!r} is not supported: {e}") from None
    allowed = accepted_keys(cls)
    tolerated = _OLD_DS_KEYS if mode in DEEPSPEED_MODES else set()  # modes DeepSpeed never had are strict
    unknown = sorted(set(cfg) - allowed - tolerated)
    if unknown:
        raise ValueError(
            f"unknown key(s) {unknown} in sparse_attention config for mode {mode!r}; allowed: {sorted(allowed)}"
        )
    return {k: v for k, v in cfg.items() if k in allowed and k != "mode"}


def from_ds_config(cfg: dict[str, Any], num_heads: int) -> SparsityConfig:
    """Build a layout from an old ds_config ``sparse_attention`` block (or our BlockBERT dict); keys as
    :func:`check_ds_config` says."""
    kwargs = check_ds_config(cfg)
    return BLOCK_LAYOUTS[cfg["mode"]](num_heads=num_heads, **kwargs)


def layout_density(layout: torch.Tensor) -> float:
    """Fraction of blocks that are on."""
    return float(layout.float().mean())
