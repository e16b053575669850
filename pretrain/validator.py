"""The trainer's validation part: MLM loss, perplexity, masked-token accuracy (and NSP accuracy) over held-out
batches, summed on the device and read once; the training RNG is left as it was."""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from pretrain import checkpoint


class Validator:
    """``batches()`` gives this rank's held-out host batches from the first (None: no validation split);
    ``to_device`` makes a host batch the model's input (the trainer's); ``progress`` tells the watchdog a batch
    finished; at most ``eval_iters`` batches per evaluation."""

    def __init__(
        self,
        engine,
        batches: Callable[[], Iterator[dict[str, torch.Tensor]]] | None,
        to_device: Callable[[dict[str, torch.Tensor]], dict[str, Any]],
        eval_iters: int,
        device: torch.device,
        progress: Callable[[], None] = lambda: None,
        say: Callable[[str], None] = print,
        split: str = "",
    ) -> None:
        self.engine, self.batches, self.to_device, self.eval_iters = engine, batches, to_device, eval_iters
        self.device, self.progress, self.say, self.split = device, progress, say, split

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Validation MLM loss, perplexity, masked-token accuracy (and NSP accuracy); leaves training RNG untouched.

        Sums stay on the device; one all-reduce and one read at the end."""
        if self.batches is None:
            self.say(f"no validation data (split {self.split}); evaluation skipped")
            return {}
        state = checkpoint.rng_state()
        self.engine.eval()
        # mlm loss x count, mlm correct, mlm count, nsp correct, nsp count
        sums = torch.zeros(5, dtype=torch.float64, device=self.device)
        it = self.batches()
        for _ in range(self.eval_iters):
            try:
                batch = self.to_device(next(it))
            except StopIteration:
                break
            out = self.engine(**batch)
            self.progress()
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
