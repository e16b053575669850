"""DeepSpeed's block-sparse ops, ``MatMul`` and ``Softmax``, in PyTorch (any device and dtype, autograd through torch).

Format (DeepSpeed's): a layout ``[H, Mb, Nb]`` of 0/1 (a 2-D layout is one head) and a block size; a block-sparse
tensor is ``[Z, nnz, block, block]``, its nnz blocks in the row-major order of ``layout.nonzero()`` (head, block row,
block column). DeepSpeed ran these as Triton kernels (Triton 1.0, V100-era GPUs); here each op gathers the blocks it
needs and runs batched matmuls, so work and memory scale with nnz, not with the dense size.

- ``MatMul(layout, block, "sdd")``: sparse C = dense A @ dense B (only C's layout blocks are computed);
  ``"dsd"``: dense C = sparse A @ dense B; ``"dds"``: dense C = dense A @ sparse B; ``trans_a``/``trans_b`` transpose
  an input first (for a sparse input, the layout describes the stored, untransposed blocks, as in DeepSpeed).
- ``Softmax(layout, block)(x, scale, rpe, key_padding_mask, attn_mask, key_padding_mask_mode, attn_mask_mode)``:
  per row over the row's blocks of ``x * scale + rpe + masks``; ``add`` masks are added, ``mul`` masks turn 0 into
  -inf. One difference: a row with nothing left gives zeros (DeepSpeed's kernel gave NaN).
"""

from __future__ import annotations

import torch

__all__ = ["MatMul", "Softmax", "dense_to_sparse", "sparse_to_dense"]


def _layout3(layout: torch.Tensor) -> torch.Tensor:
    if layout.dim() == 2:
        layout = layout.unsqueeze(0)
    if layout.dim() != 3:
        raise ValueError(f"Layout should be a 2 or 3 dimensional tensor of 0s and 1s, got {tuple(layout.shape)}")
    return layout


def _index(layout: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(head, block row, block column) of every nonzero block, in DeepSpeed's order."""
    nz = _layout3(layout).nonzero().to(device)
    return nz[:, 0], nz[:, 1], nz[:, 2]


def _heads(x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """Head index into x (a single head broadcasts)."""
    return torch.zeros_like(h) if x.shape[1] == 1 else h


def _to4(x: torch.Tensor) -> torch.Tensor:
    while x.dim() < 4:
        x = x.unsqueeze(0)
    if x.dim() > 4:
        raise ValueError("Tensors with more than 4 dimensions are not currently supported")
    return x


def _dense_operand(x: torch.Tensor, trans: bool, k: int, dim: int, name: str) -> torch.Tensor:
    """The dense operand of a dsd/dds product, transposed if asked, with its side that meets the sparse operand
    (``dim``: -2 for B, -1 for A) checked against the sparse operand's ``k`` (DeepSpeed's message)."""
    x = x.transpose(-1, -2) if trans else x
    if x.shape[dim] != k:
        raise ValueError(f"Expected tensor {name} to have size {k} at dim {4 + dim}, got {x.shape[dim]}.")
    return x


def dense_to_sparse(dense: torch.Tensor, layout: torch.Tensor, block: int) -> torch.Tensor:
    """``[Z, H, M, N]`` -> ``[Z, nnz, block, block]``: the layout's blocks of a dense tensor."""
    h, i, j = _index(layout, dense.device)
    Z, H, M, N = dense.shape
    blocks = dense.reshape(Z, H, M // block, block, N // block, block).permute(0, 1, 2, 4, 3, 5)
    return blocks[:, _heads(dense, h), i, j]


def sparse_to_dense(sparse: torch.Tensor, layout: torch.Tensor, block: int, fill: float = 0.0) -> torch.Tensor:
    """``[Z, nnz, block, block]`` -> ``[Z, H, Mb*block, Nb*block]``, ``fill`` outside the layout."""
    lay = _layout3(layout)
    H, Mb, Nb = lay.shape
    h, i, j = _index(lay, sparse.device)
    Z = sparse.shape[0]
    out = sparse.new_full((Z, H, Mb, Nb, block, block), fill)
    out[:, h, i, j] = sparse
    return out.permute(0, 1, 2, 4, 3, 5).reshape(Z, H, Mb * block, Nb * block)


class MatMul:
    """Block-sparse matrix product (DeepSpeed 0.19.5's signature)."""

    def __init__(
        self,
        layout: torch.Tensor,
        block: int,
        mode: str,
        trans_a: bool = False,
        trans_b: bool = False,
        bench: bool = False,
    ):
        if mode not in ("sdd", "dsd", "dds"):
            raise NotImplementedError("Supported modes are: sdd, dsd, dds")
        self.layout = _layout3(layout).to(torch.int64)
        self.block, self.mode, self.trans_a, self.trans_b, self.bench = block, mode, trans_a, trans_b, bench
        self.spdims = tuple(self.layout.shape)
        self.time_c = self.time_da = self.time_db = None

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if a.device != b.device:
            raise ValueError(
                f"Inputs must be on the same device; got {a.device} for tensor A and {b.device} for tensor B"
            )
        if torch.is_autocast_enabled(a.device.type):
            dtype = torch.get_autocast_dtype(a.device.type)
            a, b = a.to(dtype), b.to(dtype)
        elif a.dtype != b.dtype:
            raise ValueError(f"Inputs must be the same dtype; got {a.dtype} for A and {b.dtype} for B")
        dims = max(a.dim(), b.dim())
        a, b = _to4(a), _to4(b)
        c = getattr(self, f"_{self.mode}")(a, b)
        while c.dim() > dims:
            c = c.squeeze(0)
        return c

    def _sdd(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        bl = self.block
        a = a.transpose(-1, -2) if self.trans_a else a  # [Z, H, M, K]
        b = b.transpose(-1, -2) if self.trans_b else b  # [Z, H, K, N]
        h, i, j = _index(self.layout, a.device)
        Z, _, M, K = a.shape
        N = b.shape[-1]
        a_rows = a.reshape(Z, a.shape[1], M // bl, bl, K)[:, _heads(a, h), i]  # [Z, nnz, bl, K]
        b_cols = b.reshape(Z, b.shape[1], K, N // bl, bl).permute(0, 1, 3, 2, 4)[:, _heads(b, h), j]  # [Z, nnz, K, bl]
        return torch.matmul(a_rows, b_cols)

    def _sparse_blocks(self, x: torch.Tensor, trans: bool):
        """The logical (transposed if asked) blocks of a sparse operand: (head, row block, col block, data)."""
        h, i, j = _index(self.layout, x.device)
        if trans:
            return h, j, i, x.transpose(-1, -2), self.spdims[2], self.spdims[1]
        return h, i, j, x, self.spdims[1], self.spdims[2]

    def _dsd(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        bl = self.block
        h, r, c, blocks, rows, cols = self._sparse_blocks(a, self.trans_a)  # logical A: [rows*bl, cols*bl]
        b = _dense_operand(b, self.trans_b, cols * bl, -2, "B")  # [Z, Hb, K, N], K = cols * bl
        Z, N, H = max(a.shape[0], b.shape[0]), b.shape[-1], self.spdims[0]
        b_rows = b.reshape(b.shape[0], b.shape[1], cols, bl, N)[:, _heads(b, h), c]  # [Z, nnz, bl, N]
        prod = torch.matmul(blocks, b_rows)  # [Z, nnz, bl, N]
        out = prod.new_zeros(Z, H * rows, bl, N)
        out = out.index_add(1, h * rows + r, prod.expand(Z, -1, -1, -1))
        return out.reshape(Z, H, rows * bl, N)

    def _dds(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        bl = self.block
        h, r, c, blocks, rows, cols = self._sparse_blocks(b, self.trans_b)  # logical B: [rows*bl, cols*bl]
        a = _dense_operand(a, self.trans_a, rows * bl, -1, "A")  # [Z, Ha, M, K], K = rows * bl
        Z, M, H = max(a.shape[0], b.shape[0]), a.shape[-2], self.spdims[0]
        a_cols = a.reshape(a.shape[0], a.shape[1], M, rows, bl).permute(0, 1, 3, 2, 4)[:, _heads(a, h), r]
        prod = torch.matmul(a_cols, blocks)  # [Z, nnz, M, bl]
        out = prod.new_zeros(Z, H * cols, M, bl)
        out = out.index_add(1, h * cols + c, prod.expand(Z, -1, -1, -1))
        return out.reshape(Z, H, cols, M, bl).permute(0, 1, 3, 2, 4).reshape(Z, H, M, cols * bl)


class Softmax:
    """Row softmax of a block-sparse tensor (DeepSpeed 0.19.5's signature)."""

    def __init__(self, layout: torch.Tensor, block: int, bench: bool = False):
        self.layout = _layout3(layout).to(torch.int64)
        self.block, self.bench = block, bench
        self.spdims = tuple(self.layout.shape)

    def __call__(
        self,
        x: torch.Tensor,
        scale: float = 1.0,
        rpe: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        key_padding_mask_mode: str = "add",
        attn_mask_mode: str = "add",
    ) -> torch.Tensor:
        for name, mode in (("key_padding_mask_mode", key_padding_mask_mode), ("attn_mask_mode", attn_mask_mode)):
            if mode not in ("add", "mul"):
                raise ValueError(f"{name} must be 'add' or 'mul', got {mode!r}")
        bl = self.block
        H, Mb, Nb = self.spdims
        h, i, j = _index(self.layout, x.device)
        s = x.float() * scale  # [Z, nnz, bl, bl]
        if rpe is not None:
            rpe4 = _to4(rpe).float()
            s = s + dense_to_sparse(
                rpe4.expand(s.shape[0] if rpe4.shape[0] == 1 else rpe4.shape[0], *rpe4.shape[1:]), self.layout, bl
            )
        if key_padding_mask is not None:
            kpm = self._mask(key_padding_mask.reshape(key_padding_mask.shape[0], -1), key_padding_mask_mode)
            s = s + kpm.reshape(kpm.shape[0], Nb, bl)[:, j][:, :, None, :]
        if attn_mask is not None:
            am = self._mask(attn_mask.reshape(attn_mask.shape[-2], attn_mask.shape[-1]), attn_mask_mode)
            s = s + am.reshape(Mb, bl, Nb, bl).permute(0, 2, 1, 3)[i, j][None]
        Z = s.shape[0]
        row = h * Mb + i  # the row block of every block
        block_max = s.amax(-1)  # [Z, nnz, bl]
        row_max = block_max.new_full((Z, H * Mb, bl), float("-inf"))
        row_max = row_max.index_reduce(1, row, block_max.detach(), "amax")
        row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)  # empty rows stay at 0
        e = torch.exp(s - row_max[:, row][..., None])
        total = e.new_zeros(Z, H * Mb, bl).index_add(1, row, e.sum(-1))
        out = e / total[:, row][..., None].clamp_min(torch.finfo(torch.float32).tiny)
        return out.to(x.dtype)

    @staticmethod
    def _mask(m: torch.Tensor, mode: str) -> torch.Tensor:
        m = m.float()
        if mode == "mul":
            return torch.where(m == 0, float("-inf"), 0.0)
        return m
