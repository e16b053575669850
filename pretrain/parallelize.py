"""Turning a plain model into a training engine, in one fixed order:

1. activation checkpointing (per encoder layer, on the nn.Module, before any wrapping)
2. DeepSpeed (deepspeed.initialize: precision, ZeRO partitioning, optimizer, LR scheduler)
3. compile (engine.compile(), DeepSpeed's wrapper around torch.compile, last so it sees the final module)

Each step is a separate function so tools and tests can apply a subset.
"""

from __future__ import annotations

import dataclasses
import functools
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
import torch.utils.checkpoint

from pretrain import deepspeed_patch
from pretrain.args import OptimConfig
from pretrain.ds_config import DSConfigError, ResolvedDSConfig, check_precision_supported, validate_with_deepspeed
from pretrain.schedule import WarmupLinearDecay


def apply_activation_checkpointing(model: torch.nn.Module) -> int:
    """Recompute each `model.bert.encoder.layers[i]` in backward. Returns the number of layers wrapped.

    The layer's forward is replaced on the instance (not wrapped in a new module) so parameter names and
    checkpoints are unchanged; torch.utils.checkpoint restores the RNG so dropout masks match.
    """
    layers = model.bert.encoder.layers
    for layer in layers:
        original = layer.forward

        @functools.wraps(original)
        def forward(*args, _f=original, **kwargs):
            if not torch.is_grad_enabled():
                return _f(*args, **kwargs)
            return torch.utils.checkpoint.checkpoint(_f, *args, use_reentrant=False, **kwargs)

        layer.forward = forward
    return len(layers)


def no_weight_decay_names(model: torch.nn.Module) -> set[str]:
    """Parameters never decayed: biases and LayerNorm weights (1-D, as in BERT) and the tables a module lists in
    its ``no_weight_decay`` attribute (DIET position/segment tables, DAM's mask logits)."""
    names = {n for n, p in model.named_parameters() if p.ndim <= 1}
    for prefix, module in model.named_modules():
        for local in getattr(module, "no_weight_decay", ()):
            if isinstance(getattr(module, local, None), torch.nn.Parameter):
                names.add(f"{prefix}.{local}" if prefix else local)
    return names


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """[decayed, not decayed] (no_weight_decay_names), in named_parameters order within each group."""
    skip = no_weight_decay_names(model)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


#: --optimizer -> (DeepSpeed optimizer type, DeepSpeed op it JIT-builds on CUDA unless prebuilt)
_DS_FUSED = {"fused_adam": ("Adam", "fused_adam"), "lamb": ("Lamb", "fused_lamb")}


def fused_op_problem(op: str) -> str | None:
    """Why DeepSpeed could not build its CUDA op `op` at the first step (None: prebuilt, or nvcc matches torch).

    DeepSpeed compiles FusedAdam/FusedLamb with nvcc on first use, on every rank at once, unless the op was built
    into the install (DS_BUILD_FUSED_ADAM=1). Without nvcc, or with an nvcc whose CUDA major differs from torch's,
    that fails minutes into the job; we ask DeepSpeed's own checks before anything starts.
    """
    from deepspeed.git_version_info import installed_ops

    if installed_ops.get(op):
        return None
    from deepspeed.ops.op_builder.builder import CUDAMismatchException, MissingCUDAException, assert_no_cuda_mismatch

    try:
        assert_no_cuda_mismatch(op)
    except MissingCUDAException as e:
        return (
            f"DeepSpeed's {op} op is not prebuilt in this install and cannot be compiled here: no CUDA toolkit "
            f"(nvcc) was found ({e}). Install a CUDA toolkit whose version matches torch's CUDA "
            f"{torch.version.cuda} and set CUDA_HOME, reinstall deepspeed with DS_BUILD_{op.upper()}=1, or use "
            "--optimizer adamw (torch's fused AdamW: no build, as fast)"
        )
    except CUDAMismatchException as e:
        return (
            f"DeepSpeed's {op} op is not prebuilt and the CUDA toolkit does not match torch: {e}. Use an nvcc "
            f"of CUDA {torch.version.cuda}, or --optimizer adamw"
        )
    return None


#: optimizer-block key -> (OptimConfig field, flag); "betas" maps to two fields
_BLOCK_PARAMS = (
    ("lr", "lr", "--lr"),
    ("weight_decay", "weight_decay", "--weight-decay"),
    ("eps", "adam_eps", "--adam-eps"),
    ("betas", "adam_beta1", "--adam-beta1"),
    ("betas", "adam_beta2", "--adam-beta2"),
)


def optimizer_from_block(ds: ResolvedDSConfig, optim: OptimConfig, explicit: frozenset[str]) -> OptimConfig:
    """The optimizer settings a ds_config ``optimizer`` block implies: its values replace the flags' defaults (the
    LR schedule peaks at its ``lr``, the parameter groups decay with its ``weight_decay``); a flag given on the
    command line that the block also sets is refused naming both, and so is --optimizer. Unchanged without a block."""
    block = ds.config.get("optimizer")
    if block is None:
        return optim
    if not isinstance(block, dict) or not isinstance(block.get("params", {}), dict):
        raise DSConfigError(f'{ds.path}: \'optimizer\' must be an object like {{"type": "AdamW", "params": {{...}}}}')
    params = block.get("params", {})
    if "optimizer" in explicit:
        raise DSConfigError(
            f"--optimizer {optim.optimizer} conflicts with {ds.path}'s optimizer block (type {block.get('type')!r}): "
            "drop the flag or the block"
        )
    values: dict[str, Any] = {}
    for key, name, flag in _BLOCK_PARAMS:
        if key not in params:
            continue
        value = params[key][0 if name == "adam_beta1" else 1] if key == "betas" else params[key]
        if name in explicit and value != getattr(optim, name):
            raise DSConfigError(
                f"{flag} {getattr(optim, name)} conflicts with {ds.path}: optimizer.params.{key} = {params[key]}; "
                "drop one of them"
            )
        values[name] = type(getattr(optim, name))(value)
    unset = [flag for key, name, flag in _BLOCK_PARAMS if key not in params and name not in explicit]
    ds.notes.append(
        f"{ds.path}: the optimizer block's {', '.join(sorted({k for k, *_ in _BLOCK_PARAMS if k in params})) or 'no'} "
        f"values are used" + (f"; {', '.join(unset)} keep the flags' defaults" if unset else "")
    )
    return dataclasses.replace(optim, **values)


def check_decoupled_decay_block(ds: ResolvedDSConfig, optim: OptimConfig) -> None:
    """--fully-decoupled-weight-decay sets the decayed group's weight_decay to wd / peak LR, which is the intended
    decay only for an AdamW-style decay (weights shrunk by lr x weight_decay): refuse a file optimizer block that
    decays otherwise (an L2 penalty, LAMB's trust-ratio-scaled decay)."""
    if not optim.fully_decoupled_weight_decay:
        return
    block = ds.config["optimizer"]
    kind = str(block.get("type", "")).lower()
    params = block.get("params") or {}
    if kind == "adamw" or (kind in ("adam", "fusedadam") and params.get("adam_w_mode", True) is not False):
        return
    raise DSConfigError(
        f"--fully-decoupled-weight-decay needs an AdamW-style weight decay; {ds.path}'s optimizer block "
        f"{block.get('type')!r} decays otherwise: use type AdamW (or Adam with adam_w_mode true), or drop the flag"
    )


def configure_optimizer(ds: ResolvedDSConfig, optim: OptimConfig) -> None:
    """Put our optimizer into the ds_config unless the file names one (then the file wins, LR schedule still ours).

    adamw      -> torch.optim.AdamW through DeepSpeed (`torch_adam`): fused kernel on CUDA, foreach on CPU; no build.
    fused_adam -> DeepSpeed's FusedAdam (CUDA only; JIT-built with nvcc unless prebuilt: checked here first).
    lamb       -> DeepSpeed's FusedLamb (CUDA only, same build check). ZeRO 1-3 shard flattened tensors, so LAMB's
                  per-tensor trust ratio would be computed on shards: refused with ZeRO > 0.
    stableadamw -> torch-optimi's StableAdamW as a client optimizer (initialize_engine): its per-tensor RMS needs
                  whole tensors, which ZeRO 1-3 and DeepSpeed's bf16/fp16 optimizers (flat fp32 groups) do not
                  hand it: ZeRO stage 0 with fp32 or torch_autocast only.
    """
    cfg = ds.config
    if "optimizer" in cfg:
        check_decoupled_decay_block(ds, optim)
        ds.notes.append(f"{ds.path}: using the file's optimizer block {cfg['optimizer'].get('type')}")
        return
    if optim.optimizer == "stableadamw":
        autocast = (cfg.get("torch_autocast") or {}).get("enabled") in (True, "true", 1)
        if ds.zero_stage > 0 or not (ds.precision == "fp32" or autocast):
            raise DSConfigError(
                f"--optimizer stableadamw cannot run with ZeRO stage {ds.zero_stage} in {ds.precision_summary} "
                f"({ds.path}): its per-tensor update clipping needs whole parameter tensors, and ZeRO 1-3 and "
                "DeepSpeed's bf16/fp16 optimizers hand the optimizer flattened shards. Use a ZeRO stage 0 config in "
                "fp32 or with torch_autocast, or --optimizer adamw"
            )
        if "scheduler" in cfg:
            raise DSConfigError(f"{ds.path}: remove the 'scheduler' block; the LR schedule comes from the flags")
        return
    if "scheduler" in cfg:
        raise DSConfigError(
            f"{ds.path}: remove the 'scheduler' block; the LR schedule comes from --lr, "
            "--min-lr, --lr-warmup-fraction and --lr-decay-style"
        )
    params = {
        "lr": optim.lr,
        "weight_decay": optim.applied_weight_decay,
        "betas": [optim.adam_beta1, optim.adam_beta2],
        "eps": optim.adam_eps,
    }
    if optim.optimizer in _DS_FUSED:
        ds_type, op = _DS_FUSED[optim.optimizer]
        if optim.optimizer == "lamb" and ds.zero_stage > 0:
            raise DSConfigError(
                f"--optimizer lamb cannot run with ZeRO stage {ds.zero_stage} ({ds.path}): "
                "DeepSpeed's FusedLamb needs whole tensors for its trust ratio; use a stage-0 config"
            )
        if not torch.cuda.is_available():
            raise DSConfigError(
                f"--optimizer {optim.optimizer} needs CUDA (DeepSpeed's {op} has no CPU kernel); use --optimizer adamw"
            )
        problem = fused_op_problem(op)
        if problem:
            raise DSConfigError(f"--optimizer {optim.optimizer}: {problem}")
        if ds_type == "Adam":
            params["adam_w_mode"] = True
        cfg["optimizer"] = {"type": ds_type, "params": params}
        return
    params["torch_adam"] = True
    if torch.cuda.is_available():
        params["fused"] = True
    cfg["optimizer"] = {"type": "AdamW", "params": params}


def initialize_engine(
    model: torch.nn.Module,
    ds: ResolvedDSConfig,
    optim: OptimConfig,
    schedule: dict[str, Any],
    say: Callable[[str], None] | None = None,
):
    """deepspeed.initialize with our param groups and LR scheduler (validate the config first: errors name the file),
    DeepSpeed's ZeRO-1/2 gradient-norm host syncs removed (pretrain/deepspeed_patch.py) and, under ZeRO-3, the plain
    MLM loss (:func:`apply_mlm_loss_for_zero`). ``say`` receives the start-up lines of those two (the trainer's
    printer; the benchmarks pass none). ``schedule``: WarmupLinearDecay's settings (pretrain.args.lr_schedule, or
    pretrain.schedule.schedule_settings)."""
    import deepspeed

    lines = [deepspeed_patch.apply()]

    check_precision_supported(ds)
    lines.append(apply_mlm_loss_for_zero(model, ds.zero_stage))
    for line in lines:
        if line and say is not None:
            say(line)
    configure_optimizer(ds, optim)
    validate_with_deepspeed(ds)

    def scheduler(opt: torch.optim.Optimizer) -> WarmupLinearDecay:
        return WarmupLinearDecay(opt, **schedule)

    groups = param_groups(model, optim.applied_weight_decay)
    client = None
    if optim.optimizer == "stableadamw" and "optimizer" not in ds.config:
        from optimi import StableAdamW

        betas = (optim.adam_beta1, optim.adam_beta2)
        wd = optim.applied_weight_decay
        # optimi 0.3.3 decides its Triton kernels on an empty parameter list (all([]) is True), so it picks Triton
        # wherever Triton is installed, CPU runs of PyPI's CUDA torch included ("0 active drivers"): decide here,
        # with optimi's own rule (a CUDA device with bf16)
        triton = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        client = StableAdamW(groups, lr=optim.lr, betas=betas, weight_decay=wd, eps=optim.adam_eps, triton=triton)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=None if client else groups,
        optimizer=client,
        config=ds.config,
        lr_scheduler=scheduler,
    )
    if ds.zero_stage == 0 and engine.dp_world_size == 1:
        # one rank: DeepSpeed's ZeRO-0 all-reduce would flatten every gradient, reduce over itself and copy each back
        # (a few operators per parameter tensor, on the host, at every step) without changing a value
        engine.enable_backward_allreduce = False
    return engine


def apply_mlm_loss_for_zero(model: torch.nn.Module, zero_stage: int) -> str | None:
    """The plain MLM loss under ZeRO-3 (the start-up line says so), the chunked one below it. The chunked loss
    recomputes each chunk's decoder GEMM in the backward (torch.utils.checkpoint); ZeRO-3 has released the tied word
    embedding (the decoder weight) after the forward by then, and the recomputation would read its 1-D shard."""
    if zero_stage < 3 or not getattr(model, "mlm_chunk_rows", 0):
        return None
    model.mlm_chunk_rows = 0
    return (
        "MLM loss: the plain loss over whole logits under ZeRO-3 (the chunked loss recomputes the tied decoder in the "
        "backward, after ZeRO-3 has released its weight)"
    )


def clip_gradients(module: torch.nn.Module, max_norm: float) -> torch.Tensor | None:
    """The gradients' total 2-norm before clipping (None without gradients), every gradient scaled down to
    ``max_norm`` when it is > 0: torch's clip_grad_norm_ (foreach on a GPU: one multi-tensor norm and scale, no host
    sync), for the configs where DeepSpeed's own clipping loops over the tensors (ResolvedDSConfig.trainer_clips)."""
    params = [p for p in module.parameters() if p.grad is not None]
    if not params:
        return None
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    return torch.nn.utils.get_total_norm([p.grad for p in params])


def apply_compile(engine, seq_len: int, device: torch.device) -> str:
    """torch.compile through DeepSpeed (keeps the engine's hooks and checkpoint names), after building every
    attention layer's kernel plan for ``seq_len`` (plan building is host work on the layout: traced, it would
    break the graph at every layer). Returns the start-up line :func:`compile_note` gives."""
    build_attention_plans(engine.module, seq_len, device)
    engine.compile()
    return compile_note(True)


def compile_note(enabled: bool) -> str:
    """The trainer's start-up line on compile: whether it is on and what it compiles.

    What is compiled: the model's forward (and through AOTAutograd its backward): one graph per input signature,
    at most two for training (a padded batch, with its key mask; an unpadded one, without: the mask is dropped on the
    host, pretrain.trainer.device_batch), packed rows a third kind only when they occur (doc ids and ``cu_seqlens``,
    whose length is marked dynamic); evaluation (module.eval(), no_grad) compiles its own. What is not: DeepSpeed's
    optimizer step, ZeRO's gradient reduction and partitioning, clipping and the loss scaler run eager on the host
    (per-tensor work that is ZeRO's: docs/performance.md)."""
    if not enabled:
        return "compile: off (the model runs eager; --compile compiles its forward and backward with torch.compile)"
    from deepspeed.accelerator import get_accelerator

    backend = get_accelerator().get_compile_backend()
    return (
        f"compile: on (torch.compile of the model's forward and backward through DeepSpeed's engine.compile(), "
        f"backend {backend}; one graph per batch kind: unpadded (no mask), padded (key mask), packed (doc ids + "
        "cu_seqlens, dynamic segment count); DeepSpeed's optimizer step and ZeRO's gradient work run eager)"
    )


def build_attention_plans(module: torch.nn.Module, seq_len: int, device: torch.device) -> list[str]:
    """Every attention layer's kernel plan for ``seq_len`` in the module's dtype, built now on the host: at start
    (``auto``'s choices, returned as lines for the start-up notes), before torch.compile, and again after
    ``load_layout_state`` (a resumed layout drops the plans, which the compiled forward would otherwise rebuild
    inside the trace, breaking the graph at every layer)."""
    build = getattr(module, "build_attention_plans", None)
    if build is None:
        return []
    dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
    return build(seq_len, device, dtype)


@contextmanager
def gathered(params: list[torch.nn.Parameter], zero_stage: int) -> Iterator[None]:
    """Whole parameters for a read outside the forward (logging, export): under ZeRO-3 each rank holds a slice, so
    every rank must enter this together (DeepSpeed's GatheredParameters is a collective); a no-op below stage 3."""
    if zero_stage < 3 or not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield
