"""``--measure memory``: the attention's extra activation memory per kernel and layout family, against the layout's
analytic bound (the tables of docs/model.md, "Memory").

Why: a sparse layout is only worth its name if the memory it keeps for the backward scales with the scores it
computes. For every kernel that trains on CPU (``KERNELS``) and every family (one per registered layout mode of
``BLOCK_LAYOUTS``, plus DIET-REL/ABS with padding, packed documents and ModernBERT's local layers) one attention
call runs forward under ``torch.profiler(profile_memory=True)``; its allocation events replayed in time order give

- *retained*: bytes allocated by the forward and still alive at its end, less the output itself: what autograd keeps
  for the backward (saved tensors, gathered copies, masks, biases), whatever way it is held;
- *peak*: the highest running sum during the forward (output and temporaries included).

The *bound* is the layout's scores in the call's dtype: density x B x H x N^2 x itemsize (the tiles the layout
computes; for a token mask, the 16-token blocks it touches). The target is retained <= 1.5 x bound for every family.
*Plan* is the persistent memory of the module: its layout, its fixed token mask and the cached kernel plan.

Small B and H keep it fast on CPU: every quantity scales linearly in B and H (the bound too), so the ratios hold at
any B and H. ``--model-level``: the one-layer model's training forward instead, dense and every layout-only family,
``--emulate-cuda`` on CUDA's branches with CUDA's SDPA contracts (benchmarks/support/cuda_emulation.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.attention.layouts import HEAD_DIM
from benchmarks.attention.steps import DTYPES, cpu_allocations
from benchmarks.report import markdown_table, write_json
from model.attention import BLOCK_LAYOUTS, BlockSparseAttention, SparsityConfig
from model.attention.kernels.block_gather.cpu_split import SWITCH
from model.attention.token_patterns import TokenMaskConfig, build_layer_mask
from model.positions import DietAbsBias, DietRelBias
from model.presets import PRESETS, blockbert, modernbert

HEADS, BATCH = PRESETS["tiny"]["num_attention_heads"], 1
"""The tiny preset's 4 heads of the kernel table's head size (bert-base's 64), one sequence."""
TARGET = 1.5
"""retained / bound must stay at or under this for every family."""

MODE_ARGS: dict[str, dict[str, Any]] = {
    "dense": {},
    "fixed": {"block": 16},  # DeepSpeed's defaults (block 16, 4 local blocks, 1 global)
    "variable": {"block": 64, "num_random_blocks": 1},
    "bigbird": {"block": 64},
    "bslongformer": {"block": 64},
    "local": {"block": 64, "attention": "bidirectional"},
    "dilated_local": {"block": 64},
    "blockbert": {k: v for k, v in blockbert(2, HEADS).items() if k != "mode"},  # heads 3:1, block 16
}
"""Benchmark settings of the registered layout modes; a mode missing here runs at its class defaults."""

EXTRA_FAMILIES: dict[str, dict[str, Any]] = {
    "blockbert_n3": blockbert(3, HEADS),  # heads 2:1:1
    "diet_rel_padded": {**blockbert(2, HEADS), "_bias": "rel"},
    "diet_abs_padded": {**blockbert(2, HEADS), "_bias": "abs"},
    "packed_docs": {"mode": "fixed", "block": 16, "_docs": 4},
    "packed_docs_blockbert": {**blockbert(2, HEADS), "_docs": 4},
    "modernbert_local": {"_token_mask": modernbert(128)["local"]["token_mask"]},
}
"""Families beyond one per mode: the cases the per-call inputs (biases, padding, documents, token masks) make."""

PAD = 37
"""Padded families: the last PAD keys of every row are padding."""


def families() -> dict[str, dict[str, Any]]:
    """Every registered layout mode (its :data:`MODE_ARGS` settings, else its defaults) plus :data:`EXTRA_FAMILIES`:
    the FAMILY of ``--cases FAMILY@N``."""
    out = {m: {"mode": m, **MODE_ARGS.get(m, {})} for m in BLOCK_LAYOUTS}
    out.update(EXTRA_FAMILIES)
    return out


GATHER_ONLY = "block_gather/gather"
"""block_gather with its CPU split plan off (``SPARSEBERT_CPU_SPLIT=0``): the general gather plan, the one every
non-CPU device runs."""


def build(spec: dict[str, Any], n: int, kernel: str) -> tuple[BlockSparseAttention, Callable]:
    """The module and a function ``(q, k, v) -> out`` that passes the family's per-call inputs (plans built)."""
    cfg: SparsityConfig | None = None
    kw = {k: v for k, v in spec.items() if not k.startswith("_") and k != "mode"}
    if "mode" in spec:
        cfg = BLOCK_LAYOUTS[spec["mode"]](num_heads=HEADS, **kw)
    tm = None
    if "_token_mask" in spec:
        tm = build_layer_mask(TokenMaskConfig.from_dict(spec["_token_mask"]), HEADS, n, 1)
    mod = BlockSparseAttention(cfg, kernel.split("/")[0], n, fixed_token_mask=tm)
    old = os.environ.get(SWITCH)
    os.environ[SWITCH] = "0" if kernel == GATHER_ONLY else "1"
    try:
        mod.build_plan(n, torch.device("cpu"))
    finally:
        os.environ.pop(SWITCH) if old is None else os.environ.__setitem__(SWITCH, old)
    g = torch.Generator().manual_seed(0)
    call: dict[str, Any] = {}
    if "_bias" in spec:
        kpm = torch.ones(BATCH, n, dtype=torch.bool)
        kpm[:, n - PAD :] = False
        call["key_padding_mask_BN"] = kpm
        if spec["_bias"] == "rel":
            table = torch.randn(HEADS, 2 * 128 + 1, generator=g).requires_grad_()
            call["score_bias"] = DietRelBias(table)
        else:
            pq, pk = (torch.randn(HEADS, n, 128, generator=g).requires_grad_() for _ in range(2))
            call["score_bias"] = DietAbsBias(pq, pk)
    if "_docs" in spec:
        call["doc_ids_BN"] = (torch.arange(n) * spec["_docs"] // n).expand(BATCH, n).contiguous()
    return mod, lambda q, k, v: mod(q, k, v, **call)


def tensor_bytes(obj: Any, seen: set | None = None) -> int:
    """Bytes of the distinct tensor storages reachable from ``obj`` (dataclasses, lists, tuples, dicts)."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        st = obj.untyped_storage()
        if st.data_ptr() in seen or st.nbytes() == 0:
            return 0
        seen.add(st.data_ptr())
        return st.nbytes()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(tensor_bytes(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(x, seen) for x in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(x, seen) for x in obj.values())
    if hasattr(obj, "__dict__") and not isinstance(obj, type) and type(obj).__module__.startswith("model."):
        return sum(tensor_bytes(x, seen) for x in vars(obj).values())
    return 0


def measure(name: str, spec: dict[str, Any], kernel: str, n: int, dtype: torch.dtype) -> dict[str, Any]:
    """One family's row: retained and peak bytes of one forward against the layout's bound, and the plan's bytes."""
    mod, fn = build(spec, n, kernel)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(BATCH, HEADS, n, HEAD_DIM, generator=g).to(dtype).requires_grad_() for _ in range(3))
    fn(q, k, v).sum().backward()  # plans and first-call caches exist before the measured call
    retained, peak, out = cpu_allocations(lambda: fn(q, k, v))
    retained -= out.untyped_storage().nbytes()
    out.sum().backward()  # the graph is used, so nothing it holds was optimised away
    item = torch.empty((), dtype=dtype).element_size()
    layout = mod.layout_for(n)
    density = 1.0 if layout is None else float(layout.float().mean())
    bound = density * BATCH * HEADS * n * n * item
    plan = tensor_bytes(mod._plans) + tensor_bytes([mod.master_layout, mod.fixed_token_mask])
    row = dict(
        family=name,
        kernel=kernel,
        n=n,
        density=density,
        retained_mib=retained / 2**20,
        peak_mib=peak / 2**20,
        bound_mib=bound / 2**20,
        plan_mib=plan / 2**20,
        ratio=retained / bound,
        peak_ratio=peak / bound,
    )
    row["meets"] = row["ratio"] <= TARGET
    return row


MODEL = dict(
    preset="tiny",
    heads=HEADS,
    head_size=32,
    batch=2,
    seq_len=768,
    intermediate=PRESETS["tiny"]["intermediate_size"],
    vocab=128,
)
"""The one-layer model of the model-level rows (``--model-level``) and of tests/test_saved_activations.py: the tiny
preset at one layer, head size 32 and a length every layout-only family divides (48 for BlockBERT n=3, 64 for the
block-64 families)."""


def model_families() -> dict[str, dict[str, Any]]:
    """The families that are a layout only (no per-call bias, documents or token mask): the model-level rows."""
    return {n: s for n, s in families().items() if "mode" in s and not any(k.startswith("_") for k in s)}


def _model(spec: dict | None, kernel: str):
    from model.bert import BertForPreTraining
    from model.config import ModelConfig

    m = MODEL
    torch.manual_seed(0)
    cfg = ModelConfig.preset(
        m["preset"],
        vocab_size=m["vocab"],
        hidden_size=m["heads"] * m["head_size"],
        num_attention_heads=m["heads"],
        num_layers=1,
        intermediate_size=m["intermediate"],
        max_position_embeddings=m["seq_len"],
        attention={"kernel": kernel} | ({} if spec is None else {"sparsity": dict(spec)}),
    )
    return BertForPreTraining(cfg)


def model_retained(spec: dict | None, kernel: str, emulate_cuda: bool = True) -> tuple[int, dict]:
    """Bytes one training forward of the :data:`MODEL` encoder (embeddings, one layer, MLM head) leaves allocated
    (what the backward keeps; the loss excluded), and the SDPA backends it ran. ``emulate_cuda``: on CUDA's branches
    with CUDA's SDPA contracts (benchmarks/support/cuda_emulation.py: the fused backends keep q, k, v, mask, output and
    logsumexp,
    no scores), so the bytes are the GPU's. No attention mask: the trainer drops an all-ones mask on the host."""
    import contextlib

    from benchmarks.support.cuda_emulation import H100
    from benchmarks.support.cuda_emulation import emulate_cuda as emulation

    model = _model(spec, kernel)
    m = MODEL
    ids = torch.randint(5, m["vocab"], (m["batch"], m["seq_len"]), generator=torch.Generator().manual_seed(1))
    backends: dict = {}
    with emulation(H100) if emulate_cuda else contextlib.nullcontext() as em:
        model(input_ids=ids, labels=ids).loss.backward()  # plans and first-call caches
        model.zero_grad(set_to_none=True)
        if em is not None:
            em.backends.clear()
        retained, _, loss = cpu_allocations(lambda: model(input_ids=ids, labels=ids).loss)
        loss.backward()  # the graph is used: nothing it holds was optimised away
        if em is not None:
            backends = dict(em.backends)
    return retained - loss.untyped_storage().nbytes(), backends


def model_rows(kernels: list[str], emulate: bool) -> list[dict]:
    """Model-level rows: dense, then every layout-only family on each kernel, with the ratio to dense."""
    dense, backends = model_retained(None, "dense", emulate)
    rows = [dict(family="full", kernel="dense", retained_mib=dense / 2**20, ratio=1.0, backends=backends)]
    for name, spec in model_families().items():
        for kernel in kernels:
            got, backends = model_retained(spec, kernel.split("/")[0], emulate)
            rows.append(
                dict(family=name, kernel=kernel, retained_mib=got / 2**20, ratio=got / dense, backends=backends)
            )
    return rows


def _backends(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"


def model_table(rows: list[dict], machine: str, emulate: bool) -> str:
    m = MODEL
    head = (
        f"Measured {machine}{', CUDA emulated (H100 rules)' if emulate else ''}. One-layer encoder, B={m['batch']}, "
        f"N={m['seq_len']}, {m['heads']} heads x {m['head_size']}, fp32, training forward: MiB left allocated for the "
        "backward (model level), ratio to dense."
    )
    columns = [
        ("family", "family"),
        ("kernel", "kernel"),
        ("retained_mib", "retained MiB", ".3f"),
        ("ratio", "ratio to dense", lambda v: f"**{v:.3f}**"),
        ("backends", "SDPA backends", _backends),
    ]
    return "\n".join([head, "", *markdown_table(rows, columns)])


def table(rows: list[dict], machine: str) -> str:
    head = (
        f"Measured {machine}. B={BATCH}, {HEADS} heads x {HEAD_DIM}, fp32; MiB; ratio = retained / bound "
        f"(target <= {TARGET})."
    )
    columns = [
        ("family", "family"),
        ("kernel", "kernel"),
        ("n", "N"),
        ("density", "density", ".3f"),
        ("bound_mib", "bound", ".1f"),
        ("retained_mib", "retained", ".1f"),
        ("ratio", "ratio", lambda v: f"**{v:.2f}**"),
        ("peak_mib", "forward peak", ".1f"),
        ("peak_ratio", "peak ratio", ".2f"),
        ("plan_mib", "plan", ".1f"),
    ]
    return "\n".join([head, "", *markdown_table(rows, columns)])


DOC_BEGIN = "<!-- attention_memory table begin -->"
DOC_END = "<!-- attention_memory table end -->"
MODEL_DOC_BEGIN = "<!-- attention_memory model table begin -->"
MODEL_DOC_END = "<!-- attention_memory model table end -->"
DOC_WHAT = "the Markdown page that holds the table (docs/model.md)"


def write_doc(path: Path, text: str, begin: str = DOC_BEGIN, end: str = DOC_END) -> None:
    """Replace the table between the markers in docs/model.md."""
    from common.errors import UserError
    from common.inputs import read_text

    doc = read_text(path, "--write-doc", DOC_WHAT)
    if begin not in doc or end not in doc:
        raise UserError(f"--write-doc {path}: markers {begin!r} / {end!r} not found; add them where the table goes")
    new = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: f"{begin}\n{text}\n{end}", doc, flags=re.S)
    path.write_text(new)


def family_rows(args: argparse.Namespace) -> list[dict]:
    """The per-call rows: every ``--cases FAMILY@N`` x kernel."""
    fams = families()
    rows = []
    for name, n in args.cases:
        for kernel in args.kernels:
            row = measure(name, fams[name], kernel, n, DTYPES[args.dtype])
            rows.append(row)
            print(
                f"N={n:5d} {name:22s} {kernel:12s} density {row['density']:.3f} bound {row['bound_mib']:8.1f} "
                f"retained {row['retained_mib']:8.1f} ({row['ratio']:.2f}x) peak {row['peak_mib']:8.1f} "
                f"({row['peak_ratio']:.2f}x) plan {row['plan_mib']:7.1f} MiB{'' if row['meets'] else '  OVER'}",
                flush=True,
            )
    return rows


def command(args: argparse.Namespace) -> int:
    """``--measure memory``: the family rows (or ``--model-level`` rows), their JSON and table, ``--write-doc``."""
    from common.errors import write_errors
    from common.inputs import read_text
    from common.outputs import check_dir_writable, check_file_writable

    check_dir_writable(args.out_dir, "--out-dir")  # before the measurements
    if args.write_doc:
        read_text(args.write_doc, "--write-doc", DOC_WHAT)
        check_file_writable(args.write_doc, "--write-doc")
    torch.manual_seed(0)
    machine = f"{args.machine}, {datetime.date.today().isoformat()}"
    meta = dict(machine=args.machine, date=datetime.date.today().isoformat(), dtype=args.dtype)
    if args.model_level:
        rows = model_rows(args.kernels, args.emulate_cuda)
        write_json(args.out_dir / "attention_memory_model.json", dict(meta=meta, model=MODEL, rows=rows), "--out-dir")
        text, markers = model_table(rows, machine, args.emulate_cuda), (MODEL_DOC_BEGIN, MODEL_DOC_END)
    else:
        rows = family_rows(args)
        write_json(args.out_dir / "attention_memory.json", dict(meta=meta, rows=rows), "--out-dir")
        text, markers = table(rows, machine), (DOC_BEGIN, DOC_END)
    print(text)
    if args.write_doc:
        with write_errors(f"--write-doc {args.write_doc}", args.write_doc):
            write_doc(args.write_doc, text, *markers)
    over = [f"{r['family']}/{r['kernel']}/N={r['n']}" for r in rows if not r.get("meets", True)]
    if over:
        print(f"over the target ({TARGET} x bound): {', '.join(over)}")
    return 0
