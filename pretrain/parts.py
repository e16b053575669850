"""A run's parts, built from its RunConfig in a fixed order, so a resumed run replays a straight run bit for bit:
seed -> model (identical on every rank) -> per-rank seed -> engine -> --load -> data iterator -> restore RNG.

:func:`build_parts` returns them as :class:`Parts`, which pretrain/trainer.py's ``Trainer`` runs the loop over
(a test gives its own ``Parts``: every part is an object with its own tests).
"""

from __future__ import annotations

import dataclasses
import functools
import random
import socket
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist

from data_pipeline.samples import PACKED
from model import fused_norm
from pretrain import builders, checkpoint, faults, run_file
from pretrain.args import RunConfig, lr_schedule
from pretrain.batches import BatchPlan, device_batch
from pretrain.checkpointer import Checkpointer, ResumePoint
from pretrain.distributed import DistInfo, ExitSignal, all_gather_objects, init_distributed
from pretrain.ds_config import (
    apply_clip_grad,
    check_compile_supported,
    check_precision_supported,
    read_ds_config,
    resolve_batch_sizes,
)
from pretrain.metrics import MetricsLogger, throughput_for
from pretrain.micro_batch import MicroBatchChoice, choose_micro_batch, memory_model
from pretrain.numerics import configure_numerics
from pretrain.parallelize import (
    apply_activation_checkpointing,
    apply_compile,
    build_attention_plans,
    compile_note,
    initialize_engine,
    optimizer_from_block,
)
from pretrain.stragglers import RankTimer
from pretrain.validator import Validator
from pretrain.watchdog import Watchdog


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def printer(rank0: bool) -> Callable[[str], None]:
    """Rank 0's start-up and status lines (``[pretrain] ...``); the other ranks print nothing."""

    def say(msg: str) -> None:
        if rank0:
            print(f"[pretrain] {msg}", flush=True)

    return say


@dataclasses.dataclass
class Parts:
    """What the loop runs with."""

    run: RunConfig
    ds: Any
    """The DeepSpeed config read (pretrain.ds_config.DSConfig)."""
    dist: DistInfo
    engine: Any
    """DeepSpeed's engine."""
    batch: BatchPlan
    train_iters: int
    checkpointer: Checkpointer
    metrics: MetricsLogger
    validator: Validator
    train_iter: Iterator[dict[str, torch.Tensor]] | None
    """This rank's host batches from the consumed samples on."""
    to_device: Callable[[dict[str, torch.Tensor]], dict[str, Any]]
    """A host batch as the model's inputs on this rank's device (:func:`pretrain.batches.device_batch`)."""
    faults: faults.Faults
    """The fault hook: the one place faults enter (does nothing in a real run)."""
    watchdog: Any
    timer: RankTimer
    signal: ExitSignal | None = None
    say: Callable[[str], None] = print
    iteration: int = 0
    consumed_samples: int = 0
    own_grad_norm: bool = False
    """The trainer clips and keeps the norm (ds.trainer_clips: ZeRO-0 fp32 or autocast)."""


def build_parts(run: RunConfig, run_config_text: str | None = None) -> Parts:
    """Every part of a run, in the module docstring's order; each step prints what it decided (rank 0).
    ``run_config_text``: written as ``config.toml`` into every checkpoint (pretrain/checkpointer.py); default: the
    resolved run (pretrain/run_file.py ``dumps``, after `auto` chose the micro-batch), the file train.py writes in the
    run directory, so ``--config`` of either starts the same run."""
    hook = faults.from_environment()  # the test-only fault hook: does nothing in a real run
    # the ds_config read and checked before any rank starts work, its optimizer block merged into the run's settings,
    # and torch's numerics set before any CUDA op
    ds = read_ds_config(run.system.deepspeed_config)
    check_precision_supported(ds)
    check_compile_supported(ds, run.system.compile)
    numerics_notes = configure_numerics(run.system.deterministic, run.system.tf32)
    run = dataclasses.replace(run, optim=optimizer_from_block(ds, run.optim, run.explicit))
    # the exit-signal handler before the slow set-up (an early signal is not lost), the process group, the watchdog,
    # the per-rank timer and (only when the straggler check is on: a start-up collective) every rank's host name
    system, loop = run.system, run.loop
    signal = ExitSignal(loop.exit_signal) if loop.exit_signal_handler else None
    info = init_distributed(system.distributed_timeout_minutes, system.local_rank)
    say = printer(info.rank == 0)
    watchdog = Watchdog(system.distributed_timeout_minutes * 60, info.rank, info.world_size)
    straggler_check = info.world_size > 1 and loop.straggler_ratio > 0
    hosts = all_gather_objects(socket.gethostname()) if straggler_check else [socket.gethostname()]
    say(f"{info.world_size} rank(s), backend {dist.get_backend()}, device {info.device.type}")
    tokenizer = builders.build_tokenizer(run.data)
    model_config = builders.build_model_config(run.model, run.data, tokenizer.vocab_size, ds.sparse_attention, ds.path)
    run, batch = resolve_batch_plan(run, ds, info, model_config)  # after the model: `auto` estimates its memory
    for note in ds.notes + numerics_notes:
        say(note)
    if run_config_text is None:
        run_config_text = run_file.dumps(run)
    checkpointer = Checkpointer(run, ds, info, hook, say, model_config, run_config_text)
    point = checkpointer.find()
    iteration, consumed = point.iteration, point.consumed_samples
    train_iters = batch.train_iters(loop, iteration, consumed)
    schedule = lr_schedule(run.optim, run.loop, train_iters)  # in steps, or samples (--train-samples)
    checkpointer.plan(point, schedule, batch)
    engine = build_engine(run, ds, model_config, schedule, info, point, checkpointer, say)
    for line in attention_backend_lines(model_config, run, ds.precision, info.device, batch.micro):
        say(line)
    rng = checkpointer.load(engine, point)
    # the datasets (sample index sized for the steps still to run), this rank's batches from the consumed samples on;
    # then the saved RNG (the loader draws nothing from torch's global RNG, so the two commute)
    train_ds, valid_ds, _ = builders.build_datasets(
        run, tokenizer, batch.samples_needed(train_iters, iteration, consumed), train_iters, batch.global_batch
    )

    def loader(dataset, consumed: int, num_workers: int, valid: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        return iter(
            builders.build_dataloader(
                run, dataset, tokenizer, batch.micro, info.rank, info.world_size, consumed, num_workers, valid=valid
            )
        )

    train_iter = loader(train_ds, consumed, system.num_workers)
    if rng is not None:
        checkpoint.set_rng_state(rng)
    timer = RankTimer(info.device)
    throughput = throughput_for(
        model_config, run.data, info.device, ds.precision, run.logging.peak_tflops, info.world_size, say
    )
    own_grad_norm = ds.trainer_clips
    metrics = MetricsLogger(
        run, ds, info, engine, throughput, timer, hosts, train_iters, own_grad_norm, batch.ramp is not None
    )
    to_device = functools.partial(device_batch, device=info.device, max_predictions=run.data.max_predictions)
    valid_batches = None if valid_ds is None else functools.partial(loader, valid_ds, 0, 0, valid=True)
    validator = Validator(
        engine, valid_batches, to_device, loop.eval_iters, info.device, watchdog.progress, say, run.data.split
    )
    return Parts(
        run, ds, info, engine, batch, train_iters, checkpointer, metrics, validator, train_iter, to_device, hook,
        watchdog, timer, signal, say, iteration, consumed, own_grad_norm,
    )  # fmt: skip


def resolve_batch_plan(run: RunConfig, ds, info: DistInfo, model_config) -> tuple[RunConfig, BatchPlan]:
    """Micro batch, accumulation steps and global batch (flags and ds_config agreed), gradient clipping written into
    the ds_config, the batch ramp. Returns the run with --micro-batch-size auto replaced by the number chosen
    (checkpoints record it and a resume compares it)."""

    def choose(per_rank: list[int]) -> MicroBatchChoice:
        """--micro-batch-size auto: the smallest free device memory over the ranks (every rank chooses the same)
        against the model's memory formula; a CPU takes the default (pretrain/micro_batch.py)."""
        device = info.device
        if device.type != "cuda":
            return choose_micro_batch(per_rank, device.type)
        free = torch.cuda.mem_get_info(device)[0]
        if info.world_size > 1:
            free = min(all_gather_objects(free))
        return choose_micro_batch(per_rank, device.type, free, memory_model(model_config, run.data, ds.precision))

    loop = run.loop
    micro, gas, global_batch = resolve_batch_sizes(
        ds, loop.micro_batch_size, loop.global_batch_size, info.world_size, choose=choose, ramp=loop.rampup_batch_size
    )
    if loop.micro_batch_size == "auto":
        run = dataclasses.replace(run, loop=dataclasses.replace(loop, micro_batch_size=micro))
    apply_clip_grad(ds, run.optim.clip_grad)
    ramp = None
    if loop.rampup_batch_size is not None:
        from pretrain.batch_ramp import BatchRamp

        ramp = BatchRamp(loop.rampup_batch_size, global_batch, micro, info.world_size)
    return run, BatchPlan(micro, gas, global_batch, info.world_size, ramp)


def build_engine(
    run: RunConfig, ds, model_config, schedule, info: DistInfo, point: ResumePoint, checkpointer: Checkpointer, say
):
    """The model, identical on every rank (seeded before it is built; --finetune weights loaded into it),
    activation checkpointing, then the per-rank seed (dropout differs across data-parallel ranks), DeepSpeed's
    engine and compile (pretrain/parallelize.py's order). Returns the engine."""
    seed_everything(run.loop.seed)
    model = builders.build_model(model_config)
    if run.checkpoint.finetune and point.tag:
        checkpointer.load_finetune_weights(model, point)
    if run.system.activation_checkpointing:
        apply_activation_checkpointing(model)
    seed_everything(run.loop.seed + 100 * info.rank)
    engine = initialize_engine(model, ds, run.optim, schedule, say=say)
    if type(engine.optimizer).__module__.startswith("optimi"):
        say(f"optimizer {type(engine.optimizer).__name__} (torch-optimi, a client optimizer)")
    for note in build_attention_plans(engine.module, run.data.seq_length, info.device):
        say(note)  # which kernel `auto` runs and why (measured table or rule)
    say(apply_compile(engine, run.data.seq_length, info.device) if run.system.compile else compile_note(False))
    if model_config.residual_norm == "triton":  # whether the kernel runs here, or why not
        say(fused_norm.route_line(info.device.type, run.system.compile))
    return engine


def attention_backend_lines(
    model_config, run: RunConfig, precision: str, device: torch.device, micro: int
) -> list[str]:
    """On a GPU, the SDPA backend dense attention takes in training (torch's own choice) and why the faster ones
    refused (e.g. flash takes no mask): model/attention/sdpa_backend.py, torch's rules; for packed rows, the varlen
    route. Nothing for sparse or biased attention."""
    cfg = model_config
    if cfg.position.type not in ("absolute", "rotary"):
        return []
    layers = [cfg.attention.layer(i) for i in range(cfg.num_layers)]
    if any(a.sparsity is not None or a.token_mask is not None or a.kernel not in ("auto", "dense") for a in layers):
        return []
    lines = []
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    if run.data.sample_mode == PACKED:  # the varlen route or the same-document mask, and why
        from model.attention.kernels.varlen import route_line

        lines.append(route_line(device.type, dtype, cfg.attention_head_size, cfg.attention_dropout))
    if device.type != "cuda":
        return lines
    if run.system.deterministic:  # model/attention/kernels/sdpa.py forces the math backend then
        return lines + ["attention: SDPA math backend (--deterministic on CUDA)"]
    from model.attention.sdpa_backend import dense_training_backends, gpu_of_this_machine

    heads, seq = cfg.num_attention_heads, run.data.seq_length
    line = dense_training_backends(
        micro,
        heads,
        seq,
        cfg.attention_head_size,
        dtype,
        cfg.attention_dropout,
        gpu_of_this_machine(),
        ask_torch=torch.cuda.is_available(),
    )
    return lines + [f"{line} (dense attention, dropout {cfg.attention_dropout}; docs/training.md)"]
