"""The trainer's validation part alone (pretrain/validator.py) on a real one-rank process group and a real tiny
model: its loss, perplexity and accuracies equal a direct computation over the same held-out batches (the model's
logits, torch's cross entropy), at most --eval-iters batches are read, the training RNG and train mode are left as
they were, and a run without a validation split says so and returns nothing."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from model.bert import BertForPreTraining
from model.config import ModelConfig
from pretrain.batches import device_batch
from pretrain.validator import Validator
from tests.one_rank import one_rank_group

V, N = 64, 16


def held_out(n: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """``n`` batches of 3 rows: random tokens, 4 labelled positions per row, an NSP label per row."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(5, V, (3, N), generator=g)
        labels = torch.full((3, N), -100)
        for r in range(3):
            pos = torch.randperm(N, generator=g)[:4]
            labels[r, pos] = ids[r, pos]
            ids[r, pos] = 4  # [MASK]
        out.append(
            {
                "input_ids": ids,
                "attention_mask": torch.ones(3, N, dtype=torch.long),
                "token_type_ids": torch.zeros(3, N, dtype=torch.long),
                "labels": labels,
                "next_sentence_label": torch.randint(0, 2, (3,), generator=g),
            }
        )
    return out


def reference(model: BertForPreTraining, batches: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """The same metrics from the model's logits over the whole vocabulary: mean cross entropy over every labelled
    position, accuracy of the arg-max there, NSP accuracy."""
    losses, right, nsp_right, nsp = [], 0, 0, 0
    with torch.no_grad():
        for b in batches:
            out = model(b["input_ids"], token_type_ids=b["token_type_ids"])
            sel = b["labels"] != -100
            logits, labels = out.logits[sel], b["labels"][sel]
            losses.append(F.cross_entropy(logits.float(), labels, reduction="none"))
            right += int((logits.argmax(-1) == labels).sum())
            nsp_right += int((out.nsp_logits.argmax(-1) == b["next_sentence_label"]).sum())
            nsp += b["next_sentence_label"].numel()
    loss = float(torch.cat(losses).mean())
    count = sum(len(x) for x in losses)
    return {"loss": loss, "perplexity": math.exp(loss), "mlm_accuracy": right / count, "nsp_accuracy": nsp_right / nsp}


def test_validation_metrics_equal_a_direct_computation_and_leave_the_training_rng(tmp_path):
    torch.manual_seed(0)
    model = BertForPreTraining(ModelConfig.preset("tiny", vocab_size=V, nsp_head=True))
    batches = held_out(5)
    progress = []
    with one_rank_group(tmp_path) as info:
        validator = Validator(
            model,
            lambda: iter(batches),
            lambda b: device_batch(b, info.device, None),
            eval_iters=3,
            device=info.device,
            progress=lambda: progress.append(1),
        )
        model.train()
        torch.manual_seed(11)
        expected_draw = torch.rand(4)
        torch.manual_seed(11)
        got = validator.evaluate()
        assert torch.equal(torch.rand(4), expected_draw) and model.training
    model.eval()
    want = reference(model, batches[:3])  # --eval-iters 3 of the 5
    assert got.keys() == want.keys() and len(progress) == 3
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-5), k


def test_without_a_validation_split_evaluation_is_skipped_with_a_line():
    said = []
    validator = Validator(None, None, lambda b: b, 3, torch.device("cpu"), say=said.append, split="100,0,0")
    assert validator.evaluate() == {} and said == ["no validation data (split 100,0,0); evaluation skipped"]
