"""Fast checks of the trainer's pieces: flags, LR schedule, activation checkpointing."""

from __future__ import annotations

import pytest
import torch

from pretrain.args import ArgsError, parse_args, train_iterations, warmup_steps
from pretrain.schedule import WarmupLinearDecay, lr_at

BASE = ["--data-path", "0.3", "books", "0.7", "wiki", "--micro-batch-size", "4"]


def test_megatron_flags_parse_into_dataclasses():
    run = parse_args(
        BASE
        + [
            "--train-samples",
            "1000",
            "--global-batch-size",
            "32",
            "--lr",
            "2.5e-4",
            "--lr-warmup-fraction",
            "0.01",
            "--num-layers",
            "4",
            "--hidden-size",
            "256",
            "--num-attention-heads",
            "4",
            "--blockbert-blocks",
            "2",
            "--head-assignment",
            "3:1",
            "--checkpoint-activations",
            "--save",
            "s",
            "--keep-last",
            "2",
        ]
    )
    assert run.data.data_path == ["0.3", "books", "0.7", "wiki"]
    assert run.model.overrides == {"num_layers": 4, "hidden_size": 256, "num_attention_heads": 4}
    assert run.model.attention["sparsity"] == {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1"}
    assert run.system.activation_checkpointing and run.checkpoint.keep_last == 2
    assert train_iterations(run.loop, 32) == 31
    assert warmup_steps(run.optim, 1000) == 10


@pytest.mark.parametrize(
    "extra, match",
    [
        ([], "exactly one of --train-iters"),
        (["--train-iters", "5", "--train-samples", "5"], "exactly one"),
        (["--train-iters", "5", "--lr", "0"], "--lr"),
        (["--train-iters", "5", "--blockbert-blocks", "2"], "--head-assignment"),
        (["--train-iters", "5", "--finetune"], "--finetune needs --load"),
        (["--train-iters", "5", "--sample-mode", "pairs"], "--sample-mode"),
        (["--train-iters", "5", "--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"], "give one of them"),
    ],
)
def test_bad_flags_name_the_flag(extra, match):
    with pytest.raises(ArgsError, match=match):
        parse_args(BASE + extra)


def test_lr_schedule_linear_warmup_then_linear_decay():
    peak, lo = 1e-3, 1e-5
    lrs = [lr_at(s, peak, lo, warmup=4, decay_iters=12) for s in range(14)]
    assert lrs[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert lrs[4] == pytest.approx(peak - (peak - lo) / 8)  # the peak is held for one step, not two (issue 34)
    assert lrs[7] == pytest.approx(lo + (peak - lo) * 0.5)
    assert lrs[11] == pytest.approx(lo) and lrs[12] == pytest.approx(lo) and lrs[13] == pytest.approx(lo)
    assert all(a > b for a, b in zip(lrs[3:12], lrs[4:12]))


def test_scheduler_state_round_trip_continues_exactly():
    def make():
        p = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.AdamW([p], lr=1.0)
        return opt, WarmupLinearDecay(opt, peak=1e-3, min_lr=0.0, warmup=3, decay_iters=10)

    opt, sched = make()
    for _ in range(5):
        opt.step()
        sched.step()
    state = sched.state_dict()
    opt2, sched2 = make()
    sched2.load_state_dict(state)
    for _ in range(3):
        for o, s in ((opt, sched), (opt2, sched2)):
            o.step()
            s.step()
        assert opt.param_groups[0]["lr"] == opt2.param_groups[0]["lr"]
    assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(8, 1e-3, 0.0, 3, 10))


def test_activation_checkpointing_keeps_names_and_gradients():
    from model.bert import BertForPreTraining
    from model.config import ModelConfig
    from pretrain.parallelize import apply_activation_checkpointing

    cfg = ModelConfig.preset("tiny", vocab_size=50, hidden_dropout=0.1, attention_dropout=0.1)
    torch.manual_seed(0)
    ref = BertForPreTraining(cfg)
    ckpt = BertForPreTraining(cfg)
    ckpt.load_state_dict(ref.state_dict())
    assert apply_activation_checkpointing(ckpt) == cfg.num_layers
    assert list(ckpt.state_dict()) == list(ref.state_dict())
    ids = torch.randint(5, 50, (2, 16))
    labels = torch.where(torch.rand(2, 16) < 0.3, ids, torch.full_like(ids, -100))
    labels[0, 0] = ids[0, 0]
    grads = []
    for m in (ref, ckpt):
        torch.manual_seed(1)  # same dropout masks: checkpointing must replay them in backward
        m.train()
        m(ids, labels=labels).loss.backward()
        grads.append([p.grad.clone() for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_numerics_deterministic_and_tf32(monkeypatch):
    from pretrain.numerics import configure_numerics

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    try:
        notes = configure_numerics(deterministic=True, tf32=False)
        import os

        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
        assert torch.backends.cuda.matmul.fp32_precision == "ieee"
        assert torch.get_float32_matmul_precision() == "highest"  # the getter inductor calls must not raise
        assert any("--deterministic" in n for n in notes)
        configure_numerics(deterministic=False, tf32=True)
        assert torch.backends.cuda.matmul.fp32_precision == "tf32" == torch.backends.cudnn.conv.fp32_precision
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.mkldnn.matmul.fp32_precision == "none"  # CPU matmuls untouched
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2], before[3]
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[4], before[5]


def test_deterministic_and_tf32_flags():
    run = parse_args(BASE + ["--train-iters", "5", "--deterministic", "--no-tf32"])
    assert run.system.deterministic and not run.system.tf32
    run = parse_args(BASE + ["--train-iters", "5"])
    assert not run.system.deterministic and run.system.tf32


def test_every_flag_is_generated_from_a_documented_field():
    """Each config field is a flag whose help is the field's docstring and whose default is the field's default;
    `--help` documents every flag; --attention-kernel offers exactly the registered kernels."""
    import dataclasses

    from common.cli import cli_fields, field_docs
    from model.attention.kernels import KERNELS
    from pretrain.args import GROUPS, build_parser

    parser = build_parser()
    by_dest = {a.dest: a for a in parser._actions}
    assert all(a.help for a in parser._actions if a.option_strings), "a flag without help text"
    for _, cls in GROUPS:
        docs = field_docs(cls)
        for f in cli_fields(cls):
            a = by_dest[f.name]
            assert a.help.replace("%%", "%") == docs[f.name], f.name
            if f.default is not dataclasses.MISSING:
                assert a.default == f.default, f.name
    assert sorted(by_dest["attention_kernel"].choices) == sorted(KERNELS)
    text = parser.format_help()
    assert "--lr-warmup-iters" in text and "Warmup length in optimizer steps" in text


def test_model_override_flags_come_from_model_config_fields():
    """The ModelConfig fields whose metadata names a flag are exactly the override flags; a switch and its negative
    set the field, neither leaves the preset's value."""
    from common.cli import field_docs, override_fields
    from model.config import ModelConfig
    from pretrain.args import build_parser

    by_flag = {o: a for a in build_parser()._actions for o in a.option_strings}
    docs = field_docs(ModelConfig)
    names = {f.name for f in override_fields(ModelConfig)}
    assert {"num_layers", "intermediate_size", "head_size", "pre_layer_norm"} <= names
    for f in override_fields(ModelConfig):
        a = by_flag[f.metadata["cli"]["flag"]]
        assert a.dest == f.name and a.default is None and docs[f.name] in a.help.replace("%%", "%")
    base = BASE + ["--train-iters", "5"]
    assert parse_args(base + ["--pre-layer-norm"]).model.overrides == {"pre_layer_norm": True}
    assert parse_args(base + ["--post-layer-norm"]).model.overrides == {"pre_layer_norm": False}
    assert parse_args(base + ["--ffn-hidden-size", "64"]).model.overrides == {"intermediate_size": 64}
    assert parse_args(base).model.overrides == {}


def _valid_ids(args: list[str]) -> list[list[int]]:
    """Input ids + labels of the validation batches the trainer's evaluate() would see (rank 0 of 1)."""
    from pretrain import builders

    run = parse_args(args)
    tok = builders.build_tokenizer(run.data)
    train, valid, _ = builders.build_datasets(run, tok, 40, 20, 2)
    it = iter(builders.build_dataloader(run, valid, tok, 2, 0, 1, 0, 0, valid=True))
    out = [b["input_ids"].flatten().tolist() + b["labels"].flatten().tolist() for b, _ in zip(it, range(3))]
    assert len(out) == 3
    return out


def test_valid_data_path_and_valid_seed(tmp_path):
    """--valid-data-path: held-out shards used whole (every --data-path document trains); --valid-seed: the same
    validation samples and masks whatever --seed is."""
    from pretrain import builders
    from tests.train_utils import prepare, train_args, write_shard

    prepare(tmp_path)
    write_shard(tmp_path / "held_out", num_docs=12, seed=3)
    base = train_args(tmp_path, "zero2_fp32.json", 20) + ["--eval-interval", "5", "--eval-iters", "3"]
    held = ["--valid-data-path", str(tmp_path / "held_out")]
    run = parse_args(base + held)
    tok = builders.build_tokenizer(run.data)
    train, valid, test = builders.build_datasets(run, tok, 40, 20, 2)
    assert test is None
    assert [c.doc_range for c in train.components] == [(0, 60)]  # --split ignored: all 60 documents train
    assert [(c.prefix, c.doc_range) for c in valid.components] == [(str(tmp_path / "held_out"), (0, 12))]

    def seed(s: int, *extra: str) -> list[str]:
        return base + ["--seed", str(s), *extra]  # the later --seed wins

    assert _valid_ids(seed(1, *held, "--valid-seed", "5")) == _valid_ids(seed(2, *held, "--valid-seed", "5"))
    assert _valid_ids(seed(1, *held)) != _valid_ids(seed(2, *held))
    # without held-out shards: the whole-document valid split, drawn with --valid-seed
    assert _valid_ids(seed(1, "--valid-seed", "5")) == _valid_ids(seed(2, "--valid-seed", "5"))
    assert _valid_ids(seed(5)) == _valid_ids(seed(1, "--valid-seed", "5"))
