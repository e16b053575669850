"""Turning a plain model into a training engine, in one fixed order:

1. activation checkpointing (per encoder layer, on the nn.Module, before any wrapping)
2. DeepSpeed (deepspeed.initialize: precision, ZeRO partitioning, optimizer, LR scheduler)
3. compile (engine.compile(), DeepSpeed's wrapper around torch.compile, last so it sees the final module)

Each step is a separate function so tools and tests can apply a subset.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.utils.checkpoint

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


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Decay matrices; never biases or LayerNorm weights (1-D tensors), as in BERT."""
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def configure_optimizer(ds: ResolvedDSConfig, optim: OptimConfig) -> None:
    """Put our optimizer into the ds_config unless the file names one (then the file wins, LR schedule still ours).

    adamw -> DeepSpeed's "AdamW": FusedAdam on CUDA; torch.optim.AdamW on CPU (avoids a JIT C++ build).
    lamb  -> DeepSpeed's FusedLamb (CUDA only). ZeRO 1-3 shard flattened tensors, so LAMB's per-tensor trust ratio
             would be computed on shards: refused with ZeRO > 0.
    """
    cfg = ds.config
    if "optimizer" in cfg:
        ds.notes.append(f"{ds.path}: using the file's optimizer block {cfg['optimizer'].get('type')}")
        return
    if "scheduler" in cfg:
        raise DSConfigError(f"{ds.path}: remove the 'scheduler' block; the LR schedule comes from --lr, "
                            "--min-lr, --lr-warmup-fraction and --lr-decay-style")
    params = {"lr": optim.lr, "weight_decay": optim.weight_decay,
              "betas": [optim.adam_beta1, optim.adam_beta2], "eps": optim.adam_eps}
    if optim.optimizer == "lamb":
        if ds.zero_stage > 0:
            raise DSConfigError(f"--optimizer lamb cannot run with ZeRO stage {ds.zero_stage} ({ds.path}): "
                                "DeepSpeed's FusedLamb needs whole tensors for its trust ratio; use a stage-0 config")
        if not torch.cuda.is_available():
            raise DSConfigError("--optimizer lamb needs CUDA (DeepSpeed's FusedLamb has no CPU kernel); use adamw")
        cfg["optimizer"] = {"type": "Lamb", "params": params}
    else:
        if not torch.cuda.is_available():
            params["torch_adam"] = True
        cfg["optimizer"] = {"type": "AdamW", "params": params}


def initialize_engine(model: torch.nn.Module, ds: ResolvedDSConfig, optim: OptimConfig, warmup: int,
                      decay_iters: int):
    """deepspeed.initialize with our param groups and LR scheduler (validate the config first: errors name the file)."""
    import deepspeed

    check_precision_supported(ds)
    configure_optimizer(ds, optim)
    validate_with_deepspeed(ds)

    def scheduler(opt: torch.optim.Optimizer) -> WarmupLinearDecay:
        return WarmupLinearDecay(opt, peak=optim.lr, min_lr=optim.min_lr, warmup=warmup,
                                 decay_iters=decay_iters, style=optim.lr_decay_style)

    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=param_groups(model, optim.weight_decay),
                                           config=ds.config, lr_scheduler=scheduler)
    return engine


def apply_compile(engine) -> None:
    """torch.compile through DeepSpeed (keeps the engine's hooks and checkpoint names)."""
    engine.compile()
