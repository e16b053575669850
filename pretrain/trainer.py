"""The pretraining loop: train_step (its micro_batches, one micro_step each), evaluation, logging, checkpoints, and
train(), which after each step does what pretrain/decision.py decides; close() always runs.

Order of set-up (fixed, so a resumed run replays a straight run bit for bit):
seed -> model (identical on every rank) -> per-rank seed -> engine -> --load -> data iterator -> restore RNG.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import resource
import socket
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist
from deepspeed.checkpoint.constants import (
    UNIVERSAL_CHECKPOINT_INFO,
    UNIVERSAL_CHECKPOINT_VERSION_KEY,
    UNIVERSAL_CHECKPOINT_VERSION_VALUE,
)

from common.errors import write_errors
from common.outputs import check_dir_writable, check_not_input
from data_pipeline.samples import PACKED
from model import fused_norm
from model.flops import model_flops_per_token
from pretrain import builders, checkpoint, faults, resize, resume
from pretrain.args import ArgsError, RunConfig, lr_schedule, train_iterations
from pretrain.decision import Decision, Reason, StopRules, decide, runs_a_step, signal_check_due
from pretrain.distributed import (
    DistInfo,
    ExitSignal,
    all_gather_objects,
    all_ranks_true,
    broadcast_module_state,
    destroy_distributed,
    init_distributed,
    rank0_result,
)
from pretrain.ds_config import (
    apply_clip_grad,
    check_compile_supported,
    check_precision_supported,
    read_ds_config,
    resolve_batch_sizes,
)
from pretrain.micro_batch import MicroBatchChoice, choose_micro_batch, memory_model
from pretrain.numerics import configure_numerics
from pretrain.parallelize import (
    apply_activation_checkpointing,
    apply_compile,
    build_attention_plans,
    clip_gradients,
    compile_note,
    gathered,
    initialize_engine,
    optimizer_from_block,
)
from pretrain.stragglers import RankTimer, Straggler, find_straggler
from pretrain.throughput import Throughput, device_peak_tflops
from pretrain.watchdog import Watchdog

_BATCH_KEYS = (
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "labels",
    "next_sentence_label",
    "doc_ids",
    "cu_seqlens",
)


def log_line(rec: dict[str, Any], train_iters: int) -> str:
    """The stdout form of a log record: what exists, formatted (no grad norm or loss scale where there is none)."""
    parts = [f"iteration {rec['iteration']}/{train_iters}", f"loss {rec['loss']:.6f}", f"lr {rec['lr']:.3e}"]
    if rec.get("grad_norm") is not None:
        parts.append(f"grad norm {rec['grad_norm']:.4g}")
    if rec.get("loss_scale") is not None:
        parts.append(f"loss scale {rec['loss_scale']:g}")
    if rec.get("aux_loss") is not None:
        parts.append(f"aux loss {rec['aux_loss']:.4g}")
    parts.append(f"skipped {rec['skipped_steps']}")
    if rec.get("tokens_per_s") is not None:
        parts.append(f"tokens/s {rec['tokens_per_s']:.0f}")
    if rec.get("tflops_per_gpu") is not None:
        parts.append(f"TFLOP/s/GPU {rec['tflops_per_gpu']:.3g}")
    if rec.get("mfu") is not None:
        parts.append(f"MFU {100 * rec['mfu']:.1f}%")
    parts.append(f"mem {rec['memory']:.0f} MB")
    return " | ".join(parts)


def device_batch(batch: dict[str, torch.Tensor], device: torch.device, max_predictions: int | None) -> dict[str, Any]:
    """What Trainer._to_device makes of a host batch (benchmarks time the same inputs): the attention mask dropped on
    the host where it masks nothing, the rest copied (pinned and asynchronous on CUDA), and ``max_predictions`` for
    the static MLM gather (None: the boolean-mask head).

    The mask is dropped when it is all ones, and always for packed rows (``doc_ids``: padding carries id -1, a
    document of its own, so no real token attends to it without a key mask; the padding tokens attend to each other
    and carry no label). Attention then runs without a mask (SDPA's unmasked kernels; packed rows: the varlen route
    with ``cu_seqlens``, model/attention/kernels/varlen.py). Under ``--compile`` a padded and an unpadded batch are
    two input signatures, so Dynamo keeps two graphs (tests/test_compile.py holds that count);
    ``cu_seqlens``, whose length is the batch's segment count, is marked dynamic so packed batches share one graph."""
    keys = [k for k in _BATCH_KEYS if k in batch]
    if "attention_mask" in batch and ("doc_ids" in batch or bool(batch["attention_mask"].all())):
        keys.remove("attention_mask")
    if device.type == "cuda":
        out: dict[str, Any] = {k: batch[k].pin_memory().to(device, non_blocking=True) for k in keys}
    else:
        out = {k: batch[k] for k in keys}
    if "cu_seqlens" in out:
        torch._dynamo.maybe_mark_dynamic(out["cu_seqlens"], 0)
    if max_predictions is not None and "labels" in out:
        out["max_predictions"] = max_predictions
    return out


class NonFiniteLossError(RuntimeError):
    """A NaN/inf loss in bf16/fp32 (fp16 overflows are skipped by the loss scaler instead), or a NaN/inf gradient
    norm before a save where DeepSpeed applied that update (bf16.check_grad_overflow off)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated CUDA memory, or peak RSS of this process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check_checkpoint_dirs(run: RunConfig) -> None:
    """Before any work: a --load that does not exist is a typo unless it is --save (the documented first run of
    ``--save X --load X``), and --save must be writable (a read-only one failed at the first save, hours in) and
    never one of the inputs or a directory above one (common/outputs.py)."""
    ck, data = run.checkpoint, run.data
    if ck.load and not os.path.exists(ck.load):
        if not ck.save or os.path.abspath(ck.load) != os.path.abspath(ck.save):
            raise ArgsError(
                f"--load {ck.load}: no such directory; check the path (a first run that saves and resumes in one "
                "place gives the same directory to --save and --load)"
            )
    if ck.load and os.path.exists(ck.load) and not os.path.isdir(ck.load):
        raise ArgsError(f"--load {ck.load} is a file; give the checkpoint directory (it holds `latest`)")
    if ck.save:
        inputs = [("--data-path", p + e) for _, p in data.blend for e in (".bin", ".idx")]
        inputs += [("--vocab-file", data.vocab_file), ("--tokenizer-model", data.tokenizer_model)]
        check_not_input(ck.save, "--save", inputs)
        check_dir_writable(ck.save, "--save")  # every rank probes (its own temporary name): all refuse alike


@dataclasses.dataclass
class ResumePoint:
    """What --load resolved to, before anything is built from it (Trainer._resolve_resume)."""

    tag: str | None
    """The complete checkpoint every rank agreed on (None: start from scratch)."""
    client: dict[str, Any] | None
    """Its client state (iteration, consumed samples, model config, layout state, world size)."""
    resuming: bool
    """A real resume (a tag and not --finetune): iteration, optimizer, scheduler and RNG continue."""
    load_tag: str | None
    """The tag DeepSpeed loads: ``tag``, or the universal checkpoint made from it for another world size."""
    saved_world: int
    """Ranks of the run that saved it (this run's when not resuming)."""
    plan: Any = None
    """pretrain.resume's plan: schedule and optimizer settings to install, notes to print."""


@dataclasses.dataclass
class LogWindow:
    """The steps since the last log: what tokens/s and samples/s are counted over."""

    start: float = dataclasses.field(default_factory=time.perf_counter)
    """perf_counter at the window's start, moved later by the time evaluation and saves took."""
    tokens: int = 0
    samples: int = 0
    iters: int = 0

    def add(self, step: dict[str, Any]) -> None:
        self.tokens += step["tokens"]
        self.samples += step["samples"]
        self.iters += 1


class Trainer:
    def __init__(self, run: RunConfig) -> None:
        """Set-up in the documented order (module docstring); each step is a method below, named for what it does."""
        self.run = run
        self.engine = None
        self._grad_norm = None
        self._signal: ExitSignal | None = None
        self.watchdog: Watchdog | None = None
        self.writer = None
        self.log_file = None
        self.train_iter: Iterator[dict[str, torch.Tensor]] | None = None
        self.faults = faults.from_environment()  # the test-only fault hook: does nothing in a real run
        numerics_notes = self._read_settings()
        self._setup_distributed()
        self.tokenizer = builders.build_tokenizer(self.run.data)
        self.model_config = builders.build_model_config(
            self.run.model, self.run.data, self.tokenizer.vocab_size, self.ds.sparse_attention, self.ds.path
        )
        self._resolve_batch_sizes(numerics_notes)  # after the model config: --micro-batch-size auto estimates it
        point = self._resolve_resume()
        self._build_model_and_engine(point)
        rng = self._load_checkpoint(point)
        self._build_data(rng)
        self._open_logs()
        self.throughput = self._throughput()

    def _read_settings(self) -> list[str]:
        """The ds_config read and checked before any rank starts work (one line naming the file), its optimizer
        block merged into the run's settings, and torch's numerics set before any CUDA op. Returns the notes of
        the numerics settings (printed once rank 0 is known)."""
        run = self.run
        self.ds = read_ds_config(run.system.deepspeed_config)
        check_precision_supported(self.ds)
        check_compile_supported(self.ds, run.system.compile)
        self.run = dataclasses.replace(run, optim=optimizer_from_block(self.ds, run.optim, run.explicit))
        return configure_numerics(run.system.deterministic, run.system.tf32)

    def _setup_distributed(self) -> None:
        """The exit-signal handler (before the slow set-up, so an early signal is not lost), the process group, the
        watchdog, the per-rank timer and (only when the straggler check is on: a start-up collective) every rank's
        host name."""
        system, loop = self.run.system, self.run.loop
        if loop.exit_signal_handler:
            self._signal = ExitSignal(loop.exit_signal)
        self.dist: DistInfo = init_distributed(system.distributed_timeout_minutes, system.local_rank)
        self.rank0 = self.dist.rank == 0
        self.watchdog = Watchdog(system.distributed_timeout_minutes * 60, self.dist.rank, self.dist.world_size)
        self.timer = RankTimer(self.dist.device)
        self._timed_window = False
        straggler_check = self.dist.world_size > 1 and loop.straggler_ratio > 0
        self.hosts = all_gather_objects(socket.gethostname()) if straggler_check else [socket.gethostname()]
        self._print(f"{self.dist.world_size} rank(s), backend {dist.get_backend()}, device {self.dist.device.type}")

    def _resolve_batch_sizes(self, numerics_notes: list[str]) -> None:
        """Micro batch, accumulation steps and global batch (flags and ds_config agreed), gradient clipping written
        into the ds_config, the batch ramp; then the ds_config's and the numerics' notes."""
        run = self.run
        self.micro, self.gas, self.global_batch = resolve_batch_sizes(
            self.ds,
            run.loop.micro_batch_size,
            run.loop.global_batch_size,
            self.dist.world_size,
            choose=self._choose_micro_batch,
            ramp=run.loop.rampup_batch_size,
        )
        if run.loop.micro_batch_size == "auto":  # checkpoints record (and a resume compares) the chosen number
            self.run = run = dataclasses.replace(run, loop=dataclasses.replace(run.loop, micro_batch_size=self.micro))
        apply_clip_grad(self.ds, run.optim.clip_grad)
        self.ramp = None
        if run.loop.rampup_batch_size is not None:
            from pretrain.batch_ramp import BatchRamp

            self.ramp = BatchRamp(run.loop.rampup_batch_size, self.global_batch, self.micro, self.dist.world_size)
        for note in self.ds.notes + numerics_notes:
            self._print(note)

    def _choose_micro_batch(self, per_rank: list[int]) -> MicroBatchChoice:
        """--micro-batch-size auto: the smallest free device memory over the ranks (every rank chooses the same)
        against the model's memory formula; a CPU takes the default (pretrain/micro_batch.py)."""
        device = self.dist.device
        if device.type != "cuda":
            return choose_micro_batch(per_rank, device.type)
        free = torch.cuda.mem_get_info(device)[0]
        if self.dist.world_size > 1:
            free = min(all_gather_objects(free))
        model = memory_model(self.model_config, self.run.data, self.ds.precision)
        return choose_micro_batch(per_rank, device.type, free, model)

    def _resolve_resume(self) -> ResumePoint:
        """Which checkpoint --load means (all ranks agree), the iteration and samples it continues from, the run's
        length and LR schedule, and, when the world size changed, the universal checkpoint DeepSpeed loads instead.
        Checked before the model is built: the directories, the architecture, the settings a resume may change."""
        run, ck, world = self.run, self.run.checkpoint, self.dist.world_size
        check_checkpoint_dirs(run)
        if ck.save and world > 1:  # a node-local --save stops here, not at the first resume
            checkpoint.check_save_dir_shared(ck.save)
        tag, client = checkpoint.agree_on_resume(ck.load, strict=ck.strict_load) if ck.load else (None, None)
        if ck.load and tag is None:
            self._print(f"--load {ck.load}: no complete checkpoint there; starting from scratch")
        resuming = tag is not None and not ck.finetune
        self.iteration = int(client["iteration"]) if resuming else 0
        self.consumed_samples = int(client["consumed_train_samples"]) if resuming else 0
        self.train_iters = self._train_iterations()
        self.schedule = lr_schedule(run.optim, run.loop, self.train_iters)  # in steps, or samples (--train-samples)
        saved_world = int(client.get("world_size") or world) if resuming else world
        point = ResumePoint(tag, client, resuming, tag, saved_world)
        if not resuming:
            return point
        where = f"{ck.load}/{tag}"
        checkpoint.check_architecture(where, client, self.model_config.to_dict())
        point.plan = resume.plan_resume(where, client, run, self.schedule, self.global_batch, self.micro)
        universal = resize.prepare(self.ds, ck.load, tag, client, world)
        if universal is not None:
            point.load_tag = universal
            self._print(
                f"{ck.load}/{tag} was saved by {saved_world} rank(s), this run has {world}: "
                f"ZeRO stage {client.get('zero_stage')} state re-partitioned through DeepSpeed's universal "
                f"checkpoint {ck.load}/{universal}"
            )
        if saved_world != world:
            self._print(
                f"global batch {self.global_batch} kept ({self.gas} accumulation step(s) of {self.micro} on "
                f"{world} rank(s)); the per-rank RNG of {saved_world} rank(s) is not restored, "
                "so dropout masks differ from a run that kept its ranks"
            )
        return point

    def _build_model_and_engine(self, point: ResumePoint) -> None:
        """The model, identical on every rank (seeded before it is built; --finetune weights loaded into it),
        activation checkpointing, then the per-rank seed (dropout differs across data-parallel ranks), DeepSpeed's
        engine and compile (pretrain/parallelize.py's order)."""
        run = self.run
        seed_everything(run.loop.seed)
        model = builders.build_model(self.model_config)
        if run.checkpoint.finetune and point.tag:
            self._load_finetune_weights(model, point.tag, point.client)
        if run.system.activation_checkpointing:
            apply_activation_checkpointing(model)
        seed_everything(run.loop.seed + 100 * self.dist.rank)
        self.engine = initialize_engine(model, self.ds, run.optim, self.schedule, say=self._print)
        if type(self.engine.optimizer).__module__.startswith("optimi"):
            self._print(f"optimizer {type(self.engine.optimizer).__name__} (torch-optimi, a client optimizer)")
        for note in build_attention_plans(self.engine.module, run.data.seq_length, self.dist.device):
            self._print(note)  # which kernel `auto` runs and why (measured table or rule)
        if run.system.compile:
            self._print(apply_compile(self.engine, run.data.seq_length, self.dist.device))
        else:
            self._print(compile_note(False))
        if self.model_config.residual_norm == "triton":  # whether the kernel runs here, or why not
            self._print(fused_norm.route_line(self.dist.device.type, run.system.compile))
        # ZeRO-0 in fp32 or torch_autocast: the trainer clips (DeepSpeed's clipping there loops over the tensors on
        # the host and reports no norm) and keeps the norm (on the device)
        self._own_grad_norm = self.ds.trainer_clips
        self._print_attention_backend()

    def _print_attention_backend(self) -> None:
        """On a GPU, the SDPA backend dense attention takes in training (torch's own choice) and why the faster ones
        refused (e.g. flash takes no mask): model/attention/sdpa_backend.py, torch's rules."""
        cfg = self.model_config
        if cfg.position.type not in ("absolute", "rotary"):
            return
        layers = [cfg.attention.layer(i) for i in range(cfg.num_layers)]
        if any(a.sparsity is not None or a.token_mask is not None or a.kernel not in ("auto", "dense") for a in layers):
            return
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.ds.precision, torch.float32)
        if self.run.data.sample_mode == PACKED:  # the varlen route or the same-document mask, and why
            from model.attention.kernels.varlen import route_line

            self._print(route_line(self.dist.device.type, dtype, cfg.attention_head_size, cfg.attention_dropout))
        if self.dist.device.type != "cuda":
            return
        if self.run.system.deterministic:  # model/attention/kernels/sdpa.py forces the math backend then
            self._print("attention: SDPA math backend (--deterministic on CUDA)")
            return
        from model.attention.sdpa_backend import dense_training_backends, gpu_of_this_machine

        heads, seq = cfg.num_attention_heads, self.run.data.seq_length
        gpu = gpu_of_this_machine()
        line = dense_training_backends(
            self.micro,
            heads,
            seq,
            cfg.attention_head_size,
            dtype,
            cfg.attention_dropout,
            gpu,
            ask_torch=torch.cuda.is_available(),
        )
        self._print(f"{line} (dense attention, dropout {cfg.attention_dropout}; docs/training.md)")

    def _load_checkpoint(self, point: ResumePoint) -> dict[str, Any] | None:
        """A resume's engine state (model, optimizer, scheduler, loss scaler), repaired where DeepSpeed's universal
        load is wrong, the learned layouts, and the planned schedule and optimizer settings. Returns the saved RNG
        state (None: not restored), which is set only after the data iterator is built."""
        if not point.resuming:
            return None
        run, ck, plan = self.run, self.run.checkpoint, point.plan
        same_world = point.saved_world == self.dist.world_size
        restore_rng = same_world and not ck.no_load_rng
        rng = checkpoint.load(self.engine, ck.load, point.load_tag, point.client, restore_rng=restore_rng)
        if point.load_tag != point.tag:  # what DeepSpeed's universal load restores wrongly (pretrain/resize.py)
            for note in resize.repair_universal_load(self.engine.optimizer, ck.load, point.load_tag):
                self._print(f"universal load repaired: {note}")
        if point.client.get("layout_state") is not None:
            self.engine.module.load_layout_state(point.client["layout_state"])  # drops the plans apply_compile built
            if run.system.compile:
                build_attention_plans(self.engine.module, run.data.seq_length, self.dist.device)
        if plan.schedule is not None:
            resume.install_schedule(self.engine.lr_scheduler, plan.schedule)
        if plan.optimizer is not None:
            resume.install_optimizer_settings(self.engine.optimizer, plan.optimizer)
        self._print(
            f"resumed from {ck.load}/{point.tag}: iteration {self.iteration}, {self.consumed_samples} samples consumed"
        )
        for note in plan.notes:
            self._print(note)
        return rng

    def _build_data(self, rng: dict[str, Any] | None) -> None:
        """The datasets (sample index sized for the steps still to run) and this rank's batch iterator from the
        consumed samples on; then the saved RNG (the loader draws nothing from torch's global RNG)."""
        run = self.run
        self.train_ds, self.valid_ds, _ = builders.build_datasets(
            run, self.tokenizer, self._samples_needed(), self.train_iters, self.global_batch
        )
        self.train_iter = self._loader(self.train_ds, self.consumed_samples, run.system.num_workers)
        if rng is not None:
            checkpoint.set_rng_state(rng)

    def _open_logs(self) -> None:
        """Rank 0's TensorBoard writer and JSON-lines log (appended to: a resumed run continues the file)."""
        logging = self.run.logging
        if self.rank0 and logging.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=logging.tensorboard_dir)
        if self.rank0 and logging.log_json:
            Path(logging.log_json).parent.mkdir(parents=True, exist_ok=True)
            self.log_file = open(logging.log_json, "a")

    def _train_iterations(self) -> int:
        """--train-iters, or the steps --train-samples allows; on resume, the samples still to consume are counted
        with this run's global batch (it may differ from the checkpoint's). With a batch ramp, Megatron's count from
        the start: the ramp depends only on consumed samples, so a resume has the same steps."""
        loop = self.run.loop
        if self.ramp is not None:
            return self.ramp.train_iters(loop.train_samples)
        if loop.train_samples is None or self.iteration == 0:
            return train_iterations(loop, self.global_batch)
        remaining = max(0, loop.train_samples - self.consumed_samples) // self.global_batch
        return self.iteration + remaining

    def _samples_needed(self) -> int:
        """Samples the sample index must hold: those consumed plus those of the steps still to run."""
        left = self.train_iters - self.iteration
        if self.ramp is not None:
            return self.ramp.samples_after(self.consumed_samples, left)
        return self.consumed_samples + left * self.global_batch

    def _step_batch(self) -> tuple[int, int]:
        """(global batch, accumulation steps) of the next step: the ramp's (DeepSpeed's engine told), else fixed."""
        if self.ramp is None:
            return self.global_batch, self.gas
        batch = self.ramp.batch_at(self.consumed_samples)
        if batch != self.engine.train_batch_size():
            self.engine.set_train_batch_size(batch)
        return batch, batch // (self.micro * self.dist.world_size)

    # ------------------------------------------------------------------ helpers
    def _print(self, msg: str) -> None:
        if self.rank0:
            print(f"[pretrain] {msg}", flush=True)

    def _loader(
        self, dataset, consumed: int, num_workers: int, valid: bool = False
    ) -> Iterator[dict[str, torch.Tensor]]:
        """This rank's batches from sample ``consumed`` on (the loader draws nothing from torch's global RNG, so
        restoring the RNG on resume and building the loader commute)."""
        return iter(
            builders.build_dataloader(
                self.run,
                dataset,
                self.tokenizer,
                self.micro,
                self.dist.rank,
                self.dist.world_size,
                consumed,
                num_workers,
                valid=valid,
            )
        )

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The model's inputs on this rank's device. Decisions that need the values are made here, on the host
        batch, so the step never waits for the device: an attention mask that masks nothing is dropped (the model
        then runs unmasked attention, compiled or not: see :func:`device_batch`), and the MLM head gathers a fixed
        number of positions per sample (the masker's cap, DataConfig.max_predictions; --dynamic-mlm-gather selects
        with a boolean mask instead). On CUDA the tensors are staged through pinned memory, so the copy is
        asynchronous."""
        return device_batch(batch, self.dist.device, self.run.data.max_predictions)

    @staticmethod
    def _tokens(batch: dict[str, torch.Tensor]) -> int:
        """Real (unpadded) tokens of a host batch."""
        mask = batch.get("attention_mask")
        return int(mask.sum()) if mask is not None else batch["input_ids"].numel()

    def _load_finetune_weights(self, model: torch.nn.Module, tag: str, client: dict[str, Any]) -> None:
        """Phase 2 of a two-phase run: weights only, position table extended when the model got longer.

        Rank 0 reads the checkpoint (for ZeRO, every rank's shards: one consolidation instead of one per rank) and
        broadcasts the weights; the other ranks read nothing.
        """
        load_dir = self.run.checkpoint.load
        diffs = checkpoint.architecture_differences(
            client.get("model_config", {}), self.model_config.to_dict(), allow={"max_position_embeddings"}
        )
        if diffs:
            raise checkpoint.CheckpointError(
                f"--finetune {load_dir}/{tag}: the model differs beyond "
                "max_position_embeddings:\n  " + "\n  ".join(diffs)
            )

        def read() -> list[str]:
            weights = checkpoint.load_fp32_weights(load_dir, tag)
            extended = checkpoint.extend_position_embeddings(weights, model)
            model.load_state_dict(weights, strict=True)
            return extended

        for line in rank0_result(read):
            self._print(f"extended {line}")
        broadcast_module_state(model, self.dist.device)
        if client.get("layout_state") is not None:
            model.load_layout_state(client["layout_state"])
        self._print(f"--finetune: loaded weights of {load_dir}/{tag}; iteration, optimizer and LR warmup restart")

    # ------------------------------------------------------------------ steps
    def micro_batches(self, gas: int) -> Iterator[tuple[dict[str, Any], int]]:
        """The data one step consumes: ``gas`` micro-batches of this rank (the accumulation), each on the device with
        its real (unpadded) token count, read from ``train_iter`` inside the data time the straggler check measures."""
        for _ in range(gas):
            try:
                with self.timer.data():
                    self.faults.before_micro_batch(self.dist.rank)
                    host = next(self.train_iter)
            except StopIteration:
                raise RuntimeError(
                    f"the training data ran out at iteration {self.iteration + 1}; the sample index "
                    "was built for fewer samples than --train-iters x --global-batch-size"
                ) from None
            tokens = self._tokens(host)
            yield self._to_device(host), tokens

    def micro_step(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward and backward of one micro-batch. Returns its loss (auxiliary loss included) and auxiliary loss,
        detached and still on the device."""
        engine = self.engine
        with self.timer.forward():
            out = engine(**batch)
        loss = out.loss
        aux = engine.module.auxiliary_loss()
        if aux is not None:
            loss = loss + aux
        loss = self.faults.on_loss(loss, self.iteration + 1, self.dist.rank)
        engine.backward(loss)
        return loss.detach(), None if aux is None else aux.detach()

    def train_step(self) -> dict[str, Any]:
        """One optimizer step over `gas` micro-batches. Raises NonFiniteLossError on every rank together.

        Nothing here waits for the device except, in bf16/fp32, the one all-reduce per step that decides (on all
        ranks together, before the update) whether the loss was finite; fp16 leaves that to the loss scaler.
        Loss and auxiliary-loss sums stay on the device until a log interval reads them; tokens are counted on the
        host batch.
        """
        engine, device = self.engine, self.dist.device
        skipped_before = engine.skipped_steps
        batch_size, gas = self._step_batch()
        # the LR this step uses: counting samples, the schedule counts this step's batch (a ramp changes it)
        increment = batch_size if engine.lr_scheduler.unit == "samples" else 1
        engine.lr_scheduler.set_next_increment(increment)
        lr = engine.get_lr()[0]
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        tokens = 0
        aux_sum = None
        for micro, (batch, batch_tokens) in enumerate(self.micro_batches(gas)):
            last = micro == gas - 1
            if self.ramp is not None:  # DeepSpeed's own count of micro-steps assumes a fixed accumulation
                engine.set_gradient_accumulation_boundary(last)
            tokens += batch_tokens
            loss, aux = self.micro_step(batch)
            if aux is not None:
                aux_sum = aux.double() + (0.0 if aux_sum is None else aux_sum)
            loss_sum += loss.double()
            if last:
                self._before_update(loss_sum)
            engine.step(lr_kwargs={"increment": increment})
        self.iteration += 1
        self.consumed_samples += batch_size
        return {
            "loss_sum": loss_sum / gas,
            "tokens": tokens,
            "samples": batch_size,
            "skipped": engine.skipped_steps - skipped_before,
            "aux_loss": None if aux_sum is None else aux_sum / gas,
            "lr": lr,
        }

    def _before_update(self, loss_sum: torch.Tensor) -> None:
        """At the accumulation boundary (gradients reduced, update not yet applied): stop every rank together on a
        non-finite loss (bf16/fp32), and clip where DeepSpeed does not (ds.trainer_clips: ZeRO-0 fp32 or autocast)."""
        if self.ds.precision != "fp16" and not all_ranks_true(torch.isfinite(loss_sum), self.dist.device):
            raise NonFiniteLossError(
                f"non-finite loss at iteration {self.iteration + 1} ({self.ds.precision}); every rank stopped "
                f"before the update. Last complete checkpoint: {self._last_checkpoint_text()}"
            )
        if self._own_grad_norm:
            self._grad_norm = clip_gradients(self.engine.module, self.ds.clip_grad)

    def _refuse_nonfinite_update(self) -> None:
        """With bf16.check_grad_overflow off (the shipped bf16 ZeRO-1/2 configs: that check reads the norm back every
        step) DeepSpeed applies an update whose gradients were not finite instead of skipping it, and the next step's
        loss stops the run. No checkpoint is written from such a state: one read of the last step's gradient norm
        before a save (all-reduced by DeepSpeed: every rank decides alike)."""
        norm = self.engine.get_global_grad_norm()
        if norm is not None and not math.isfinite(float(norm)):
            raise NonFiniteLossError(
                f"non-finite gradient norm at iteration {self.iteration} (bf16, check_grad_overflow false in "
                f"{self.ds.path}): the update was applied, so nothing is saved; every rank stopped. Last complete "
                f"checkpoint: {self._last_checkpoint_text()}"
            )

    def _last_checkpoint_text(self) -> str:
        save = self.run.checkpoint.save or self.run.checkpoint.load
        tag = checkpoint.find_resume_tag(save) if save else None
        return f"{save}/{tag} (resume with --load {save})" if tag else "none"

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation MLM loss, perplexity, masked-token accuracy (and NSP accuracy); leaves training RNG untouched.

        Sums stay on the device; one all-reduce and one read at the end."""
        if self.valid_ds is None:
            self._print(f"no validation data (split {self.run.data.split}); evaluation skipped")
            return {}
        state = checkpoint.rng_state()
        self.engine.eval()
        # mlm loss x count, mlm correct, mlm count, nsp correct, nsp count
        sums = torch.zeros(5, dtype=torch.float64, device=self.dist.device)
        it = self._loader(self.valid_ds, 0, 0, valid=True)
        for _ in range(self.run.loop.eval_iters):
            try:
                batch = self._to_device(next(it))
            except StopIteration:
                break
            out = self.engine(**batch)
            self.watchdog.progress()
            sums[0] += out.mlm_loss.double() * out.mlm_count
            sums[1] += out.mlm_correct
            sums[2] += out.mlm_count
            if out.nsp_logits is not None and "next_sentence_label" in batch:
                sums[3] += (out.nsp_logits.argmax(-1) == batch["next_sentence_label"].view(-1)).sum()
                sums[4] += batch["next_sentence_label"].numel()
        self.engine.train()
        checkpoint.set_rng_state(state)
        dist.all_reduce(sums)
        s = sums.tolist()
        loss = s[0] / max(s[2], 1.0)
        out = {"loss": loss, "perplexity": math.exp(min(loss, 50.0)), "mlm_accuracy": s[1] / max(s[2], 1.0)}
        if s[4]:
            out["nsp_accuracy"] = s[3] / s[4]
        return out

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> None:
        if self.ds.applies_nonfinite_grads:
            self._refuse_nonfinite_update()
        rng = checkpoint.rng_state()  # first: what follows may draw random numbers
        module = self.engine.module
        client = {
            "iteration": self.iteration,
            "consumed_train_samples": self.consumed_samples,
            "model_config": self.model_config.to_dict(),
            "args": self.run.to_dict(),
            "layout_state": module.layout_state(),
            "world_size": self.dist.world_size,
            # what deepspeed.checkpoint.ds_to_universal requires of a checkpoint (a plain data-parallel model)
            UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE},
        }
        save_dir = self.run.checkpoint.save
        with write_errors(f"--save {save_dir}: saving iteration {self.iteration}", save_dir):
            tag = checkpoint.save(self.engine, save_dir, self.iteration, client, self.run.checkpoint.keep_last, rng)
        checkpoint.set_rng_state(rng)  # a run that saves continues exactly like one that does not
        self._print(f"saved {self.run.checkpoint.save}/{tag}")

    # ------------------------------------------------------------------ loop
    def train(self) -> bool:
        """Run to --train-iters (or --exit-interval). Returns False when --exit-signal-handler stopped the run early
        (after saving), True otherwise.

        Each step: the fault hook, train_step, the log and evaluation where due, then pretrain/decision.py's
        decision (the signal asked only where it is due: a collective), a save, an exit."""
        loop = self.run.loop
        rules = StopRules.of(loop, self.run.checkpoint, self.train_iters)
        self.engine.train()
        window = LogWindow()
        self.watchdog.arm()
        decision = None
        while runs_a_step(self.iteration, rules):
            self.faults.before_step(self.iteration + 1, self.dist.rank)
            step = self.train_step()
            self.watchdog.progress(self.iteration)
            window.add(step)
            if self.iteration % loop.log_interval == 0 or self.iteration == self.train_iters:
                self._log(step, window)
                window = LogWindow()
            paused = time.perf_counter()
            if loop.eval_interval and self.iteration % loop.eval_interval == 0:
                self._log_eval(self.evaluate())
            signalled = signal_check_due(self.iteration, rules) and self._signal.received_anywhere(self.dist.device)
            decision = decide(self.iteration, rules, signalled)
            if decision.saves:
                self.save()
                self.watchdog.progress()
            # evaluation and checkpointing are not training: keep them out of the window's tokens/s (as
            # Megatron-LM stops its interval timer around evaluation)
            window.start += time.perf_counter() - paused
            if decision.exits:
                self._say_why(decision)
                break
        self._export_dam_masks()
        self._drain()
        return decision is None or decision.reason is not Reason.SIGNAL

    def _say_why(self, decision: Decision) -> None:
        """The line of a run that stops before --train-iters (nothing for a finished run)."""
        ckpt, loop = self.run.checkpoint, self.run.loop
        if decision.reason is Reason.SIGNAL:
            saved = (
                f"saved {ckpt.save}; run the same command with --load {ckpt.save}"
                if decision.saves
                else "nothing saved (no --save)"
            )
            name = self._signal.received_name or loop.exit_signal
            self._print(f"{name} received: stopping at iteration {self.iteration}; {saved}")
        elif decision.reason is Reason.EXIT_INTERVAL:
            self._print(f"--exit-interval {loop.exit_interval}: stopping at iteration {self.iteration}")

    def _drain(self) -> None:
        """Every rank's collectives finish before any rank leaves, so no rank tears down its sockets while a peer is
        still in a collective. (The gloo abort at interpreter exit this once tried to prevent is avoided by the entry
        point leaving without finalization: common.process.exit_process.)"""
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def _export_dam_masks(self) -> None:
        """A DAM search run ends by writing the binarized learned masks (input of the fixed-mask stage)."""
        module = self.engine.module
        token_mask = getattr(module.config.attention, "token_mask", None) or {}
        if token_mask.get("pattern") != "dam" or not self.run.checkpoint.save:
            return
        with gathered(module.mask_parameters(), self.ds.zero_stage):
            masks = module.export_learned_masks()
        if self.rank0:
            from model.attention.sparsebert import save_masks

            path = Path(self.run.checkpoint.save, "learned_masks.pt")
            save_masks(str(path), masks)
            self._print(
                f"exported the learned DAM masks to {path} (train stage 2 with attention.token_mask = "
                f'{{"pattern": "file", "path": "{path}"}})'
            )

    def _throughput(self) -> Throughput:
        """FLOPs per real token of this model and data (model.flops; the MLM head counted at --mask-prob of the
        tokens) and the peak MFU divides by; says once where the peak comes from, or why MFU is left out."""
        data = self.run.data
        fpt = model_flops_per_token(self.model_config, data.seq_length, data.mask_prob)
        peak, source = device_peak_tflops(self.dist.device, self.ds.precision, self.run.logging.peak_tflops)
        mfu = f"MFU against {peak:g} TFLOP/s per GPU ({source})" if peak else f"MFU not logged: {source}"
        self._print(f"model FLOPs per real token {fpt:.4g} (padding excluded); TFLOP/s per GPU logged; {mfu}")
        return Throughput(fpt, self.dist.world_size, peak)

    def _log(self, step: dict[str, Any], window: LogWindow) -> None:
        engine = self.engine
        loss, tokens, skipped_max, skipped_min = self._dp_mean_and_counts(step, window.tokens)
        elapsed = time.perf_counter() - window.start  # after the read: the device finished the window's work
        if skipped_max != skipped_min:
            raise RuntimeError(
                f"ranks disagree on skipped fp16 steps at iteration {self.iteration} ({skipped_min} vs {skipped_max})"
            )
        lr = step["lr"]
        grad_norm = self._grad_norm if self._own_grad_norm else engine.get_global_grad_norm()
        grad_norm = None if grad_norm is None else float(grad_norm)
        scale = float(engine._get_optimizer_loss_scale()) if self.ds.precision == "fp16" else None
        rec = {
            "iteration": self.iteration,
            "loss": loss,
            "lr": lr,
            "loss_scale": scale,
            "grad_norm": grad_norm,
            "skipped_steps": int(skipped_max),
            "consumed_samples": self.consumed_samples,
            "tokens_per_s": tokens / elapsed if elapsed > 0 else None,
            "samples_per_s": window.samples / elapsed if elapsed > 0 else None,
            "tflops_per_gpu": self.throughput.tflops_per_gpu(tokens / elapsed) if elapsed > 0 else None,
            "mfu": self.throughput.mfu(tokens / elapsed) if elapsed > 0 else None,
            "memory": peak_memory_mb(self.dist.device),
        }  # MB
        if self.ramp is not None:
            rec["global_batch_size"] = step["samples"]
        if step["aux_loss"] is not None:
            rec["aux_loss"] = float(step["aux_loss"])
        straggler = self._straggler(elapsed)
        if straggler is not None:
            rec["straggler_rank"], rec["straggler_ratio"] = straggler.rank, round(straggler.ratio, 2)
        mask_stats = getattr(engine.module, "mask_stats", None)
        if mask_stats is not None:  # DAM / token-mask sparsity (every rank: gathering is a collective under ZeRO-3)
            with gathered(engine.module.mask_parameters(), self.ds.zero_stage):
                rec.update({k: float(v) for k, v in mask_stats().items()})
        if not self.rank0:
            return
        print("[pretrain] " + log_line(rec, self.train_iters), flush=True)
        if straggler is not None:
            print("[pretrain] " + straggler.line(self.iteration, window.iters), flush=True)
        if self.log_file:
            self.log_file.write(json.dumps(rec) + "\n")
            self.log_file.flush()
        if self.writer:
            tb = dict(rec)
            tb["perplexity"] = math.exp(min(loss, 50.0))
            for k, v in tb.items():
                if k not in ("iteration",) and v is not None:
                    self.writer.add_scalar(f"train/{k}", v, self.iteration)
            self.writer.flush()

    def _straggler(self, window_s: float) -> Straggler | None:
        """Every rank's data and forward time of the window, gathered (every rank: a collective); rank 0 judges."""
        mine = torch.tensor(self.timer.take(), dtype=torch.float64, device=self.dist.device)
        ratio = self.run.loop.straggler_ratio
        first, self._timed_window = not self._timed_window, True
        if self.dist.world_size < 2 or not ratio or first:  # the first window holds each rank's warm-up
            return None
        every = [torch.zeros_like(mine) for _ in range(self.dist.world_size)]
        dist.all_gather(every, mine)
        return find_straggler([tuple(t.tolist()) for t in every], self.hosts, ratio, window_s)

    def _dp_mean_and_counts(self, step: dict[str, Any], window_tokens: int) -> tuple[float, float, int, int]:
        """Mean loss over ranks, total tokens, max and min of the skipped-step counter (read once, at a log)."""
        device = self.dist.device
        sums = torch.stack(
            [
                step["loss_sum"].to(device, torch.float64),
                torch.tensor(float(window_tokens), dtype=torch.float64, device=device),
            ]
        )
        skipped = float(self.engine.skipped_steps)
        extremes = torch.tensor([skipped, -skipped], dtype=torch.float64, device=device)
        dist.all_reduce(sums)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
        loss, tokens = sums.tolist()
        high, neg_low = extremes.tolist()
        return loss / self.dist.world_size, tokens, int(high), int(-neg_low)

    def _log_eval(self, metrics: dict[str, float]) -> None:
        if not self.rank0 or not metrics:
            return
        print(
            f"[pretrain] validation at iteration {self.iteration}: "
            + " | ".join(f"{k} {v:.6f}" for k, v in metrics.items()),
            flush=True,
        )
        if self.log_file:
            self.log_file.write(json.dumps({"iteration": self.iteration, "valid": metrics}) + "\n")
            self.log_file.flush()
        if self.writer:
            for k, v in metrics.items():
                self.writer.add_scalar(f"valid/{k}", v, self.iteration)
            self.writer.flush()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Flush outputs, stop the loader's workers, restore signal handlers, destroy the process group; safe after any
        failure, safe twice. The entry point then leaves without interpreter finalization (pretrain/train.py), so
        everything that must reach the disk or be joined is done here."""
        if self.train_iter is not None:  # joins the DataLoader's worker processes now, not at interpreter exit
            close_iter = getattr(self.train_iter, "close", None)
            if close_iter is not None:
                close_iter()
            self.train_iter = None
        if self._signal is not None:
            self._signal.restore()
            self._signal = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None
        if self.engine is not None:  # DeepSpeed's own teardown (ZeRO-3 hooks, optimizer) while Python is whole
            self.engine.destroy()
            self.engine = None
        destroy_distributed()
        if self.watchdog is not None:  # armed until here: a teardown that hangs on a lost peer ends too
            self.watchdog.stop()
            self.watchdog = None

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
