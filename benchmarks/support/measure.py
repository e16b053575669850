"""Measurement helpers of benchmarks/profile_memory.py and the benchmarks: synthetic batches, tensor bytes, the bytes
autograd saves for backward, and best-of-n step timing (wall and process CPU time)."""

from __future__ import annotations

import time

import torch

MB = 2**20


def synthetic_batch(batch: int, seq_len: int, vocab: int, device: torch.device, seed: int = 0) -> dict:
    """A seeded MLM batch of random ids (15% of positions labelled), for timing and memory runs."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (batch, seq_len), generator=g)
    labels = torch.where(torch.rand(batch, seq_len, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids).to(device), "labels": labels.to(device)}


def tensor_bytes(tensors) -> int:
    """Bytes of the given tensors' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


class SavedActivations:
    """Sum of distinct storages autograd keeps for backward (parameters excluded)."""

    def __init__(self, params) -> None:
        self.param_ptrs = {p.data_ptr() for p in params}
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            storage = t.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return t
        if ptr not in self.param_ptrs and ptr not in self.seen:
            self.seen[ptr] = nbytes
        return t

    @property
    def bytes(self) -> int:
        return sum(self.seen.values())


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batch: dict) -> None:
    """Forward, backward and optimizer step of a model returning ``.loss``."""
    out = model(**batch)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def timed_steps(step, steps: int, dev: torch.device) -> tuple[float, float]:
    """(best wall seconds, CPU seconds of that step) over `steps` runs of `step`."""
    best = (float("inf"), 0.0)
    for _ in range(steps):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best
