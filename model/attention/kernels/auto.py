"""``auto``: picks one registered kernel per plan and keeps it for training and evaluation: the measured table
(``auto_table.json``, generated from committed GPU kernel-table reports by ``devtools/auto_table.py``) where it
has an entry for the GPU's compute capability, the layout family, N and dtype, else the rule :func:`choose_kernel`.

The table's paths are block_gather, flex, triton_block and dense; each entry records the attention dropout it was
measured with, and a run under another dropout is told so at start-up (:func:`table_choice`)."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from model.attention.kernels.registry import KERNELS, Call, Kernel, register_kernel


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """CUDA compute capability of ``device`` (None off CUDA)."""
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


TABLE_PATH = Path(__file__).with_name("auto_table.json")
"""The measured table (written by ``python -m devtools.auto_table``; never edited by hand)."""
TABLE_KERNELS = ("dense", "flex", "block_gather", "triton_block")
"""The paths the table compares (``dense`` given a sparse layout runs dense SDPA with the layout's mask)."""
NO_DROPOUT_KERNELS = ("flex",)
"""Paths without attention dropout (FlexAttention has none): never chosen for a run that trains with it."""
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@functools.cache
def load_table(path: Path = TABLE_PATH) -> dict:
    """The measured table (empty where the file is absent, e.g. in a Hugging Face remote-code export)."""
    return json.loads(path.read_text()) if path.exists() else {"entries": []}


def entry_dropout(entry: dict) -> float:
    """The attention dropout an entry was measured with (tables before 2026-11-28 wrote a bool: False = 0.0)."""
    return float(entry.get("dropout", 0.0))


@dataclass(frozen=True)
class TableHit:
    """What the measured table says for a plan: the kernel, the entry it comes from, and a warning when that entry
    was measured under another attention dropout than the run's (what ``auto`` then falls back to, said once at
    start-up)."""

    kernel: str
    entry: dict
    warning: str = ""


def table_choice(
    capability: tuple[int, int] | None,
    family: str | None,
    seq_len: int,
    dtype: torch.dtype,
    dropout_p: float,
    table: dict | None = None,
) -> TableHit | None:
    """The measured table's pick: same compute capability, layout family and dtype, measured under the run's
    attention dropout ``dropout_p``; the nearest measured (padded) N, log scale, if ``seq_len`` (padded) lies
    within the measured range; the fastest measured path that has the run's dropout (``flex`` has none).

    Where the table has entries for this key but none measured under the run's dropout (e.g. measured at 0, the run
    trains at 0.1: dropout costs each path differently), the entries of the nearest measured dropout rank the paths
    instead and :attr:`TableHit.warning` says so and what to measure. None: no entry."""
    if capability is None or family is None or dtype not in DTYPE_NAMES:
        return None
    rows = [
        e
        for e in (load_table() if table is None else table)["entries"]
        if tuple(e["capability"]) == tuple(capability) and e["family"] == family and e["dtype"] == DTYPE_NAMES[dtype]
    ]
    if not rows:
        return None
    measured = sorted({entry_dropout(e) for e in rows})
    nearest = min(measured, key=lambda p: (abs(p - dropout_p), p))
    rows = [e for e in rows if entry_dropout(e) == nearest]
    if not min(e["padded_n"] for e in rows) <= seq_len <= max(e["padded_n"] for e in rows):
        return None
    entry = min(rows, key=lambda e: (abs(math.log2(e["padded_n"] / seq_len)), e["padded_n"]))
    allowed = {k: r for k, r in entry["ratios"].items() if not (dropout_p > 0 and k in NO_DROPOUT_KERNELS)}
    if not allowed:
        return None
    kernel = min(allowed, key=lambda k: (allowed[k], k != "dense"))
    warning = ""
    if abs(nearest - dropout_p) > 1e-9:
        warning = (
            f"WARNING: the table was measured at attention dropout {nearest:g}, this run trains with {dropout_p:g}: "
            f"falling back to the dropout-{nearest:g} ranking of the paths that have dropout {dropout_p:g}"
            + f"; measure it with the kernel table's --dropout {dropout_p:g} (docs/model.md, 'Measured table')"
        )
    return TableHit(kernel, entry, warning)


@dataclass
class AutoPlan:
    """The layout plus, per dtype, the kernel :func:`choose_kernel` picked and that kernel's own plan."""

    layout_HMM: torch.Tensor | None
    block: int
    seq_len: int
    device: torch.device
    density: float
    token_mask: torch.Tensor | None = None
    family: str | None = None
    """The layout family (``SparsityConfig.family()``) the measured table is keyed by; None: the rule decides."""
    chosen: dict = field(default_factory=dict)
    """dtype -> kernel name, decided on the first call and kept."""
    reasons: dict = field(default_factory=dict)
    """dtype -> why that kernel (the start-up line, :meth:`describe`)."""
    plans: dict = field(default_factory=dict)
    """kernel name -> its plan, made on first use."""

    def prepare(self, device: torch.device, dtype: torch.dtype, configured_dropout_p: float):
        """The chosen kernel's plan for ``dtype``, chosen and built on first use (host work: before torch.compile
        traces a forward, :meth:`model.attention.module.BlockSparseAttention.build_plan` calls this)."""
        name = self.chosen.get(dtype)
        if name is None:  # the configured dropout counts, not whether this call trains: one kernel for both
            name, self.reasons[dtype] = self._choose(device, dtype, float(configured_dropout_p))
            self.chosen[dtype] = name
        if name not in self.plans:
            self.plans[name] = KERNELS[name].make_plan(
                self.layout_HMM, self.block, self.seq_len, self.device, token_mask=self.token_mask
            )
        return self.plans[name]

    def _choose(self, device: torch.device, dtype: torch.dtype, dropout_p: float) -> tuple[str, str]:
        dropout = dropout_p > 0
        capability = device_capability(device)
        deterministic = device.type == "cuda" and torch.are_deterministic_algorithms_enabled()
        hit = None
        if self.density < 1.0 and not deterministic:  # the table was measured with the fused (non-math) backends
            hit = table_choice(capability, self.family, self.seq_len, dtype, dropout_p)
        if hit is not None:
            e = hit.entry
            ratios = ", ".join(f"{k} {r:.2f}x" for k, r in sorted(e["ratios"].items(), key=lambda kv: kv[1]))
            why = (
                f"measured table ({e['gpu']} sm {e['capability'][0]}.{e['capability'][1]}, N={e['n']}, attention "
                f"dropout {entry_dropout(e):g}, {'contiguous q/k/v' if e.get('qkv') == 'contiguous' else 'q/k/v views'}"
                f", report {e['report']} at {e['commit']}: {ratios} of unmasked dense SDPA"
                + ("; flex left out: it has no attention dropout" if dropout_p > 0 and hit.kernel != "flex" else "")
                + ")"
                + (f"; {hit.warning}" if hit.warning else "")
            )
            return hit.kernel, why
        name = choose_kernel(device.type, dtype, self.seq_len, self.density, dropout=dropout, capability=capability)
        if self.density >= 1.0:
            return name, "rule (full layout: nothing to skip)"
        cap = "" if capability is None else f" sm {capability[0]}.{capability[1]}"
        why = f"rule ({device.type}{cap}, density {self.density:.2f}, attention dropout {'on' if dropout else 'off'})"
        return name, why

    def describe(self, dtype: torch.dtype) -> str | None:
        """The start-up line for ``dtype``'s choice (None before one is made)."""
        if dtype not in self.chosen:
            return None
        family = self.family or ("full attention" if self.layout_HMM is None else "this layout (no family)")
        return (
            f"attention kernel auto -> {self.chosen[dtype]} for {family} at N={self.seq_len}, "
            f"{DTYPE_NAMES.get(dtype, dtype)}: {self.reasons[dtype]}"
        )

    def run(self, q_BHND: torch.Tensor, k_BHND: torch.Tensor, v_BHND: torch.Tensor, call: Call) -> torch.Tensor:
        plan = self.prepare(q_BHND.device, q_BHND.dtype, call.configured_dropout_p)
        return plan.run(q_BHND, k_BHND, v_BHND, call)


@register_kernel("auto")
class AutoKernel(Kernel):
    """Picks a kernel once per plan (device, compute capability, dtype, N, layout family, density, configured
    attention dropout) from the measured table or with :func:`choose_kernel` and keeps it: training and evaluation
    run the same kernel (evaluation switching to flex would compile it on every rank mid-run)."""

    def make_plan(self, layout_HMM, block, seq_len, device, token_mask=None, family=None):
        density = 1.0 if layout_HMM is None else float(layout_HMM.float().mean())
        return AutoPlan(layout_HMM, block, seq_len, torch.device(device), density, token_mask, family)


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
