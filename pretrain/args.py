"""Command-line flags (Megatron's names where one exists) and the per-concern config dataclasses they become.

`parse_args` returns a `RunConfig` holding one dataclass per concern; nothing downstream reads argparse.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Sequence

from common.cli import (
    HelpFormatter,
    add_flags,
    add_override_flags,
    apply_tables,
    build,
    cli,
    cli_fields,
    flag_name,
    load_tables,
    override_fields,
    overrides,
)
from common.errors import UserError
from data_pipeline.data_config import DataConfig, DataConfigError
from pretrain.schedule import LR_STYLES, PRE_WSD_SETTINGS, WSD_DECAY_STYLES, WSD_DEFAULT_STYLE, schedule_settings


class ArgsError(UserError, ValueError):
    """A bad flag value; the message names the flag."""


EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")
OPTIMIZERS = ("adamw", "fused_adam", "lamb", "stableadamw")


@dataclass
class OptimConfig:
    """Optimizer and LR schedule (linear warmup then linear decay, as in all three papers). The schedule counts
    optimizer steps with --train-iters (the *-iters flags) and samples with --train-samples (the *-samples flags), as
    Megatron-LM does; mixing the two is refused."""

    optimizer: str = field(default="adamw", metadata=cli(choices=lambda: OPTIMIZERS))
    """'adamw' (torch's AdamW: fused kernel on CUDA, no build), 'fused_adam' (DeepSpeed's FusedAdam, CUDA only,
    compiled with nvcc unless prebuilt), 'lamb' (DeepSpeed's FusedLamb, CUDA only, ZeRO stage 0 only) or
    'stableadamw' (torch-optimi's StableAdamW, ModernBERT's optimizer: AdamW whose per-tensor step is scaled down
    when the gradient's RMS against the second moment exceeds 1; ZeRO stage 0 in fp32 or torch_autocast only)."""
    lr: float = 1e-4
    """Peak learning rate."""
    min_lr: float = 0.0
    """LR at the end of the decay."""
    lr_warmup_fraction: float | None = None
    """Warmup length as a fraction of the decay length (--lr-decay-iters or --lr-decay-samples; Megatron's
    --lr-warmup-fraction)."""
    lr_warmup_iters: int = 0
    """Warmup length in optimizer steps, with --train-iters (used when no fraction is given)."""
    lr_warmup_samples: int = 0
    """Warmup length in samples, with --train-samples (Megatron's; used when no fraction is given). Counted in
    samples, the warmup covers the same data during a --rampup-batch-size ramp as without it."""
    lr_decay_iters: int | None = None
    """Steps over which the LR decays to min_lr, with --train-iters (default: --train-iters)."""
    lr_decay_samples: int | None = None
    """Samples over which the LR decays to min_lr, with --train-samples (Megatron's; default: --train-samples)."""
    lr_decay_style: str = field(default="linear", metadata=cli(choices=lambda: tuple(LR_STYLES)))
    """A style registered in pretrain/schedule.py (the LR schedules table of docs/configuration.md): 'linear' (the
    papers), 'cosine', 'constant', or 'WSD' (warmup-stable-decay, Megatron's name: the peak LR until the last
    --lr-wsd-decay-iters/-samples of the decay length, then an anneal to --min-lr shaped by --lr-wsd-decay-style;
    ModernBERT)."""
    lr_wsd_decay_iters: int | None = None
    """With --lr-decay-style WSD and --train-iters: length of the final anneal in optimizer steps (required; at most
    the decay steps after warmup)."""
    lr_wsd_decay_samples: int | None = None
    """With --lr-decay-style WSD and --train-samples: length of the final anneal in samples (Megatron's; required;
    at most the decay samples after warmup)."""
    lr_wsd_decay_style: str | None = field(default=None, metadata=cli(choices=lambda: tuple(WSD_DECAY_STYLES)))
    """With --lr-decay-style WSD: the anneal's shape, 'minus_sqrt' (1 - sqrt, ModernBERT), 'linear', 'cosine' or
    'exponential' (the default, as in Megatron-LM)."""
    weight_decay: float = 0.01
    """AdamW weight decay; biases and LayerNorm weights are never decayed."""
    fully_decoupled_weight_decay: bool = False
    """Decouple the weight decay from the LR's size: each step shrinks weights by --weight-decay x lr_t / --lr
    (--weight-decay itself at the peak LR, following the schedule's shape; Loshchilov & Hutter's schedule
    multiplier, torch-optimi's decouple_lr, ModernBERT's 1e-5) instead of AdamW's lr_t x --weight-decay. AdamW-style
    optimizers only (not lamb)."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.999
    """Adam beta2 (RoBERTa / BlockBERT use 0.98)."""
    adam_eps: float = 1e-6
    """Adam epsilon."""
    clip_grad: float | None = 1.0
    """Gradient clipping by global norm (DeepSpeed's gradient_clipping); None leaves the ds_config's value."""

    @property
    def wsd(self) -> dict[str, Any]:
        """The WSD settings as pretrain.schedule takes them, the anneal in the schedule's unit (neutral unless
        --lr-decay-style WSD)."""
        length = self.lr_wsd_decay_iters if self.lr_wsd_decay_samples is None else self.lr_wsd_decay_samples
        if self.lr_decay_style != "WSD" or length is None:
            return dict(PRE_WSD_SETTINGS)
        return {"wsd_decay_iters": int(length), "wsd_style": self.lr_wsd_decay_style or WSD_DEFAULT_STYLE}

    @property
    def applied_weight_decay(self) -> float:
        """The decayed parameter group's ``weight_decay`` (see applied_weight_decay)."""
        return applied_weight_decay(self.weight_decay, self.lr, self.fully_decoupled_weight_decay)

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise ArgsError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr_decay_style not in LR_STYLES:
            raise ArgsError(f"--lr-decay-style must be one of {', '.join(LR_STYLES)}, got {self.lr_decay_style!r}")
        if self.lr_decay_style != "WSD":
            given = [
                f
                for f, v in (
                    ("--lr-wsd-decay-iters", self.lr_wsd_decay_iters),
                    ("--lr-wsd-decay-samples", self.lr_wsd_decay_samples),
                    ("--lr-wsd-decay-style", self.lr_wsd_decay_style),
                )
                if v is not None
            ]
            if given:
                raise ArgsError(f"{' and '.join(given)} need --lr-decay-style WSD (got {self.lr_decay_style!r})")
        for iters, samples in (
            ("lr_warmup_iters", "lr_warmup_samples"),
            ("lr_decay_iters", "lr_decay_samples"),
            ("lr_wsd_decay_iters", "lr_wsd_decay_samples"),
        ):
            if getattr(self, iters) and getattr(self, samples) is not None and getattr(self, samples) != 0:
                raise ArgsError(
                    f"--{iters.replace('_', '-')} {getattr(self, iters)} and --{samples.replace('_', '-')} "
                    f"{getattr(self, samples)} both set the same length: give the -iters flag with --train-iters or "
                    "the -samples flag with --train-samples"
                )
        for name in ("lr_decay_iters", "lr_decay_samples", "lr_wsd_decay_iters", "lr_wsd_decay_samples"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ArgsError(f"--{name.replace('_', '-')} must be positive, got {v}")
        if self.optimizer == "lamb" and self.fully_decoupled_weight_decay:
            raise ArgsError(
                "--fully-decoupled-weight-decay cannot apply to --optimizer lamb: LAMB's weight decay is part of the "
                "update its trust ratio rescales; use --optimizer adamw, fused_adam or stableadamw"
            )
        if self.lr_wsd_decay_style is not None and self.lr_wsd_decay_style not in WSD_DECAY_STYLES:
            raise ArgsError(
                f"--lr-wsd-decay-style must be one of {', '.join(WSD_DECAY_STYLES)}, got {self.lr_wsd_decay_style!r}"
            )
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ArgsError(f"need --lr > 0 and 0 <= --min-lr <= --lr (got {self.lr}, {self.min_lr})")
        if self.lr_warmup_fraction is not None and not 0 <= self.lr_warmup_fraction <= 1:
            raise ArgsError(f"--lr-warmup-fraction must be in [0, 1], got {self.lr_warmup_fraction}")
        for name in ("lr_warmup_iters", "lr_warmup_samples"):
            if getattr(self, name) < 0:
                raise ArgsError(f"--{name.replace('_', '-')} must be >= 0")
            if self.lr_warmup_fraction is not None and getattr(self, name):
                raise ArgsError(
                    f"--lr-warmup-fraction {self.lr_warmup_fraction} and --{name.replace('_', '-')} "
                    f"{getattr(self, name)} both set the warmup (the fraction silently won): give one of them, as "
                    "Megatron-LM requires"
                )
        if self.weight_decay < 0:
            raise ArgsError(f"--weight-decay must be >= 0, got {self.weight_decay}")
        if self.clip_grad is not None and self.clip_grad < 0:
            raise ArgsError("--clip-grad must be >= 0 (0 disables clipping)")


def _parse_micro_batch(text: str) -> int | str:
    """--micro-batch-size's text: a number, or 'auto'."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither an integer nor 'auto'") from None


@dataclass
class LoopConfig:
    """Training length, batches, evaluation and logging cadence."""

    micro_batch_size: int | str | None = field(default=None, metadata=cli(parse=_parse_micro_batch))
    """Samples per rank per forward pass (DeepSpeed's train_micro_batch_size_per_gpu), or 'auto': the largest of
    1, 2, 4, ..., 128 that divides the per-rank batch and fits the GPU's free memory by a formula of the model
    (pretrain/micro_batch.py; on a CPU the default 8), said at start-up. The global batch stays (needs
    --global-batch-size or train_batch_size); the accumulation steps are derived. A resume may change it."""
    global_batch_size: int | None = None
    """Samples per optimizer step over all ranks; accumulation steps are derived."""
    train_iters: int | None = None
    """Number of iterations (optimizer steps, skipped fp16 steps included)."""
    train_samples: int | None = None
    """Alternative to train_iters: samples to consume (rounded down to whole global batches). The LR schedule then
    counts samples, as Megatron-LM's (the *-samples flags; the *-iters ones are refused)."""
    rampup_batch_size: list[int] | None = None
    """Batch-size warm-up, as Megatron-LM's flag: START INCREMENT SAMPLES. The global batch starts at START and grows
    by INCREMENT every SAMPLES / ((global batch - START) / INCREMENT) consumed samples up to --global-batch-size;
    the micro batch stays, the accumulation steps change. Needs --train-samples (as Megatron), so the LR schedule
    counts samples (--lr-warmup-samples, --lr-decay-samples, --lr-wsd-decay-samples) and follows the data seen."""
    eval_interval: int = 1000
    """Validate every this many iterations (0 disables)."""
    eval_iters: int = 10
    """Validation batches per evaluation."""
    log_interval: int = 100
    """Log (stdout, --log-json, TensorBoard) every this many iterations."""
    straggler_ratio: float = 1.5
    """At each log, name the rank whose data loading or forward time (its own work, before collectives make it
    wait) exceeds this many times the other ranks' median: not a failure, but it sets every rank's pace. 0: off."""
    seed: int = 1234
    """Seed for weights, dropout, layouts and data order."""
    exit_interval: int | None = None
    """Stop (after saving) when the iteration is a multiple of this (Megatron's --exit-interval)."""
    exit_signal_handler: bool = False
    """On --exit-signal (e.g. Slurm's warning before the time limit), SIGTERM (Slurm's time limit, preemption,
    scancel, a SIGTERM to the launcher) or SIGINT, finish the current iteration, save a checkpoint and exit with code
    4; the same command with --load resumes exactly (Megatron's flag)."""
    exit_signal: str = "SIGTERM"
    """The signal --exit-signal-handler catches besides SIGTERM and SIGINT: SIGTERM, SIGINT, SIGUSR1 or SIGUSR2."""
    exit_signal_interval: int | None = None
    """With --exit-signal-handler: ask every this many iterations whether any rank received the signal (one tiny
    all-reduce, a host sync; also at every save and at --exit-interval). Default: --log-interval, where the step
    waits for the device anyway. The run stops at most this many iterations after the signal: keep that shorter than
    Slurm's warning time (--signal=B:USR1@120)."""

    def __post_init__(self) -> None:
        if (self.train_iters is None) == (self.train_samples is None):
            raise ArgsError("give exactly one of --train-iters and --train-samples")
        if self.rampup_batch_size is not None:
            r = self.rampup_batch_size
            if len(r) != 3 or not all(isinstance(v, int) for v in r) or r[0] < 1 or r[1] < 1 or r[2] < 0:
                raise ArgsError(
                    f"--rampup-batch-size {' '.join(map(str, r))}: give START INCREMENT SAMPLES (START, INCREMENT "
                    "positive, SAMPLES >= 0)"
                )
            if self.train_samples is None:
                raise ArgsError(
                    "--rampup-batch-size needs --train-samples instead of --train-iters (as Megatron-LM: with a "
                    "growing batch the run's length is a number of samples)"
                )
        if isinstance(self.micro_batch_size, str) and self.micro_batch_size != "auto":
            raise ArgsError(f"--micro-batch-size {self.micro_batch_size!r}: give a positive integer or 'auto'")
        if isinstance(self.micro_batch_size, int) and self.micro_batch_size <= 0:
            raise ArgsError(f"--micro-batch-size must be positive (or 'auto'), got {self.micro_batch_size}")
        for name in (
            "train_iters",
            "train_samples",
            "global_batch_size",
            "exit_interval",
            "exit_signal_interval",
        ):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ArgsError(f"--{name.replace('_', '-')} must be positive, got {v}")
        if self.exit_signal_interval is not None and not self.exit_signal_handler:
            raise ArgsError("--exit-signal-interval needs --exit-signal-handler")
        if self.exit_signal not in EXIT_SIGNALS:
            raise ArgsError(f"--exit-signal must be one of {', '.join(EXIT_SIGNALS)}, got {self.exit_signal!r}")
        if self.eval_interval < 0 or self.eval_iters < 0 or self.log_interval <= 0:
            raise ArgsError("--eval-interval/--eval-iters must be >= 0 and --log-interval > 0")
        if self.straggler_ratio != 0 and not self.straggler_ratio > 1:
            raise ArgsError(f"--straggler-ratio must be above 1 (or 0 to disable), got {self.straggler_ratio}")


@dataclass
class CheckpointConfig:
    """Where checkpoints go and how they are resumed."""

    save: str | None = None
    """Directory to save checkpoints to (one sub-directory per iteration, plus `latest`)."""
    load: str | None = None
    """Directory to resume from (its newest complete checkpoint); may equal --save."""
    save_interval: int | None = None
    """Save every this many iterations (and always at the end when --save is given)."""
    keep_last: int | None = None
    """Keep only the newest k complete checkpoints (None keeps all)."""
    finetune: bool = False
    """Load weights only (start at iteration 0 with a fresh optimizer and LR warmup): phase 2 of a two-phase run.
    Position embeddings are extended when --max-position-embeddings grew."""
    no_load_rng: bool = False
    """Do not restore the RNG states (exact resume needs them)."""
    strict_load: bool = False
    """On resume, stop with an error when the newest committed checkpoint does not verify against the sizes and
    checksums in its commit marker, instead of falling back to the newest one that does."""
    override_opt_param_scheduler: bool = False
    """On resume, use the LR schedule of the flags (--lr, --min-lr, warmup, --lr-decay-iters, --lr-decay-style) and
    their optimizer settings (--weight-decay, --adam-beta1/2, --adam-eps) instead of the checkpoint's; the step count
    carries on. Without it or --use-checkpoint-opt-param-scheduler a difference is refused (Megatron-LM's flag)."""
    use_checkpoint_opt_param_scheduler: bool = False
    """On resume, keep the LR schedule and optimizer settings stored in the checkpoint whatever the flags say
    (Megatron-LM's flag)."""

    def __post_init__(self) -> None:
        if self.save_interval is not None and self.save_interval <= 0:
            raise ArgsError("--save-interval must be positive")
        if self.keep_last is not None and self.keep_last < 1:
            raise ArgsError("--keep-last must be >= 1")
        if self.finetune and not self.load:
            raise ArgsError("--finetune needs --load (the phase-1 checkpoint directory)")
        if self.override_opt_param_scheduler and self.use_checkpoint_opt_param_scheduler:
            raise ArgsError(
                "give at most one of --override-opt-param-scheduler and --use-checkpoint-opt-param-scheduler"
            )


@dataclass
class LoggingConfig:
    """Outputs other than checkpoints."""

    tensorboard_dir: str | None = None
    """TensorBoard event directory (rank 0 writes)."""
    log_json: str | None = None
    """File receiving one JSON object per logged iteration (rank 0 writes)."""
    peak_tflops: float | None = None
    """Per-GPU peak TFLOP/s the logged MFU divides by; default: the device's dense fp16/bf16 tensor-core peak from
    pretrain/throughput.py's table (CPUs, fp32 training and GPUs not in the table log TFLOP/s without MFU)."""

    def __post_init__(self) -> None:
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ArgsError(f"--peak-tflops {self.peak_tflops}: must be a positive number of TFLOP/s per GPU")


@dataclass
class SystemConfig:
    """Engine-level choices applied to the model, in the order documented in pretrain/parallelize.py."""

    deepspeed_config: str = field(
        default="ds_configs/zero2_fp32.json", metadata=cli(flag="--deepspeed_config", aliases=["--deepspeed-config"])
    )
    """DeepSpeed JSON config (ZeRO stage, precision, loss scaling, ...)."""
    activation_checkpointing: bool = field(default=False, metadata=cli(flag="--checkpoint-activations"))
    """Recompute each encoder layer in backward (torch.utils.checkpoint, RNG preserved)."""
    compile: bool = False
    """torch.compile the model through DeepSpeed's engine.compile()."""
    distributed_timeout_minutes: float = 10.0
    """Process-group timeout, of every group (DeepSpeed's too): a rank stuck in a collective for this long raises
    instead of hanging, and the watchdog ends a rank that made no progress for this long plus 30 s (exit code 5)."""
    num_workers: int = 2
    """DataLoader worker processes per rank."""
    local_rank: int | None = field(default=None, metadata=cli(flag="--local_rank", aliases=["--local-rank"]))
    """Set by the deepspeed launcher (--local_rank); otherwise read from LOCAL_RANK."""
    deterministic: bool = False
    """torch deterministic algorithms, cuDNN deterministic, cuBLAS fixed workspace: bitwise-repeatable runs and
    resumes on CUDA (slower); CPU runs are repeatable without it."""
    tf32: bool = True
    """Let fp32 matmuls use TF32 tensor cores on Ampere+ GPUs (--no-tf32 for IEEE fp32)."""

    def __post_init__(self) -> None:
        if self.distributed_timeout_minutes <= 0:
            raise ArgsError("--distributed-timeout-minutes must be positive")
        if self.num_workers < 0:
            raise ArgsError("--num-workers must be >= 0")


def _kernel_names() -> list[str]:
    from model.attention.kernels import KERNELS

    return sorted(KERNELS)


def _preset_names() -> list[str]:
    from model.presets import preset_names

    return preset_names()


def _pattern_names() -> list[str]:
    from model.attention.token_patterns import TOKEN_MASKS

    return sorted(TOKEN_MASKS)


def _sharing_names() -> list[str]:
    from model.positions import SHARING

    return list(SHARING)


@dataclass
class ModelArgs:
    """How to build the ModelConfig: a preset or a JSON file, then explicit overrides."""

    model_config: str | None = None
    """JSON file holding ModelConfig.to_dict() (wins over --model-preset)."""
    model_preset: str = field(default="bert-base", metadata=cli(choices=_preset_names))
    """A recipe of model/presets.py (ModelConfig.preset name; see the presets table in docs/configuration.md)."""
    attention_kernel: str | None = field(default=None, metadata=cli(choices=_kernel_names))
    """Attention kernel of every layer (AttentionConfig.kernel; default: the model config's)."""
    sparsity_config: str | None = None
    """AttentionConfig.sparsity as JSON text or a JSON file: a ds_config-style block with a registered 'mode' (see
    the pattern table in docs/model.md, 'Block layout or token mask?')."""
    blockbert_blocks: int | None = None
    """BlockBERT n (shorthand for model.presets.blockbert(n, --head-assignment), a sparsity config with mode
    'blockbert'; needs --head-assignment). Under a ModernBERT cadence (global_every) it lays out the global layers."""
    head_assignment: str | None = None
    """BlockBERT heads per permutation, e.g. 10:2 or 8:2:2."""
    token_mask: str | None = field(default=None, metadata=cli(choices=_pattern_names))
    """SparseBERT token mask of every layer (shorthand for model.presets.sparsebert(PATTERN, --seq-length), i.e.
    attention.token_mask built for the training length; see the token-mask table in docs/configuration.md)."""
    token_mask_path: str | None = None
    """With --token-mask file: the mask file (e.g. a DAM search's learned_masks.pt)."""
    diet_size: int | None = None
    """With a DIET preset (diet-abs-*, diet-rel-*): DIET-ABS's rank d_p or DIET-REL's clip distance K (default 128;
    model.presets.diet)."""
    diet_sharing: str | None = field(default=None, metadata=cli(choices=_sharing_names))
    """With a DIET preset: share the position parameters across none | layer | head (default none)."""
    sliding_window: int | None = None
    """With a ModernBERT preset: the local layers' exact sliding window in tokens (model.presets.modernbert; default
    the preset's)."""
    global_every: int | None = None
    """With a ModernBERT preset: global attention where layer % this == 0, the window elsewhere (default the
    preset's, 3)."""
    overrides: dict[str, Any] = field(default_factory=dict, metadata=cli(skip=True))
    """ModelConfig fields given on the command line (--num-layers, --hidden-size, ...)."""
    attention: dict[str, Any] = field(default_factory=dict, metadata=cli(skip=True))
    """AttentionConfig fields given on the command line (kernel, sparsity), derived from the flags above."""

    def __post_init__(self) -> None:
        self.check_recipe_flags()
        if not self.attention:
            if self.attention_kernel:
                self.attention["kernel"] = self.attention_kernel
            sparsity = self._sparsity()
            if sparsity is not None:
                self.attention["sparsity"] = sparsity

    def _sparsity(self) -> dict[str, Any] | None:
        if self.sparsity_config and self.blockbert_blocks:
            raise ArgsError("give either --sparsity-config or --blockbert-blocks/--head-assignment, not both")
        if self.sparsity_config:
            text = self.sparsity_config
            if os.path.isfile(text):
                with open(text) as f:
                    text = f.read()
            try:
                value = json.loads(text)
            except json.JSONDecodeError as e:
                raise ArgsError(f"--sparsity-config is neither a JSON file nor JSON text: {e}") from e
            if not isinstance(value, dict):
                raise ArgsError("--sparsity-config must be a JSON object")
            return value
        if self.blockbert_blocks:
            if not self.head_assignment:
                raise ArgsError("--blockbert-blocks needs --head-assignment (e.g. 10:2 for n=2, 8:2:2 for n=3)")
            from model.presets import blockbert

            # block=None: the layout's default tile, left out of the config as this shorthand always did
            return blockbert(self.blockbert_blocks, self.head_assignment, block=None)
        if self.head_assignment:
            raise ArgsError("--head-assignment needs --blockbert-blocks")
        return None

    def check_recipe_flags(self) -> None:
        """The flags that go with one kind of preset or with another flag."""
        if self.token_mask_path and self.token_mask != "file":
            raise ArgsError("--token-mask-path needs --token-mask file")
        if self.token_mask == "file" and not self.token_mask_path:
            raise ArgsError("--token-mask file needs --token-mask-path (the mask file)")
        for name in ("diet_size", "sliding_window", "global_every"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ArgsError(f"--{name.replace('_', '-')} must be >= 1, got {v}")


@dataclass
class DataArgs(DataConfig):
    """The trainer's data settings: :class:`data_pipeline.data_config.DataConfig` (same field names, the same checks)
    plus the tokenizer. Its seed is --seed."""

    data_path: list[str] = field(default_factory=list)
    """Megatron-style prefixes with optional weights: `0.3 books 0.7 wiki` or `prefix`."""
    valid_data_path: list[str] = field(default_factory=list)
    """Separate validation shards (Megatron's --valid-data-path): held-out documents, e.g. whole books, used whole
    for validation; prefixes with optional weights, like --data-path. With it, --split is not used: every
    --data-path document trains."""
    valid_seed: int | None = None
    """Seeds the validation samples and masks (default: --seed). Fix it to evaluate runs with different --seed on
    identical held-out batches."""
    tokenizer_type: str = "BertWordPieceLowerCase"
    """data_pipeline.tokenization type."""
    vocab_file: str | None = None
    """WordPiece vocab file."""
    tokenizer_model: str | None = None
    """SentencePiece / HF tokenizer model."""

    CLI_SKIP = (
        "seed",
        "cut_fraction",
        "mask_token_prob",
        "random_prob",
        "pad_to_multiple_of",
        "dynamic_padding",
        "cache_dir",
    )
    """DataConfig fields that are not trainer flags (the seed is --seed; the others keep their defaults)."""

    def __post_init__(self) -> None:
        if not self.data_path:
            raise ArgsError("--data-path is required (one prefix, or weight prefix pairs)")
        try:
            super().__post_init__()
        except DataConfigError as e:  # the data code names its field; the trainer's user typed a flag
            msg = str(e)
            for f in cli_fields(type(self)):
                msg = re.sub(rf"(?<![\w-]){f.name}(?!\w)", flag_name(f), msg, count=1)
            raise ArgsError(msg) from None


@dataclass
class RunConfig:
    """Everything one training run needs, grouped by concern."""

    optim: OptimConfig
    loop: LoopConfig
    checkpoint: CheckpointConfig
    logging: LoggingConfig
    system: SystemConfig
    model: ModelArgs
    data: DataArgs
    explicit: frozenset[str] = frozenset()
    """Field names whose flag was given on the command line, or that a --config file sets to other than the default
    (the rest hold defaults): a ds_config block may then supply the value instead, and a flag given against it is
    refused rather than silently losing."""
    config_file: str | None = None
    """The --config run file the settings were read from (pretrain/run_file.py), if any."""
    sources: dict[str, str] = field(default_factory=dict)
    """Setting -> where its value came from: 'file' (--config), 'flag' or 'default' (said at start-up)."""

    def __post_init__(self) -> None:
        check_schedule_unit(self.optim, self.loop)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["explicit"] = sorted(self.explicit)  # JSON-friendly
        del d["sources"]  # how the settings were given, not what they are
        return d


GROUPS = [
    ("model", ModelArgs),
    ("data", DataArgs),
    ("optimization", OptimConfig),
    ("loop", LoopConfig),
    ("checkpoints", CheckpointConfig),
    ("logging", LoggingConfig),
    ("system", SystemConfig),
]
"""Flag groups of ``--help``, each generated from one config dataclass."""


NOT_IN_FILE = {"local_rank"}
"""Fields a launcher sets per rank: never written in a run file, refused in one."""


def tables() -> dict[str, tuple[str, type]]:
    """Table name -> (RunConfig attribute, config dataclass), in the order of ``--help``."""
    attrs = {f.type if isinstance(f.type, str) else f.type.__name__: f.name for f in fields(RunConfig)}
    return {title: (attrs[cls.__name__], cls) for title, cls in GROUPS}


def table_keys(cls: type) -> list[str]:
    """The keys a table takes: the flag fields of ``cls`` (for ``[model]`` also ModelConfig's override fields)."""
    keys = [f.name for f in cli_fields(cls) if f.name not in NOT_IN_FILE]
    if cls is ModelArgs:
        from model.config import ModelConfig

        keys += [f.name for f in override_fields(ModelConfig)]
    return keys


def build_parser() -> argparse.ArgumentParser:
    """Every flag from the config dataclasses (:mod:`common.cli`); the ModelConfig overrides from the ModelConfig
    fields whose metadata names a flag (``--num-layers``, ``--kv-channels``, ...)."""
    from model.config import ModelConfig

    p = argparse.ArgumentParser(prog="pretrain.train", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument(
        "--config",
        default=None,
        help="a run file (TOML) whose tables are the groups below and whose keys their settings' names "
        "(docs/configuration.md, 'Run files'); flags given on the command line win over it. Each run writes its "
        "resolved one as config.toml in its run directory.",
    )
    for title, cls in GROUPS:
        g = p.add_argument_group(title, cls.__doc__)
        add_flags(g, cls)
        if cls is ModelArgs:
            add_override_flags(g, ModelConfig, source="the preset's")
        if cls is SystemConfig:
            g.add_argument(
                "--deepspeed",
                action="store_true",
                help="accepted for compatibility with DeepSpeed scripts (the trainer always uses DeepSpeed)",
            )
    return p


def parse_args(argv: Sequence[str] | None = None) -> RunConfig:
    from model.config import ModelConfig

    parser = build_parser()
    ns = parser.parse_args(argv)
    given = given_flags(parser, sys.argv[1:] if argv is None else argv)
    known = {title: table_keys(cls) for title, (_, cls) in tables().items()}
    data = load_tables(ns.config, known) if ns.config is not None else {}
    sources, from_file = apply_tables(parser, ns, data, given, ns.config, known)
    return RunConfig(
        explicit=given | from_file,
        config_file=ns.config,
        sources=sources,
        optim=build(OptimConfig, ns),
        loop=build(LoopConfig, ns),
        checkpoint=build(CheckpointConfig, ns),
        logging=build(LoggingConfig, ns),
        system=build(SystemConfig, ns),
        model=build(ModelArgs, ns, overrides=overrides(ModelConfig, ns)),
        data=build(DataArgs, ns, seed=ns.seed),
    )


def given_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> frozenset[str]:
    """The ``dest`` of every option that appears in ``argv`` (``--flag value``, ``--flag=value`` or an alias)."""
    words = {a.split("=", 1)[0] for a in argv if a.startswith("-")}
    return frozenset(a.dest for a in parser._actions if any(o in words for o in a.option_strings))


def train_iterations(loop: LoopConfig, global_batch: int) -> int:
    """Iterations to run: --train-iters, or --train-samples in whole global batches."""
    if loop.train_iters is not None:
        return loop.train_iters
    iters = loop.train_samples // global_batch
    if iters < 1:
        raise ArgsError(f"--train-samples {loop.train_samples} is less than one global batch ({global_batch})")
    return iters


def applied_weight_decay(weight_decay: float, peak_lr: float, fully_decoupled: bool) -> float:
    """The decayed parameter group's ``weight_decay``. AdamW-style optimizers (torch's AdamW, DeepSpeed's FusedAdam
    in adam_w_mode, torch-optimi's StableAdamW) shrink each weight by lr_t x this per step, so fully decoupled it is
    weight_decay / peak_lr: a shrink of weight_decay x lr_t / peak_lr, exactly torch-optimi's ``decouple_lr``
    (ModernBERT's optimizer) and the same in every optimizer, with no per-step change of the groups."""
    return weight_decay / peak_lr if fully_decoupled else weight_decay


_ITER_FLAGS = ("lr_warmup_iters", "lr_decay_iters", "lr_wsd_decay_iters")
_SAMPLE_FLAGS = ("lr_warmup_samples", "lr_decay_samples", "lr_wsd_decay_samples")


def check_schedule_unit(optim: OptimConfig, loop: LoopConfig) -> None:
    """Megatron-LM's rule: a run given in steps (--train-iters) takes the *-iters schedule flags, one given in samples
    (--train-samples, as a batch ramp needs) the *-samples ones; the other kind is refused, never ignored."""
    by_samples = loop.train_samples is not None
    wrong = [f for f in (_ITER_FLAGS if by_samples else _SAMPLE_FLAGS) if getattr(optim, f)]
    if wrong:
        flags = ", ".join("--" + f.replace("_", "-") for f in wrong)
        if by_samples:
            raise ArgsError(
                f"{flags}: with --train-samples the LR schedule counts samples (as Megatron-LM): use "
                + ", ".join("--" + f.replace("_", "-").replace("-iters", "-samples") for f in wrong)
                + " instead (steps x global batch)"
            )
        raise ArgsError(
            f"{flags} count samples: they go with --train-samples (the run's length in samples), not --train-iters; "
            "use " + ", ".join("--" + f.replace("_", "-").replace("-samples", "-iters") for f in wrong) + " instead"
        )
    if optim.lr_decay_style == "WSD" and optim.wsd["wsd_decay_iters"] <= 0:
        flag = "--lr-wsd-decay-samples" if by_samples else "--lr-wsd-decay-iters"
        raise ArgsError(f"--lr-decay-style WSD needs {flag} > 0 (the length of the final anneal)")


def warmup_steps(optim: OptimConfig, decay_iters: int, samples: bool = False) -> int:
    """Warmup length in the schedule's unit: the fraction of the decay length, else --lr-warmup-iters/-samples."""
    if optim.lr_warmup_fraction is not None:
        return int(math.floor(optim.lr_warmup_fraction * decay_iters))
    return optim.lr_warmup_samples if samples else optim.lr_warmup_iters


def lr_schedule(optim: OptimConfig, loop: LoopConfig, train_iters: int) -> dict[str, Any]:
    """The LR schedule the flags give (pretrain.schedule.SETTINGS), as Megatron-LM's get_optimizer_param_scheduler
    builds it: in steps with --train-iters (decay over --lr-decay-iters, default the run's steps), in samples with
    --train-samples (decay over --lr-decay-samples, default --train-samples; warmup --lr-warmup-samples or the fraction
    of the decay samples; anneal --lr-wsd-decay-samples)."""
    by_samples = loop.train_samples is not None
    if by_samples:
        unit, decay = "samples", optim.lr_decay_samples or loop.train_samples
    else:
        unit, decay = "iters", optim.lr_decay_iters or train_iters
    warmup = warmup_steps(optim, decay, by_samples)
    wsd = optim.wsd
    if wsd["wsd_decay_iters"] > decay - warmup:
        what = "samples" if by_samples else "steps"
        raise ArgsError(
            f"--lr-wsd-decay-{unit} {wsd['wsd_decay_iters']} is longer than the {decay - warmup} decay {what} after "
            f"warmup ({decay} decay {what}, {warmup} warmup)"
        )
    return schedule_settings(optim.lr, optim.min_lr, warmup, decay, optim.lr_decay_style, unit=unit, **wsd)
