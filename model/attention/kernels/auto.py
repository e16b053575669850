"""``auto``: picks one registered kernel per plan (device, compute capability, dtype, N, density, configured
attention dropout) with :func:`choose_kernel` and keeps it for training and evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from model.attention.kernels.registry import KERNELS, Call, Kernel, register_kernel


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """CUDA compute capability of ``device`` (None off CUDA)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


@dataclass
class AutoPlan:
    """The layout plus, per dtype, the kernel :func:`choose_kernel` picked and that kernel's own plan."""

    layout_HMM: torch.Tensor | None
    block: int
    seq_len: int
    device: torch.device
    density: float
    token_mask: torch.Tensor | None = None
    chosen: dict = field(default_factory=dict)
    """dtype -> kernel name, decided on the first call and kept."""
    plans: dict = field(default_factory=dict)
    """kernel name -> its plan, made on first use."""

    def prepare(self, device: torch.device, dtype: torch.dtype, configured_dropout_p: float):
        """The chosen kernel's plan for ``dtype``, chosen and built on first use (host work: before torch.compile
        traces a forward, :meth:`model.attention.module.BlockSparseAttention.build_plan` calls this)."""
        name = self.chosen.get(dtype)
        if name is None:  # the configured dropout counts, not whether this call trains: one kernel for both
            name = choose_kernel(
                device.type,
                dtype,
                self.seq_len,
                self.density,
                dropout=configured_dropout_p > 0,
                capability=device_capability(device),
            )
            self.chosen[dtype] = name
        if name not in self.plans:
            self.plans[name] = KERNELS[name].make_plan(
                self.layout_HMM, self.block, self.seq_len, self.device, token_mask=self.token_mask
            )
        return self.plans[name]

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        plan = self.prepare(q_BHND.device, q_BHND.dtype, call.configured_dropout_p)
        return plan.run(q_BHND, k_BHND, v_BHND, call)


@register_kernel("auto")
class AutoKernel(Kernel):
    """Picks a kernel once per plan (device, compute capability, dtype, N, density, configured attention dropout)
    with :func:`choose_kernel` and keeps it: training and evaluation run the same kernel (evaluation switching to
    flex would compile it on every rank mid-run)."""

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None):
        density = 1.0 if layout_HMM is None else float(layout_HMM.float().mean())
        return AutoPlan(layout_HMM, block, seq_len, torch.device(device), density, token_mask)


def choose_kernel(
    device_type: str,
    dtype: torch.dtype,
    seq_len: int,
    density: float,
    dropout: bool = False,
    capability: tuple[int, int] | None = None,
) -> str:
    """The ``auto`` rule, a pure function so every entry is testable without the device (docs/model.md has the
    table and says which entries were measured).

    - a full layout (density 1) -> ``dense`` (fused SDPA, nothing to skip);
    - ``flex`` only on CUDA, without attention dropout (FlexAttention has none), at N >= 512 (its 128-token
      blocks leave little to skip below that), density < 0.9, and on compute capability 8.0+ (Ampere, Hopper)
      only: on Volta (7.0) Triton no longer uses the tensor cores and flex runs ~10x slower than SDPA
      (attention-gym issue 21), and Turing (7.5) gets the same conservative answer (no bf16, no measurement);
    - otherwise density <= 0.75 -> ``block_gather`` (skips blocks; any device; trains), else ``dense``.

    Under ``--deterministic`` (torch's deterministic algorithms on) a CUDA run never gets ``flex``: ``dense`` and
    ``block_gather`` then run SDPA's math backend, which is deterministic; FlexAttention's backward makes no such
    promise. The same kernel trains and evaluates (the choice does not depend on whether a call needs gradients).
    """
    if density >= 1.0:
        return "dense"
    if device_type == "cuda" and torch.are_deterministic_algorithms_enabled():
        return "block_gather" if density <= 0.75 else "dense"  # deterministic SDPA (math); flex's is not promised
    if device_type == "cuda" and not dropout and density < 0.9 and seq_len >= 512:
        if (capability or (8, 0)) >= (8, 0):
            return "flex"
    return "block_gather" if density <= 0.75 else "dense"
