"""Compile the ``triton_block`` programs (``python -m tests.triton_compile CAP DTYPE...``) or the fused residual +
dropout + LayerNorm's (model/fused_norm_tl.py; ``python -m tests.triton_compile --fused-norm CAP DTYPE...``) for
NVIDIA targets without a GPU: what the interpreter cannot check (Triton's GPU lowering) fails here on a CPU machine,
before a GPU run.
Run in its own process: ``TRITON_INTERPRET`` must be unset when Triton is imported (tests/conftest.py sets it)."""

from __future__ import annotations

import os
import sys

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from model.attention.kernels.triton_block import tile_config  # noqa: E402
from model.attention.kernels.triton_block import tl_kernels as K  # noqa: E402

DTYPES = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}
SCALARS = {"qk_scale": "fp32", "sm_scale": "fp32"}
POINTERS = {
    "offsets_ptr": "*i32", "index_ptr": "*i32", "partial_ptr": "*i32", "lay_ptr": "*u8", "kpm_ptr": "*u8",
    "doc_ptr": "*i64", "seed_ptr": "*i64", "lse_ptr": "*fp32", "delta_ptr": "*fp32",
}  # fmt: skip
PROGRAMS = {
    "fwd_kernel": ({}, ("q_ptr", "k_ptr", "v_ptr", "o_ptr")),
    "fwd_kernel mask-free full tiles": ({"HAS_KPM": False, "HAS_DOC": False}, ("q_ptr", "k_ptr", "v_ptr", "o_ptr")),
    "bwd_kernel dK/dV": ({"DQ_PASS": False}, ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dq_ptr", "dk_ptr", "dv_ptr")),
    "bwd_kernel dQ": ({"DQ_PASS": True}, ("q_ptr", "k_ptr", "v_ptr", "do_ptr", "dq_ptr", "dk_ptr", "dv_ptr")),
    "bwd_preprocess": ({}, ("o_ptr", "do_ptr")),
}


def compile_all(capability: int, dtype: str, head_size: int = 64, dropout_p: float = 0.1) -> list[str]:
    """Compile the four programs with every mask on, and the forward without key padding or documents (no per-tile
    padding/document check before its mask-free branch); one line per program (its shared memory)."""
    import torch

    from model.attention.kernels.triton_block.function import dot_precision

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    cfg = tile_config(head_size, torch_dtype)
    consts = dict(
        HEAD_STRIDE=1, HAS_KPM=True, HAS_DOC=True, HAS_BAND=True, DROPOUT_P=dropout_p, D=head_size,
        BLOCK_D=cfg.block_d, BLOCK_M=64, BLOCK_N=64, PRECISION=dot_precision(torch_dtype), LOOP_WHILE=False,
    )  # fmt: skip
    lines = []
    base = consts
    for name, (extra, tensors) in PROGRAMS.items():
        fn = getattr(K, name.split()[0])
        consts = {k: v for k, v in dict(base, **extra).items() if k in fn.arg_names}
        kinds = dict(POINTERS, **SCALARS, **{t: f"*{DTYPES[dtype]}" for t in tensors})
        sig = {a: "constexpr" if a in consts else kinds.get(a, "i32") for a in fn.arg_names}
        src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
        opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        k = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=opts)
        lines.append(f"sm{capability} {dtype} {name}: {k.metadata.shared} bytes of shared memory")
    return lines


def compile_fused_norm(capability: int, dtype: str, width: int = 768, dropout_p: float = 0.1) -> list[str]:
    """Compile the fused norm's forward and backward (dropout on, with a bias) at BERT-base's width, as the layers
    call them: every tensor in ``dtype``, and (bf16/fp16) under autocast, where the sublayer output ``x`` and its
    gradient are ``dtype`` and the residual stream, the sum, the output and the LayerNorm weight fp32
    (model/fused_norm.py ``eager_dtypes``); one line per program."""
    from model import fused_norm
    from model import fused_norm_tl as N

    block, warps = fused_norm._block(width), fused_norm._warps(width)
    variants = {"": dict.fromkeys("xrzyw", dtype)}
    if dtype != "fp32":
        variants[" autocast"] = dict(x=dtype, r="fp32", z="fp32", y="fp32", w="fp32")
    lines = []
    for tag, dt in variants.items():
        ptrs = {
            "fwd_kernel": dict(x_ptr=dt["x"], r_ptr=dt["r"], w_ptr=dt["w"], b_ptr=dt["w"], y_ptr=dt["y"],
                               z_ptr=dt["z"]),
            "bwd_kernel": dict(dy_ptr=dt["y"], z_ptr=dt["z"], w_ptr=dt["w"], dx_ptr=dt["x"], dr_ptr=dt["r"],
                               dw_ptr="fp32", db_ptr="fp32"),
        }  # fmt: skip
        for name, tensors in ptrs.items():
            fn = getattr(N, name)
            base = dict(BLOCK_D=block, DROPOUT_P=dropout_p, HAS_BIAS=True, ROWS=fused_norm.ROWS_PER_PROGRAM)
            consts = {k: v for k, v in base.items() if k in fn.arg_names}
            kinds = dict(mean_ptr="*fp32", rstd_ptr="*fp32", seed_ptr="*i64", eps="fp32", scale="fp32")
            kinds.update({t: f"*{DTYPES[d]}" for t, d in tensors.items()})
            sig = {a: "constexpr" if a in consts else kinds.get(a, "i32") for a in fn.arg_names}
            src = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()})
            k = triton.compile(src, target=GPUTarget("cuda", capability, 32), options=dict(num_warps=warps))
            lines.append(f"sm{capability} {dtype}{tag} fused norm {name}: {k.metadata.shared} bytes of shared memory")
    return lines


if __name__ == "__main__":
    args = sys.argv[1:]
    compile_programs = compile_all
    if args[0] == "--fused-norm":
        compile_programs, args = compile_fused_norm, args[1:]
    cap = int(args[0])
    for dt in args[1:]:
        print("\n".join(compile_programs(cap, dt)), flush=True)
