"""The trainer's metrics part: the log window, the one read of the window's loss and counters at a log interval,
throughput (tokens/s, TFLOP/s per GPU, MFU), the straggler check, and rank 0's outputs: the console line, the
JSON-lines log (--log-json) and TensorBoard (``train/<key>``, ``valid/<key>``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import resource
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from model.flops import model_flops_per_token
from pretrain.distributed import DistInfo
from pretrain.parallelize import gathered
from pretrain.stragglers import RankTimer, Straggler, find_straggler
from pretrain.throughput import Throughput, device_peak_tflops

_LINE_FIELDS = (
    ("loss", "loss {:.6f}"),
    ("lr", "lr {:.3e}"),
    ("grad_norm", "grad norm {:.4g}"),
    ("loss_scale", "loss scale {:g}"),
    ("aux_loss", "aux loss {:.4g}"),
    ("skipped_steps", "skipped {}"),
    ("tokens_per_s", "tokens/s {:.0f}"),
    ("tflops_per_gpu", "TFLOP/s/GPU {:.3g}"),
    ("mfu", "MFU {:.1%}"),
    ("memory", "mem {:.0f} MB"),
)
"""A log record's keys in the console line's order, with their formats."""
_ALWAYS = {"loss", "lr", "skipped_steps", "memory"}
"""Keys every record has; the others are printed only where the record holds a value."""


def log_line(rec: dict[str, Any], train_iters: int) -> str:
    """The stdout form of a log record: what exists, formatted (no grad norm or loss scale where there is none)."""
    parts = [f"iteration {rec['iteration']}/{train_iters}"]
    parts += [fmt.format(rec[key]) for key, fmt in _LINE_FIELDS if key in _ALWAYS or rec.get(key) is not None]
    return " | ".join(parts)


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated CUDA memory, or peak RSS of this process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


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


def throughput_for(
    model_config, data, device: torch.device, precision: str, peak_tflops: float | None, world: int, say
) -> Throughput:
    """FLOPs per real token of this model and data (model.flops; the MLM head counted at --mask-prob of the
    tokens) and the peak MFU divides by; says once where the peak comes from, or why MFU is left out."""
    fpt = model_flops_per_token(model_config, data.seq_length, data.mask_prob)
    peak, source = device_peak_tflops(device, precision, peak_tflops)
    mfu = f"MFU against {peak:g} TFLOP/s per GPU ({source})" if peak else f"MFU not logged: {source}"
    say(f"model FLOPs per real token {fpt:.4g} (padding excluded); TFLOP/s per GPU logged; {mfu}")
    return Throughput(fpt, world, peak)


class MetricsLogger:
    """What the log interval reads and writes. Every rank calls :meth:`log` (its reads are collectives); rank 0
    prints and writes. ``engine`` is DeepSpeed's (skipped steps, gradient norm, loss scale, the model's mask
    statistics); ``own_grad_norm``: the trainer clips and hands the norm to :meth:`log` (ds.trainer_clips)."""

    def __init__(
        self,
        run,
        ds,
        dist_info: DistInfo,
        engine,
        throughput: Throughput,
        timer: RankTimer,
        hosts: list[str],
        train_iters: int,
        own_grad_norm: bool = False,
        ramp: bool = False,
    ) -> None:
        self.run, self.ds, self.dist, self.engine = run, ds, dist_info, engine
        self.throughput, self.timer, self.hosts, self.train_iters = throughput, timer, hosts, train_iters
        self.own_grad_norm, self.ramp = own_grad_norm, ramp
        self.rank0 = dist_info.rank == 0
        self._timed_window = False
        self.writer = None
        self.log_file = None
        logging = run.logging
        if self.rank0 and logging.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=logging.tensorboard_dir)
        if self.rank0 and logging.log_json:  # appended to: a resumed run continues the file
            Path(logging.log_json).parent.mkdir(parents=True, exist_ok=True)
            self.log_file = open(logging.log_json, "a")

    def log(
        self, step: dict[str, Any], window: LogWindow, iteration: int, consumed_samples: int, grad_norm=None
    ) -> dict[str, Any]:
        """The window's record (mean loss over ranks, throughput, memory, straggler, mask statistics), printed and
        written by rank 0; returns it (every rank)."""
        engine = self.engine
        loss, tokens, skipped_max, skipped_min = self._dp_mean_and_counts(step, window.tokens)
        elapsed = time.perf_counter() - window.start  # after the read: the device finished the window's work
        if skipped_max != skipped_min:
            raise RuntimeError(
                f"ranks disagree on skipped fp16 steps at iteration {iteration} ({skipped_min} vs {skipped_max})"
            )
        grad_norm = grad_norm if self.own_grad_norm else engine.get_global_grad_norm()
        grad_norm = None if grad_norm is None else float(grad_norm)
        scale = float(engine._get_optimizer_loss_scale()) if self.ds.precision == "fp16" else None
        rate = tokens / elapsed if elapsed > 0 else None
        rec = {
            "iteration": iteration,
            "loss": loss,
            "lr": step["lr"],
            "loss_scale": scale,
            "grad_norm": grad_norm,
            "skipped_steps": int(skipped_max),
            "consumed_samples": consumed_samples,
            "tokens_per_s": rate,
            "samples_per_s": window.samples / elapsed if elapsed > 0 else None,
            "tflops_per_gpu": self.throughput.tflops_per_gpu(rate) if elapsed > 0 else None,
            "mfu": self.throughput.mfu(rate) if elapsed > 0 else None,
            "memory": peak_memory_mb(self.dist.device),
        }  # MB
        if self.ramp:
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
            return rec
        print("[pretrain] " + log_line(rec, self.train_iters), flush=True)
        if straggler is not None:
            print("[pretrain] " + straggler.line(iteration, window.iters), flush=True)
        self._write_json(rec)
        if self.writer:
            tb = dict(rec)
            tb["perplexity"] = math.exp(min(loss, 50.0))
            for k, v in tb.items():
                if k not in ("iteration",) and v is not None:
                    self.writer.add_scalar(f"train/{k}", v, iteration)
            self.writer.flush()
        return rec

    def log_eval(self, metrics: dict[str, float], iteration: int) -> None:
        """Validation metrics (:class:`pretrain.validator.Validator`), rank 0's line, JSON record and scalars."""
        if not self.rank0 or not metrics:
            return
        print(
            f"[pretrain] validation at iteration {iteration}: "
            + " | ".join(f"{k} {v:.6f}" for k, v in metrics.items()),
            flush=True,
        )
        self._write_json({"iteration": iteration, "valid": metrics})
        if self.writer:
            for k, v in metrics.items():
                self.writer.add_scalar(f"valid/{k}", v, iteration)
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the outputs; safe twice."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        if self.log_file is not None:
            self.log_file.close()
            self.log_file = None

    def _write_json(self, rec: dict[str, Any]) -> None:
        if self.log_file:
            self.log_file.write(json.dumps(rec) + "\n")
            self.log_file.flush()

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
