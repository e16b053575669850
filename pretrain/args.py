"""Command-line flags (Megatron's names where one exists) and the per-concern config dataclasses they become.

`parse_args` returns a `RunConfig` holding one dataclass per concern; nothing downstream reads argparse.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence


class ArgsError(ValueError):
    """A bad flag value; the message names the flag."""


EXIT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2")


@dataclass
class OptimConfig:
    """Optimizer and LR schedule (linear warmup then linear decay, as in all three papers)."""

    optimizer: str = "adamw"
    """'adamw' (torch's AdamW: fused kernel on CUDA, no build), 'fused_adam' (DeepSpeed's FusedAdam, CUDA only,
    compiled with nvcc unless prebuilt) or 'lamb' (DeepSpeed's FusedLamb, CUDA only, ZeRO stage 0 only)."""
    lr: float = 1e-4
    """Peak learning rate."""
    min_lr: float = 0.0
    """LR at the end of the decay."""
    lr_warmup_fraction: float | None = None
    """Warmup length as a fraction of the decay iterations (Megatron's --lr-warmup-fraction)."""
    lr_warmup_iters: int = 0
    """Warmup length in optimizer steps (used when no fraction is given)."""
    lr_decay_iters: int | None = None
    """Steps over which the LR decays to min_lr (default: the training length)."""
    lr_decay_style: str = "linear"
    """'linear' (the papers) or 'constant'."""
    weight_decay: float = 0.01
    """AdamW weight decay; biases and LayerNorm weights are never decayed."""
    adam_beta1: float = 0.9
    """Adam beta1."""
    adam_beta2: float = 0.999
    """Adam beta2 (RoBERTa / BlockBERT use 0.98)."""
    adam_eps: float = 1e-6
    """Adam epsilon."""
    clip_grad: float | None = 1.0
    """Gradient clipping by global norm (DeepSpeed's gradient_clipping); None leaves the ds_config's value."""

    def __post_init__(self) -> None:
        if self.optimizer not in ("adamw", "fused_adam", "lamb"):
            raise ArgsError(f"--optimizer must be adamw, fused_adam or lamb, got {self.optimizer!r}")
        if self.lr_decay_style not in ("linear", "constant"):
            raise ArgsError(f"--lr-decay-style must be linear or constant, got {self.lr_decay_style!r}")
        if not (self.lr > 0 and 0 <= self.min_lr <= self.lr):
            raise ArgsError(f"need --lr > 0 and 0 <= --min-lr <= --lr (got {self.lr}, {self.min_lr})")
        if self.lr_warmup_fraction is not None and not 0 <= self.lr_warmup_fraction <= 1:
            raise ArgsError(f"--lr-warmup-fraction must be in [0, 1], got {self.lr_warmup_fraction}")
        if self.lr_warmup_iters < 0:
            raise ArgsError("--lr-warmup-iters must be >= 0")
        if self.clip_grad is not None and self.clip_grad < 0:
            raise ArgsError("--clip-grad must be >= 0 (0 disables clipping)")


@dataclass
class LoopConfig:
    """Training length, batches, evaluation and logging cadence."""

    micro_batch_size: int | None = None
    """Samples per rank per forward pass (DeepSpeed's train_micro_batch_size_per_gpu)."""
    global_batch_size: int | None = None
    """Samples per optimizer step over all ranks; accumulation steps are derived."""
    train_iters: int | None = None
    """Number of iterations (optimizer steps, skipped fp16 steps included)."""
    train_samples: int | None = None
    """Alternative to train_iters: samples to consume (rounded down to whole global batches)."""
    eval_interval: int = 1000
    """Validate every this many iterations (0 disables)."""
    eval_iters: int = 10
    """Validation batches per evaluation."""
    log_interval: int = 100
    """Log (stdout, --log-json, TensorBoard) every this many iterations."""
    seed: int = 1234
    """Seed for weights, dropout, layouts and data order."""
    exit_interval: int | None = None
    """Stop (after saving) when the iteration is a multiple of this (Megatron's --exit-interval)."""
    exit_signal_handler: bool = False
    """On --exit-signal (e.g. Slurm's warning before the time limit), finish the current iteration, save a
    checkpoint and exit with code 4; the same command with --load resumes exactly (Megatron's flag)."""
    exit_signal: str = "SIGTERM"
    """The signal --exit-signal-handler catches: SIGTERM, SIGINT, SIGUSR1 or SIGUSR2."""

    def __post_init__(self) -> None:
        if (self.train_iters is None) == (self.train_samples is None):
            raise ArgsError("give exactly one of --train-iters and --train-samples")
        for name in ("train_iters", "train_samples", "micro_batch_size", "global_batch_size", "exit_interval"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ArgsError(f"--{name.replace('_', '-')} must be positive, got {v}")
        if self.exit_signal not in EXIT_SIGNALS:
            raise ArgsError(f"--exit-signal must be one of {', '.join(EXIT_SIGNALS)}, got {self.exit_signal!r}")
        if self.eval_interval < 0 or self.eval_iters < 0 or self.log_interval <= 0:
            raise ArgsError("--eval-interval/--eval-iters must be >= 0 and --log-interval > 0")


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
    override_opt_param_scheduler: bool = False
    """On resume, use the LR schedule of the flags (--lr, --min-lr, warmup, --lr-decay-iters, --lr-decay-style)
    instead of the checkpoint's; the step count carries on. Without it or --use-checkpoint-opt-param-scheduler a
    difference is refused (Megatron-LM's flag)."""
    use_checkpoint_opt_param_scheduler: bool = False
    """On resume, keep the LR schedule stored in the checkpoint whatever the flags say (Megatron-LM's flag)."""

    def __post_init__(self) -> None:
        if self.save_interval is not None and self.save_interval <= 0:
            raise ArgsError("--save-interval must be positive")
        if self.keep_last is not None and self.keep_last < 1:
            raise ArgsError("--keep-last must be >= 1")
        if self.finetune and not self.load:
            raise ArgsError("--finetune needs --load (the phase-1 checkpoint directory)")
        if self.override_opt_param_scheduler and self.use_checkpoint_opt_param_scheduler:
            raise ArgsError("give at most one of --override-opt-param-scheduler and "
                            "--use-checkpoint-opt-param-scheduler")


@dataclass
class LoggingConfig:
    """Outputs other than checkpoints."""

    tensorboard_dir: str | None = None
    """TensorBoard event directory (rank 0 writes)."""
    log_json: str | None = None
    """File receiving one JSON object per logged iteration (rank 0 writes)."""


@dataclass
class SystemConfig:
    """Engine-level choices applied to the model, in the order documented in pretrain/parallelize.py."""

    deepspeed_config: str = "ds_configs/zero2_fp32.json"
    """DeepSpeed JSON config (ZeRO stage, precision, loss scaling, ...)."""
    activation_checkpointing: bool = False
    """Recompute each encoder layer in backward (torch.utils.checkpoint, RNG preserved)."""
    compile: bool = False
    """torch.compile the model through DeepSpeed's engine.compile()."""
    distributed_timeout_minutes: float = 10.0
    """Process-group timeout: a rank stuck in a collective for this long raises instead of hanging."""
    num_workers: int = 2
    """DataLoader worker processes per rank."""
    local_rank: int | None = None
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


@dataclass
class ModelArgs:
    """How to build the ModelConfig: a preset or a JSON file, then explicit overrides."""

    model_config: str | None = None
    """JSON file holding ModelConfig.to_dict() (wins over --model-preset)."""
    model_preset: str = "bert-base"
    """ModelConfig.preset name ('bert-base', 'bert-large', 'tiny')."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """ModelConfig fields given on the command line (--num-layers, --hidden-size, ...)."""
    attention: dict[str, Any] = field(default_factory=dict)
    """AttentionConfig fields given on the command line (kernel, sparsity)."""
    make_vocab_size_divisible_by: int = 1
    """Pad the embedding table to a multiple of this (Megatron pads to 128 for speed)."""


@dataclass
class DataArgs:
    """Tokenizer and loader flags (become data_pipeline.loader.DataConfig)."""

    data_path: list[str] = field(default_factory=list)
    """Megatron-style prefixes with optional weights: `0.3 books 0.7 wiki` or `prefix`."""
    split: str = "949,50,1"
    """train,valid,test proportions of each shard's documents (contiguous whole-document ranges); ignored when
    --valid-data-path is given (then every --data-path document trains)."""
    valid_data_path: list[str] = field(default_factory=list)
    """Separate validation shards (Megatron's --valid-data-path): held-out documents, e.g. whole books, used whole
    for validation; prefixes with optional weights, like --data-path."""
    valid_seed: int | None = None
    """Seeds the validation samples and masks (default: --seed). Fix it to evaluate runs with different --seed on
    identical held-out batches."""
    seq_length: int = 512
    """Tokens per sample N."""
    sample_mode: str = "doc-sentences"
    """'doc-sentences' (RoBERTa-1seq), 'full-sentences' or 'nsp'."""
    short_seq_prob: float = 0.1
    """Probability of a shorter sample (BERT-style)."""
    mask_prob: float = 0.15
    """MLM masking probability."""
    whole_word_masking: bool = False
    """Mask whole words."""
    max_predictions_per_seq: int | None = None
    """At most this many predicted tokens per sample (BERT's max_predictions_per_seq, e.g. 20 at N=128, 80 at
    N=512); the MLM head then gathers a fixed number of positions per batch (static shapes, no host sync: what
    CUDA graphs and --compile need). None: every chosen token is predicted (dynamic shapes)."""
    tokenizer_type: str = "BertWordPieceLowerCase"
    """data_pipeline.tokenization type."""
    vocab_file: str | None = None
    """WordPiece vocab file."""
    tokenizer_model: str | None = None
    """SentencePiece / HF tokenizer model."""

    def __post_init__(self) -> None:
        if not self.data_path:
            raise ArgsError("--data-path is required (one prefix, or weight prefix pairs)")
        if self.max_predictions_per_seq is not None and not 0 < self.max_predictions_per_seq <= self.seq_length:
            raise ArgsError(f"--max-predictions-per-seq must be in [1, --seq-length {self.seq_length}], got "
                            f"{self.max_predictions_per_seq}")
        if self.sample_mode not in ("doc-sentences", "full-sentences", "nsp"):
            raise ArgsError(f"--sample-mode must be doc-sentences, full-sentences or nsp, got {self.sample_mode!r}")


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Flags that map 1:1 onto ModelConfig fields (Megatron name -> field).
_MODEL_FLAGS = {
    "num_layers": "num_layers", "hidden_size": "hidden_size", "num_attention_heads": "num_attention_heads",
    "ffn_hidden_size": "intermediate_size", "max_position_embeddings": "max_position_embeddings",
    "kv_channels": "head_size", "hidden_dropout": "hidden_dropout", "attention_dropout": "attention_dropout",
    "layernorm_epsilon": "layer_norm_eps",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pretrain.train", description=__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    g = p.add_argument_group("model")
    g.add_argument("--model-config", help="JSON file of ModelConfig.to_dict()")
    g.add_argument("--model-preset", default="bert-base")
    for flag in _MODEL_FLAGS:
        kind = float if flag.endswith(("dropout", "epsilon")) else int
        g.add_argument("--" + flag.replace("_", "-"), type=kind)
    g.add_argument("--pre-layer-norm", dest="pre_layer_norm", action="store_true", default=None)
    g.add_argument("--post-layer-norm", dest="pre_layer_norm", action="store_false")
    g.add_argument("--attention-kernel", choices=["dense", "block_gather", "flex", "auto"])
    g.add_argument("--sparsity-config", help="AttentionConfig.sparsity as JSON text or a JSON file")
    g.add_argument("--blockbert-blocks", type=int, help="BlockBERT n (shorthand for a sparsity config)")
    g.add_argument("--head-assignment", help="BlockBERT heads per permutation, e.g. 10:2 or 8:2:2")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=1)

    g = p.add_argument_group("data")
    g.add_argument("--data-path", nargs="+", default=[])
    g.add_argument("--split", default="949,50,1")
    g.add_argument("--valid-data-path", nargs="+", default=[])
    g.add_argument("--valid-seed", type=int)
    g.add_argument("--seq-length", type=int, default=512)
    g.add_argument("--sample-mode", default="doc-sentences")
    g.add_argument("--short-seq-prob", type=float, default=0.1)
    g.add_argument("--mask-prob", type=float, default=0.15)
    g.add_argument("--whole-word-masking", action="store_true")
    g.add_argument("--max-predictions-per-seq", type=int)
    g.add_argument("--tokenizer-type", default="BertWordPieceLowerCase")
    g.add_argument("--vocab-file")
    g.add_argument("--tokenizer-model")
    g.add_argument("--num-workers", type=int, default=2)

    g = p.add_argument_group("optimization")
    g.add_argument("--optimizer", default="adamw")
    g.add_argument("--lr", type=float, default=1e-4)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--lr-warmup-fraction", type=float)
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-decay-iters", type=int)
    g.add_argument("--lr-decay-style", default="linear")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-6)
    g.add_argument("--clip-grad", type=float, default=1.0)

    g = p.add_argument_group("loop")
    g.add_argument("--micro-batch-size", type=int)
    g.add_argument("--global-batch-size", type=int)
    g.add_argument("--train-iters", type=int)
    g.add_argument("--train-samples", type=int)
    g.add_argument("--eval-interval", type=int, default=1000)
    g.add_argument("--eval-iters", type=int, default=10)
    g.add_argument("--log-interval", type=int, default=100)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--exit-interval", type=int)
    g.add_argument("--exit-signal-handler", action="store_true")
    g.add_argument("--exit-signal", default="SIGTERM")

    g = p.add_argument_group("checkpoints")
    g.add_argument("--save")
    g.add_argument("--load")
    g.add_argument("--save-interval", type=int)
    g.add_argument("--keep-last", type=int)
    g.add_argument("--finetune", action="store_true")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--override-opt-param-scheduler", action="store_true")
    g.add_argument("--use-checkpoint-opt-param-scheduler", action="store_true")

    g = p.add_argument_group("logging")
    g.add_argument("--tensorboard-dir")
    g.add_argument("--log-json")

    g = p.add_argument_group("system")
    g.add_argument("--deepspeed_config", "--deepspeed-config", dest="deepspeed_config",
                   default="ds_configs/zero2_fp32.json")
    g.add_argument("--deepspeed", action="store_true", help="accepted for compatibility with deepspeed scripts")
    g.add_argument("--checkpoint-activations", dest="activation_checkpointing", action="store_true")
    g.add_argument("--compile", action="store_true")
    g.add_argument("--distributed-timeout-minutes", type=float, default=10.0)
    g.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int)
    g.add_argument("--deterministic", action="store_true")
    g.add_argument("--no-tf32", dest="tf32", action="store_false")
    return p


def _sparsity(ns: argparse.Namespace) -> dict[str, Any] | None:
    if ns.sparsity_config and ns.blockbert_blocks:
        raise ArgsError("give either --sparsity-config or --blockbert-blocks/--head-assignment, not both")
    if ns.sparsity_config:
        text = ns.sparsity_config
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
    if ns.blockbert_blocks:
        if not ns.head_assignment:
            raise ArgsError("--blockbert-blocks needs --head-assignment (e.g. 10:2 for n=2, 8:2:2 for n=3)")
        return {"mode": "blockbert", "num_blocks": ns.blockbert_blocks, "head_assignment": ns.head_assignment}
    if ns.head_assignment:
        raise ArgsError("--head-assignment needs --blockbert-blocks")
    return None


def parse_args(argv: Sequence[str] | None = None) -> RunConfig:
    ns = build_parser().parse_args(argv)
    overrides = {field_: getattr(ns, flag) for flag, field_ in _MODEL_FLAGS.items() if getattr(ns, flag) is not None}
    if ns.pre_layer_norm is not None:
        overrides["pre_layer_norm"] = ns.pre_layer_norm
    attention: dict[str, Any] = {}
    if ns.attention_kernel:
        attention["kernel"] = ns.attention_kernel
    sparsity = _sparsity(ns)
    if sparsity is not None:
        attention["sparsity"] = sparsity
    if ns.make_vocab_size_divisible_by < 1:
        raise ArgsError("--make-vocab-size-divisible-by must be >= 1")
    return RunConfig(
        optim=OptimConfig(optimizer=ns.optimizer, lr=ns.lr, min_lr=ns.min_lr,
                          lr_warmup_fraction=ns.lr_warmup_fraction, lr_warmup_iters=ns.lr_warmup_iters,
                          lr_decay_iters=ns.lr_decay_iters, lr_decay_style=ns.lr_decay_style,
                          weight_decay=ns.weight_decay, adam_beta1=ns.adam_beta1, adam_beta2=ns.adam_beta2,
                          adam_eps=ns.adam_eps, clip_grad=ns.clip_grad),
        loop=LoopConfig(micro_batch_size=ns.micro_batch_size, global_batch_size=ns.global_batch_size,
                        train_iters=ns.train_iters, train_samples=ns.train_samples,
                        eval_interval=ns.eval_interval, eval_iters=ns.eval_iters, log_interval=ns.log_interval,
                        seed=ns.seed, exit_interval=ns.exit_interval, exit_signal_handler=ns.exit_signal_handler,
                        exit_signal=ns.exit_signal),
        checkpoint=CheckpointConfig(save=ns.save, load=ns.load, save_interval=ns.save_interval,
                                    keep_last=ns.keep_last, finetune=ns.finetune, no_load_rng=ns.no_load_rng,
                                    override_opt_param_scheduler=ns.override_opt_param_scheduler,
                                    use_checkpoint_opt_param_scheduler=ns.use_checkpoint_opt_param_scheduler),
        logging=LoggingConfig(tensorboard_dir=ns.tensorboard_dir, log_json=ns.log_json),
        system=SystemConfig(deepspeed_config=ns.deepspeed_config,
                            activation_checkpointing=ns.activation_checkpointing, compile=ns.compile,
                            distributed_timeout_minutes=ns.distributed_timeout_minutes,
                            num_workers=ns.num_workers, local_rank=ns.local_rank,
                            deterministic=ns.deterministic, tf32=ns.tf32),
        model=ModelArgs(model_config=ns.model_config, model_preset=ns.model_preset, overrides=overrides,
                        attention=attention, make_vocab_size_divisible_by=ns.make_vocab_size_divisible_by),
        data=DataArgs(data_path=list(ns.data_path), split=ns.split, seq_length=ns.seq_length,
                      sample_mode=ns.sample_mode, short_seq_prob=ns.short_seq_prob, mask_prob=ns.mask_prob,
                      whole_word_masking=ns.whole_word_masking,
                      max_predictions_per_seq=ns.max_predictions_per_seq, tokenizer_type=ns.tokenizer_type,
                      vocab_file=ns.vocab_file, tokenizer_model=ns.tokenizer_model,
                      valid_data_path=list(ns.valid_data_path), valid_seed=ns.valid_seed),
    )


def train_iterations(loop: LoopConfig, global_batch: int) -> int:
    """Iterations to run: --train-iters, or --train-samples in whole global batches."""
    if loop.train_iters is not None:
        return loop.train_iters
    iters = loop.train_samples // global_batch
    if iters < 1:
        raise ArgsError(f"--train-samples {loop.train_samples} is less than one global batch ({global_batch})")
    return iters


def warmup_steps(optim: OptimConfig, decay_iters: int) -> int:
    if optim.lr_warmup_fraction is not None:
        return int(math.floor(optim.lr_warmup_fraction * decay_iters))
    return optim.lr_warmup_iters
