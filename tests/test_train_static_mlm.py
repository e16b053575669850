"""The static MLM gather (the default, with a derived or given --max-predictions-per-seq): through the real trainer it
trains like the dynamic one (--dynamic-mlm-gather) when the cap never binds; through the loader a binding cap holds
in every batch and changes nothing else; the derived cap almost never binds."""

from __future__ import annotations

import pytest

from tests import train_utils as tu


def _losses(tmp_path, runs: dict[str, list[str]]) -> dict[str, list[float]]:
    """The logged losses of one tiny ZeRO-1 fp32 trainer run per entry (its extra flags), dropout 0."""
    tu.prepare(tmp_path)

    def run(name: str) -> list[float]:
        log = tmp_path / f"{name}.jsonl"
        args = tu.train_args(tmp_path, "zero1_fp32.json", 4, "--log-json", str(log), *runs[name], global_batch=4)
        p = tu.launch("python", [*args, "--hidden-dropout", "0", "--attention-dropout", "0"])
        assert p.returncode == 0, p.stdout[-3000:]
        return [r["loss"] for r in tu.train_records(log)]

    return {name: run(name) for name in runs}


@pytest.mark.timeout(300)
def test_static_gather_matches_dynamic_when_the_cap_never_binds(tmp_path):
    """The trainer's default, the static gather with the derived cap (32 at N=64, never bound here), trains like the
    dynamic one. The extended tier checks a given --max-predictions-per-seq against it."""
    losses = _losses(tmp_path, {"dynamic": ["--dynamic-mlm-gather"], "derived": []})
    assert len(losses["derived"]) == 4
    assert losses["derived"] == pytest.approx(losses["dynamic"], rel=1e-5)


@pytest.mark.extended  # a third trainer launch: the given cap's path; the default tier's canary is the one above
@pytest.mark.timeout(300)
def test_a_given_cap_that_never_binds_trains_like_the_derived_one(tmp_path):
    losses = _losses(tmp_path, {"derived": [], "static": ["--max-predictions-per-seq", "64"]})
    assert len(losses["static"]) == 4
    assert losses["derived"] == losses["static"]  # the derived cap (32 at N=64) never bound here either


def test_binding_cap_holds_in_every_batch_and_leaves_other_samples_alone(tmp_path):
    """The loader with max_predictions_per_seq: no row over the cap, rows under it identical to the uncapped
    loader's, and the static gather's loss equals the dynamic path's on those batches."""
    import torch

    from data_pipeline.batching import build_dataloader
    from data_pipeline.data_config import DataConfig
    from data_pipeline.datasets import build_datasets
    from data_pipeline.tokenization import build_tokenizer
    from model.bert import BertForPreTraining
    from model.config import ModelConfig

    tu.prepare(tmp_path)
    tok = build_tokenizer("BertWordPieceLowerCase", vocab_file=str(tmp_path / "vocab.txt"))
    batches = {}
    for cap in (None, 4):
        cfg = DataConfig(
            data_path=[str(tmp_path / "shard")],
            seq_length=64,
            split="1,0,0",
            max_predictions_per_seq=cap,
            dynamic_mlm_gather=cap is None,
            cache_dir=str(tmp_path / "cache"),
        )
        train = build_datasets(cfg, tok, num_samples=(64, 0, 0))[0]
        batches[cap] = list(
            build_dataloader(train, tok, cfg, micro_batch_size=8, dp_rank=0, dp_world_size=1, num_workers=0)
        )
    model = BertForPreTraining(
        ModelConfig.preset("tiny", vocab_size=tu.VOCAB_SIZE, hidden_dropout=0.0, attention_dropout=0.0)
    ).eval()
    binding = 0
    for free, capped in zip(batches[None], batches[4]):
        n_free, n_cap = (free["labels"] != -100).sum(1), (capped["labels"] != -100).sum(1)
        assert (n_cap <= 4).all()
        under = n_free <= 4
        binding += int((~under).sum())
        assert torch.equal(capped["labels"][under], free["labels"][under])
        assert torch.equal(capped["input_ids"][under], free["input_ids"][under])
        with torch.no_grad():
            dyn = model(capped["input_ids"], capped["attention_mask"], labels=capped["labels"])
            static = model(capped["input_ids"], capped["attention_mask"], labels=capped["labels"], max_predictions=4)
        torch.testing.assert_close(static.mlm_loss, dyn.mlm_loss, rtol=1e-5, atol=1e-6)
    assert binding >= 32  # the cap bound most of the 64 samples (about 9 of 62 tokens are chosen on average)


@pytest.mark.parametrize("n, p", [(128, 0.15), (512, 0.15), (512, 0.3), (1024, 0.3)])
def test_the_derived_cap_binds_almost_never(n, p):
    """The derived cap against the binomial count of chosen tokens (each of N tokens chosen with probability p): the
    share of samples it would cut is at most 1e-6 (and 8 slots fewer would cut more), while a cap at BERT's
    round(p x N) would cut about half."""
    import math

    from data_pipeline.masking import derived_max_predictions

    def above(k: int) -> float:  # P(count > k), exact binomial tail
        log = [math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) for j in range(k + 1, n + 1)]
        return sum(math.exp(c + j * math.log(p) + (n - j) * math.log1p(-p)) for c, j in zip(log, range(k + 1, n + 1)))

    k = derived_max_predictions(n, p)
    assert k % 8 == 0 and k <= n
    assert above(k) <= 1e-6 < above(k - 8)
    assert above(round(p * n)) > 0.4
    assert k < p * n + 6 * math.sqrt(n * p * (1 - p)) + 8  # no more slots than that: the gather stays small
