"""Every kernel and every layout family through the branches CUDA takes, against ``dense``.

On CPU (no GPU in CI) the tests run under :func:`tests.cuda_contracts.emulate_cuda`: CPU tensors take the kernels'
CUDA branches and SDPA keeps each CUDA backend's contract (output strides, refusals, mask preprocessing). On a CUDA
machine the same tests run on the GPU with torch's real backends (`devtools.gpu_check --quick` runs this file), and
the tests that check the emulation's rules against torch's own choice (``torch._fused_sdp_choice``) and real output
strides run there only. Cases: padding, DIET biases, packed documents, per-call and fixed token masks, dropout,
forward and backward; model level: one training step of every preset family, fp32 and bf16.
"""

from __future__ import annotations

import contextlib
import functools
import json

import pytest
import torch
import torch._dynamo
from torch.nn.attention import SDPBackend, sdpa_kernel

from model import attention as A
from model.attention.kernels import KERNELS
from model.positions import DietRelBias
from tests import cuda_contracts as C
from tests.registry_cases import LAYOUT_EXAMPLES, REFERENCE

ON_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
H, D, B, N = 4, 16, 2, 128
FAMILIES = {"full": lambda: None} | {name: (lambda make=make: make(H)) for name, make in LAYOUT_EXAMPLES.items()}
"""Full attention plus one example of every registered layout mode (tests/registry_cases.py checks coverage)."""
KERNEL_NAMES = sorted(k for k in KERNELS if k != REFERENCE and (ON_CUDA or (k != "flex" and KERNELS[k].runs_on_cpu)))
"""Every kernel but the reference. ``flex`` runs Triton on CUDA, not SDPA: on CPU it runs eagerly, with nothing of
CUDA's to emulate (its CPU parity is tests/test_attention.py's), so only a GPU runs it here; so do the GPU-only
kernels (``runs_on_cpu`` False: ``triton_block``, Triton programs with no SDPA call to emulate; interpreted on CPU by
tests/test_triton_block.py)."""
CASES = ("plain", "padded", "packed", "diet", "token_mask", "fixed_mask")
DTYPES = (torch.float32, torch.bfloat16)
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=6e-2, rtol=6e-2)}
SDP_BACKEND = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


@pytest.fixture(autouse=True)
def _fail_on_recompile_limit(fail_on_recompile_limit):
    """Every test of this module runs with ``fail_on_recompile_limit`` (tests/conftest.py)."""


def _skip_bf16(dtype: torch.dtype) -> None:
    if ON_CUDA and dtype == torch.bfloat16 and torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("bf16 needs compute capability 8.0+")


@contextlib.contextmanager
def cuda_paths(gpu: C.EmulatedGPU = C.H100):
    """The CUDA branches: the real GPU where there is one, else the emulation (yields None on a GPU)."""
    if ON_CUDA:
        yield None
    else:
        with C.emulate_cuda(gpu) as emulation:
            yield emulation


def _trains(kernel: str) -> bool:
    return ON_CUDA or KERNELS[kernel].trains_on_cpu


def _case(case: str, seed: int = 0) -> tuple[list[torch.Tensor], dict, torch.Tensor | None, list[torch.Tensor]]:
    """q/k/v (fp32 leaves), the module call's keyword arguments, a fixed token mask, and extra leaves (DIET)."""
    g = torch.Generator().manual_seed(seed)
    qkv = [torch.randn(B, H, N, D, generator=g).to(DEVICE) for _ in range(3)]
    kw: dict = {}
    fixed = None
    leaves: list[torch.Tensor] = []
    if case != "plain":
        kpm = torch.ones(B, N, dtype=torch.bool)
        kpm[0, N - 37 :] = False  # ragged, not block aligned
        kpm[1, :20] = False  # leading keys: causal/local rows left with no key -> zeros
        kw["key_padding_mask_BN"] = kpm.to(DEVICE)
    if case == "packed":
        doc = torch.zeros(B, N, dtype=torch.long)
        doc[0, 50:] = 1
        doc[1, 30:70] = 1
        doc[1, 70:] = 2
        kw["doc_ids_BN"] = doc.to(DEVICE)
    if case == "diet":  # a learned relative-position table: the bias requires grad (cuDNN refuses such a mask)
        table = (torch.randn(H, 2 * 8 + 1, generator=g) * 2).to(DEVICE)
        leaves.append(table)
        kw["score_bias"] = table
    if case == "token_mask":
        tm = torch.rand(H, N, N, generator=g) > 0.3
        tm[0, 5] = False  # a row with nothing left
        kw["token_mask"] = tm.to(DEVICE)
    if case == "fixed_mask":
        fixed = torch.rand(H, N, N, generator=g) > 0.4
        fixed[:, torch.arange(N), torch.arange(N)] = True
    return qkv, kw, fixed, leaves


def _run(kernel, family, case, dtype, grad: bool, dropout_p: float = 0.0, seed: int = 0):
    """Output and the gradients of q, k, v (and of the DIET table) for one kernel."""
    qkv, kw, fixed, leaves = _case(case, seed)
    inputs = [t.to(dtype).requires_grad_(grad) for t in qkv + leaves]
    cfg = FAMILIES[family]()
    if cfg is None and fixed is not None:
        cfg = A.DenseSparsityConfig(H, block=16)
    mod = A.BlockSparseAttention(cfg, kernel=kernel, max_seq_length=N, dropout_p=dropout_p, fixed_token_mask=fixed)
    mod.to(DEVICE).train(dropout_p > 0)
    if case == "diet":
        kw = dict(kw, score_bias=DietRelBias(inputs[3]))
    ctx = contextlib.nullcontext() if grad else torch.no_grad()
    with ctx:
        out = mod(*inputs[:3], **kw)
    if not grad:
        return out, []
    go = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(DEVICE, dtype)
    return out, list(torch.autograd.grad(out, inputs, go))


@functools.lru_cache(maxsize=None)
def _reference(family, case, grad: bool):
    """``dense`` in fp32 with SDPA's math backend, outside any emulation (cached: every kernel and dtype compares
    with the same one)."""
    with sdpa_kernel([SDPBackend.MATH]):
        return _run(REFERENCE, family, case, torch.float32, grad)


def _compare(got, ref, dtype, what: str) -> None:
    out, grads = got
    rout, rgrads = ref
    torch.testing.assert_close(out.float(), rout, **TOL[dtype], msg=lambda m: f"{what} output: {m}")
    for i, (g, r) in enumerate(zip(grads, rgrads)):
        scale = max(1.0, float(r.abs().max()))  # a DIET table gathers many scores' grads: compare relative to it
        torch.testing.assert_close(
            g.float() / scale, r / scale, **TOL[dtype], msg=lambda m, i=i: f"{what} grad {i}: {m}"
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("kernel", KERNEL_NAMES)
def test_kernel_matches_dense_on_cuda_paths(kernel, family, case, dtype):
    """Forward and backward on CUDA's branches, under torch's backend priority (no backend forced)."""
    _skip_bf16(dtype)
    grad = _trains(kernel)
    ref = _reference(family, case, grad)
    with cuda_paths(C.A100) as emulation:  # A100: flash without a mask, memory-efficient with one
        got = _run(kernel, family, case, dtype, grad)
    _compare(got, ref, dtype, f"{kernel}/{family}/{case}")
    if emulation is not None and dtype == torch.float32 and emulation.backends:
        # fp32: flash and cuDNN refuse it, memory-efficient takes every call (masked or not)
        assert set(emulation.backends) == {"efficient"}, emulation.backends


@pytest.mark.parametrize("case", ["padded", "diet"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_block_gather_bf16_on_h100_rules(family, case):
    """bf16 under H100's priority (cuDNN first): masks go to cuDNN, a learned DIET bias to memory-efficient."""
    if ON_CUDA:
        pytest.skip("emulation-only: a GPU runs its own priority in the other tests")
    ref = _reference(family, case, True)
    with C.emulate_cuda(C.H100) as emulation:
        got = _run("block_gather", family, case, torch.bfloat16, True)
    _compare(got, ref, torch.bfloat16, f"H100/{family}/{case}")
    assert set(emulation.backends) <= ({"cudnn", "flash"} if case == "padded" else {"efficient", "flash"})


@pytest.mark.parametrize("backend", list(SDP_BACKEND))
@pytest.mark.parametrize("case", ["plain", "padded", "diet"])
@pytest.mark.parametrize("family", ["full", "blockbert_n2", "fixed", "bigbird", "blockbert_n3"])
def test_forced_backend(backend, family, case):
    """One backend forced with ``sdpa_kernel`` (as on a GPU): block_gather matches dense, or torch refuses with
    "No available kernel" where the backend's rules refuse (flash: any mask; cuDNN: a learned DIET bias); the
    memory-efficient and math backends take every case."""
    dtype = torch.bfloat16
    _skip_bf16(dtype)
    ref = _reference(family, case, True)
    try:
        with cuda_paths(), sdpa_kernel([SDP_BACKEND[backend]]):
            got = _run("block_gather", family, case, dtype, True)
    except RuntimeError as e:
        if "No available kernel" not in str(e):
            raise
        needs_mask = case != "plain" or family == "blockbert_n3"  # n=3 pads 128 to 144: a padding mask
        refused = (backend == "flash" and needs_mask) or (backend == "cudnn" and case == "diet")
        if ON_CUDA and backend == "cudnn" and not refused:
            pytest.skip(f"this GPU's build refuses cuDNN attention here: {e}")
        assert refused, f"{backend} refused {family}/{case}: {e}"
        return
    _compare(got, ref, dtype, f"{backend}/{family}/{case}")


@pytest.mark.parametrize("gpu", list(C.GPUS))
def test_fp32_efficient_output_views(gpu):
    """fp32 on every GPU generation and fp16 below sm80 reach the memory-efficient backend, whose output is a
    transposed view: BlockBERT's permutation plan (one fused call, output reshaped to [B, H, N, D]) and the gather
    plan must both cope. Also checks the rule the crash came from: the view is not viewable as [B, H, N, D]."""
    if ON_CUDA:
        pytest.skip("emulation-only: the real backends run in the other tests")
    dtype = torch.float16 if gpu == "V100" else torch.float32
    for family in ("blockbert_n2", "fixed"):
        with C.emulate_cuda(C.GPUS[gpu]) as emulation:
            out, _ = _run("block_gather", family, "padded", dtype, grad=False)
        assert set(emulation.backends) == {"efficient"}, emulation.backends
        assert torch.isfinite(out).all()
    q = torch.randn(2, 8, 64, 16, dtype=dtype)
    with C.emulate_cuda(C.GPUS[gpu]):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(64, 64, dtype=torch.bool))
    assert out.stride() == (64 * 8 * 16, 16, 8 * 16, 1)  # [B, T, G, D] memory seen as [B, G, T, D]
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        out.view(2, 4, 128, 16)


def test_emulated_backend_priority():
    """The emulation's choice for the inputs our kernels produce, per GPU (torch's rules, module docstring of
    tests/cuda_contracts.py). On a GPU, :func:`test_backend_choice_matches_torch` checks these against torch."""
    if ON_CUDA:
        pytest.skip("emulation-only")
    q16 = torch.randn(2, 4, 64, 16, dtype=torch.bfloat16)
    q32 = q16.float()
    mask = torch.ones(2, 1, 1, 64, dtype=torch.bool)
    learned = torch.zeros(1, 4, 64, 64, dtype=torch.bfloat16, requires_grad=True)
    pick = C.predicted_backend
    assert pick(q16, q16, q16, None, 0.0, C.H100) == "cudnn"
    assert pick(q16, q16, q16, None, 0.0, C.A100) == "flash"
    assert pick(q16, q16, q16, mask, 0.0, C.A100) == "efficient"
    assert pick(q16, q16, q16, mask, 0.0, C.H100) == "cudnn"
    assert pick(q16, q16, q16, learned, 0.0, C.H100) == "efficient"  # cuDNN refuses a mask that requires grad
    assert pick(q16, q16, q16, mask, 0.1, C.H100) == "cudnn"  # any dropout (torch 2.11 on an H200, 2026-11-27)
    for gpu in C.GPUS.values():
        assert pick(q32, q32, q32, None, 0.0, gpu) == "efficient"
    assert pick(q16, q16, q16, None, 0.0, C.V100) == "math"  # no bf16 below sm80 but math
    q12 = torch.randn(2, 4, 64, 12, dtype=torch.bfloat16)
    assert pick(q12, q12, q12, mask, 0.0, C.A100) == "math"  # head dim 12: not a multiple of 8
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        with pytest.raises(RuntimeError, match="No available kernel"):
            pick(q32, q32, q32, None, 0.0, C.A100)  # flash refuses fp32, as torch does
        with pytest.raises(RuntimeError, match="No available kernel"):
            pick(q16, q16, q16, mask, 0.0, C.A100)  # and any attn_mask
    torch.use_deterministic_algorithms(True)
    try:
        assert pick(q16, q16, q16, None, 0.0, C.H100) == "flash"  # cuDNN is not deterministic
        with C.emulate_cuda(C.H100) as emulation:  # our --deterministic path forces math on CUDA
            _run("block_gather", "fixed", "padded", torch.float32, grad=False)
        assert set(emulation.backends) == {"math"}, emulation.backends
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("gpu", ["H100", "A100", "V100"])
def test_default_recipes_dense_attention_backend_is_said_with_its_reason(gpu, monkeypatch):
    """The paper recipes' dense attention (bert-base, N=512, attention dropout 0.1, padded rows masked): cuDNN on an
    H100 (sm90 prefers it; it takes the mask and the dropout: measured with torch 2.11 on an H200, 2026-11-27), the
    memory-efficient backend for padded batches on an A100 (flash takes no mask) and everything on a V100 (no flash
    below sm80). The trainer's start-up line says which backend runs and why (on a GPU torch's own choice; the rules
    are model/attention/sdpa_backend.py's, checked against torch by test_backend_choice_matches_torch)."""
    from data_pipeline.samples import PACKED
    from model.attention import sdpa_backend
    from model.config import ModelConfig
    from pretrain.args import parse_args
    from pretrain.parts import attention_backend_lines

    if ON_CUDA:
        pytest.skip("emulation-only")
    profile = C.GPUS[gpu]
    run = parse_args(["--data-path", "wiki", "--train-iters", "1", "--micro-batch-size", "32", "--seq-length", "512"])
    assert run.data.seq_length == 512 and run.data.sample_mode != PACKED and not run.system.deterministic
    precision = "bf16" if profile.capability >= (8, 0) else "fp16"
    monkeypatch.setattr(sdpa_backend, "gpu_of_this_machine", lambda: profile)
    printed = attention_backend_lines(ModelConfig.preset("bert-base"), run, precision, torch.device("cuda"), 32)
    expected = {
        "H100": "padded batches -> cudnn, unpadded -> cudnn",
        "A100": "padded batches -> efficient (flash: flash takes no attn_mask), unpadded -> flash",
        "V100": "padded batches -> efficient (flash: flash takes no attn_mask), "
        "unpadded -> efficient (flash: flash needs sm80..sm121, this is sm70)",
    }[gpu]
    assert printed == [f"attention on {gpu}: SDPA {expected} (dense attention, dropout 0.1; docs/training.md)"]


def test_efficient_mask_alignment():
    """transformers/attention.cpp preprocess_mask: a mask whose last dim is not a multiple of 8 is copied into a
    padded buffer, so the kernel's stride checks hold; an aligned broadcast mask is only expanded (no copy)."""
    if ON_CUDA:
        pytest.skip("emulation-only")
    q = torch.randn(2, 4, 20, 16)
    k = torch.randn(2, 4, 36, 16)
    odd = torch.zeros(2, 1, 20, 36)
    m = C.efficient_mask(odd, q, k, C.A100)
    assert m.shape == (2, 4, 20, 36) and m.stride()[2] == 40 and m.stride()[1] == 0
    aligned = torch.zeros(2, 1, 1, 64)
    k64 = torch.randn(2, 4, 64, 16)
    m = C.efficient_mask(aligned, q, k64, C.A100)
    assert m.data_ptr() == aligned.data_ptr()  # expanded in place: no copy


@pytest.mark.parametrize(
    "kernel,family", [("block_gather", "blockbert_n2"), ("block_gather", "fixed"), (REFERENCE, "full")]
)
def test_dropout_statistics(kernel, family):
    """Attention dropout on CUDA's branches (BlockBERT's permutation plan, the gather plan, dense): outputs differ
    from the dropout-free ones, their mean over many draws matches them (dropout is unbiased), and gradients reach
    q/k/v. CUDA's dropout RNG (Philox inside the kernels) is not CPU's, so the comparison is statistical."""
    p, draws = 0.25, 64
    ref, _ = _reference(family, "padded", False)
    qkv, kw, _, _ = _case("padded")
    mod = A.BlockSparseAttention(FAMILIES[family](), kernel=kernel, max_seq_length=N, dropout_p=p).to(DEVICE)
    with cuda_paths():
        torch.manual_seed(0)
        with torch.no_grad():
            outs = torch.stack([mod(*qkv, **kw) for _ in range(draws)])
        leaves = [t.clone().requires_grad_() for t in qkv]
        grads = torch.autograd.grad(mod(*leaves, **kw).square().sum(), leaves)
    assert (outs[0] - ref).abs().max() > 0.05  # dropout happened
    err = (outs.mean(0) - ref).abs()
    assert float(err.mean()) < 0.03, float(err.mean())
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


# -- model level: one training step of every preset family ------------------------------------------------------------


def _family_key(preset: dict) -> str:
    """What makes two presets the same family for the kernels: the attention settings minus sizes (BlockBERT's
    block count counts, ModernBERT's window width does not), the position type, the layer cadence."""
    att = preset.get("attention") or {}
    sparsity = att.get("sparsity") or {}
    local = ((att.get("local") or {}).get("token_mask") or {}).get("pattern")
    pos = (preset.get("position") or {}).get("type", "absolute")
    return json.dumps([sparsity.get("mode"), sparsity.get("num_blocks"), local, att.get("global_every"), pos])


def _preset_families() -> dict[str, str]:
    """family key -> its smallest preset (derived from model/config.py PRESETS)."""
    from model.presets import PRESETS

    out: dict[str, str] = {}
    size = {name: p.get("hidden_size", 768) * p.get("num_layers", 12) for name, p in PRESETS.items()}
    for name in sorted(PRESETS, key=lambda n: (size[n], n)):
        out.setdefault(_family_key(PRESETS[name]), name)
    return out


PRESET_FAMILIES = sorted(_preset_families().values())


def _tiny(preset: str):
    from model.config import ModelConfig
    from model.presets import PRESETS

    heads = PRESETS[preset].get("num_attention_heads", 12)  # BlockBERT's head assignment fixes the head count
    every = (PRESETS[preset].get("attention") or {}).get("global_every") or 1
    return ModelConfig.preset(
        preset,
        vocab_size=128,
        hidden_size=8 * heads,
        num_layers=max(2, every + 1),  # a global and a local layer under a cadence
        intermediate_size=64,
        max_position_embeddings=64,
    )


def _batch(kind: str):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(5, 128, (2, 64), generator=g)
    mask = torch.ones(2, 64, dtype=torch.long)
    mask[1, 41:] = 0
    labels = torch.full((2, 64), -100)
    labels[:, ::7] = ids[:, ::7]
    batch = dict(input_ids=ids, attention_mask=mask, labels=labels)
    if kind == "packed":
        doc = torch.zeros(2, 64, dtype=torch.long)
        doc[0, 30:] = 1
        doc[1, 17:] = 1
        batch["doc_ids"] = doc
    return {k: v.to(DEVICE) for k, v in batch.items()}


def _train_step(preset: str, kind: str, dtype: torch.dtype):
    from model.bert import BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(_tiny(preset)).to(DEVICE, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-2)  # large enough to move bf16 weights near 1.0
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(**_batch(kind)).loss
    loss.backward()
    grads_finite = all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    opt.step()
    moved = sum(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
    return float(loss), grads_finite, moved, len(before)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("kind", ["padded", "packed"])
@pytest.mark.parametrize("preset", PRESET_FAMILIES)
def test_preset_family_trains_one_step(preset, kind, dtype):
    """Forward, backward and an AdamW step of a tiny model of every preset family on CUDA's branches: the loss
    matches the one computed on CPU's own branches (fp32: closely; bf16: loosely), every gradient is finite and
    every parameter moves."""
    _skip_bf16(dtype)
    from model.presets import PRESETS

    if kind == "packed" and (PRESETS[preset].get("position") or {}).get("type", "").startswith("diet"):
        with pytest.raises(ValueError, match="packed sequences"):  # DIET's positions do not restart per document
            _train_step(preset, kind, dtype)
        return
    with cuda_paths():
        loss, finite, moved, total = _train_step(preset, kind, dtype)
    assert finite and moved == total, (finite, moved, total)
    if not ON_CUDA:
        ref, _, _, _ = _train_step(preset, kind, dtype)  # CPU's own branches and SDPA
        assert abs(loss - ref) < (1e-4 if dtype == torch.float32 else 0.05) * max(1.0, abs(ref)), (loss, ref)


def test_preset_families_are_derived():
    """The family list comes from the presets: BERT, BlockBERT n=2 and n=3, ModernBERT at least."""
    keys = [json.loads(k) for k in _preset_families()]
    assert {k[0] for k in keys} >= {None, "blockbert"}
    assert {k[1] for k in keys if k[0] == "blockbert"} >= {2, 3}
    assert any(k[2] == "sliding_window" for k in keys)


# -- on a GPU only: the emulation's rules against torch's ------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(not ON_CUDA, reason="compares the emulated rules with torch's on a real GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mask", ["none", "bool", "learned"])
@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["nodrop", "drop0.1"])
def test_backend_choice_matches_torch(dtype, mask, dropout):
    """``torch._fused_sdp_choice`` (the backend SDPA would run) equals :func:`tests.cuda_contracts.predicted_backend`
    for tile-shaped inputs like the kernels'."""
    _skip_bf16(dtype)
    q = torch.randn(2, 8, 64, 16, device="cuda", dtype=dtype, requires_grad=True)
    m = None
    if mask == "bool":
        m = torch.ones(2, 1, 1, 64, dtype=torch.bool, device="cuda")
    elif mask == "learned":
        m = torch.zeros(1, 8, 64, 64, device="cuda", dtype=dtype, requires_grad=True)
    from model.attention.sdpa_backend import torch_choice

    got = torch_choice(q, m, dropout)
    assert got == C.predicted_backend(q, q, q, m, dropout, C.gpu_of_this_machine())


@pytest.mark.gpu
@pytest.mark.skipif(not ON_CUDA, reason="real output strides need a GPU")
@pytest.mark.parametrize("backend", list(SDP_BACKEND))
def test_output_strides_match_emulation(backend):
    """Each backend's real output strides are the emulated ones (flash/cuDNN: the query's layout; memory-efficient:
    a transposed view; math: contiguous), for a contiguous and a head-interleaved query."""
    dtype = torch.float32 if backend in ("efficient", "math") else torch.bfloat16
    _skip_bf16(dtype)
    base = torch.randn(2, 64, 3, 8, 16, device="cuda", dtype=dtype)
    for q in (base[:, :, 0].transpose(1, 2), base[:, :, 0].transpose(1, 2).contiguous()):
        try:
            with sdpa_kernel([SDP_BACKEND[backend]]):
                real = torch.nn.functional.scaled_dot_product_attention(q, q, q)
        except RuntimeError as e:
            pytest.skip(f"{backend} not available here: {e}")
        emulated = C.Emulation(C.gpu_of_this_machine())
        with sdpa_kernel([SDP_BACKEND[backend]]):
            fake = emulated.sdpa(q.cpu(), q.cpu(), q.cpu())
        assert real.stride() == fake.stride(), (backend, real.stride(), fake.stride())


# -- FlexAttention's compiled path ---------------------------------------------------------------------------------


def test_flex_compiles_per_bucket_without_hitting_the_recompile_limit(monkeypatch):
    """More shapes than Dynamo's recompile limit (lowered to 2 here; 8 by default) through flex's compiled path
    raise nothing with ``fail_on_recompile_limit_hit`` on: each shape bucket has its own code object. One shared
    compiled callable (the old design) hits the limit, where Dynamo would otherwise fall back to eager, unfused
    FlexAttention silently. Dynamo's "eager" backend stands in for Inductor on CPU: the recompile accounting is
    Dynamo's either way."""
    import torch._dynamo

    from model.attention.kernels import flex

    monkeypatch.setattr(flex, "COMPILE_BACKEND", "eager")
    monkeypatch.setattr(flex, "_compiled_flex", {})
    lengths = (16, 32, 48, 64)
    with torch._dynamo.config.patch(recompile_limit=2), torch.no_grad():  # never monkeypatch: see conftest.py
        for n in lengths:
            q = torch.randn(1, 2, n, 8)
            bucket = (n,)
            out = flex._flex_fn("cuda", bucket)(q, q, q, None, None, None)
            assert out.shape == q.shape
        assert len(flex._compiled_flex) == len(lengths)
        shared = torch.compile(flex._flex_call, dynamic=False, backend="eager")
        with pytest.raises(Exception, match="fail_on_recompile_limit_hit"):
            for n in lengths:
                q = torch.randn(1, 2, n, 8)
                shared(q, q, q, None, None, None)


def test_flex_buckets_separate_what_recompiles():
    """The bucket key changes with what makes Dynamo recompile (shape, dtype, grad mode, masks and bias present)
    and not with the values of a new batch."""
    from model.attention.kernels.flex import _bucket
    from model.attention.kernels.registry import Call

    q = torch.randn(2, 4, 64, 8)
    kpm = torch.ones(2, 64, dtype=torch.bool)
    base = _bucket(q, q, q, Call())
    assert _bucket(torch.randn_like(q), q, q, Call()) == base
    assert _bucket(q, q, q, Call(key_padding_mask_BN=kpm)) == _bucket(q, q, q, Call(key_padding_mask_BN=~kpm))
    others = [
        _bucket(q[:1], q[:1], q[:1], Call()),
        _bucket(q.half(), q.half(), q.half(), Call()),
        _bucket(q.requires_grad_(), q, q, Call()),
        _bucket(q, q, q, Call(key_padding_mask_BN=kpm)),
        _bucket(q, q, q, Call(score_bias=A.DenseScoreBias(torch.zeros(1, 4, 64, 64)))),
    ]
    assert len({base, *others}) == 1 + len(others)


def test_explicit_flex_below_sm80_is_refused(monkeypatch):
    """An explicit ``flex`` on a GPU below compute capability 8.0 (mocked: a V100) is refused with the reason."""
    from model.attention.kernels import KERNELS

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    layout = A.FixedSparsityConfig(H, block=16).make_layout(N)
    with pytest.raises(ValueError, match=r"compute capability 8\.0\+.*MMA.*attention-gym issue 21"):
        KERNELS["flex"].make_plan(layout, 16, N, "cuda")
    assert A.choose_kernel("cuda", torch.float16, 4096, 0.1, capability=(7, 0)) != "flex"


def test_every_cpu_only_branch_asks_model_cpu_shortcuts():
    """The emulation reaches a CPU-only branch only through ``model.cpu_shortcuts.takes_cpu_path``: no other model
    module tests the device type itself (flex.py's CPU branches are FlexAttention's own limits: eager, no backward),
    and under the emulation every module holding the function answers False."""
    import re
    import sys
    from pathlib import Path

    import model

    root = Path(model.__file__).parent
    pattern = re.compile(r"\.type\s*[!=]=\s*\"cpu\"|\.is_cuda\b|\.is_cpu\b")
    offenders = [
        f"{p.relative_to(root.parent)}:{i}"
        for p in sorted(root.rglob("*.py"))
        if p.name not in ("cpu_shortcuts.py", "flex.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offenders, f"ask model.cpu_shortcuts.takes_cpu_path instead: {offenders}"
    with C.emulate_cuda():
        holders = [m for n, m in sys.modules.items() if n.startswith("model") and hasattr(m, "takes_cpu_path")]
        assert {m.__name__ for m in holders} >= {"model.cpu_shortcuts", "model.attention.kernels.sdpa"}
        assert not any(m.takes_cpu_path(torch.zeros(1)) for m in holders)
    assert all(m.takes_cpu_path(torch.zeros(1)) for m in holders)
