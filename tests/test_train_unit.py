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
        # Megatron's sample-counted schedule: each unit's flags with its own run length, never mixed (issue 34)
        (["--train-samples", "50", "--lr-warmup-fraction", "0.1", "--lr-warmup-samples", "8"], "give one of them"),
        (["--train-samples", "50", "--lr-warmup-iters", "2", "--lr-warmup-samples", "8"], "both set the same length"),
        (["--train-samples", "50", "--lr-decay-iters", "4", "--lr-decay-samples", "40"], "both set the same length"),
        (["--train-iters", "5", "--lr-warmup-samples", "8"], "--lr-warmup-samples count samples: they go with"),
        (["--train-iters", "5", "--lr-decay-samples", "40"], "use --lr-decay-iters instead"),
        (["--train-samples", "50", "--lr-warmup-iters", "2"], "with --train-samples the LR schedule counts samples"),
        (["--train-samples", "50", "--lr-decay-iters", "4"], "use --lr-decay-samples instead"),
        (
            ["--train-samples", "50", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "2"],
            "--lr-wsd-decay-iters: with --train-samples",
        ),
        (["--train-samples", "50", "--lr-decay-style", "WSD"], "needs --lr-wsd-decay-samples > 0"),
        (["--train-iters", "5", "--lr-decay-style", "WSD", "--lr-wsd-decay-samples", "9"], "count samples"),
        (["--train-samples", "50", "--lr-wsd-decay-samples", "9"], "need --lr-decay-style WSD"),
        (["--train-samples", "50", "--lr-decay-samples", "0"], "--lr-decay-samples must be positive"),
        (["--train-samples", "50", "--lr-warmup-samples", "-1"], "--lr-warmup-samples must be >= 0"),
        (
            ["--train-iters", "5", "--optimizer", "lamb", "--fully-decoupled-weight-decay"],
            "cannot apply to --optimizer",
        ),
        (["--train-iters", "5", "--weight-decay", "-0.1"], "--weight-decay must be >= 0"),
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


def test_a_wsd_anneal_longer_than_the_decay_is_refused_in_its_unit():
    from pretrain.args import lr_schedule

    run = parse_args(
        BASE
        + ["--train-samples", "96", "--lr-warmup-samples", "40", "--lr-decay-style", "WSD"]
        + ["--lr-wsd-decay-samples", "60"]
    )
    with pytest.raises(ArgsError, match="--lr-wsd-decay-samples 60 is longer than the 56 decay samples after warmup"):
        lr_schedule(run.optim, run.loop, 3)


@pytest.mark.parametrize("optimizer", ["adamw", "stableadamw"])
def test_fully_decoupled_weight_decay_is_the_configured_decay_at_the_peak(optimizer):
    """A real optimizer step on a tiny model with zero gradients (only the decay moves the weights): with
    --fully-decoupled-weight-decay a decayed weight shrinks by wd x lr_t / peak (wd itself at the peak LR), without
    it by lr_t x wd; biases never decay. The group values come from pretrain.parallelize.param_groups with
    OptimConfig.applied_weight_decay, as initialize_engine builds them."""
    from optimi import StableAdamW

    from pretrain.args import lr_schedule
    from pretrain.parallelize import param_groups

    peak, wd = 8e-4, 0.1
    flags = BASE + ["--train-iters", "6", "--lr", str(peak), "--lr-warmup-iters", "2", "--weight-decay", str(wd)]
    for decoupled in (True, False):
        run = parse_args(flags + ["--optimizer", optimizer] + (["--fully-decoupled-weight-decay"] * decoupled))
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 3).double()
        groups = param_groups(model, run.optim.applied_weight_decay)
        assert groups[0]["weight_decay"] == pytest.approx(wd / peak if decoupled else wd, rel=1e-15)
        if optimizer == "adamw":
            opt = torch.optim.AdamW(groups, lr=peak, eps=1e-8)
        else:
            opt = StableAdamW(groups, lr=peak, eps=1e-8, weight_decay=run.optim.applied_weight_decay, triton=False)
        sched = WarmupLinearDecay(opt, **lr_schedule(run.optim, run.loop, 6))
        for step in range(4):  # warmup peak/2, peak, then the decay
            lr = opt.param_groups[0]["lr"]
            before_w, before_b = model.weight.detach().clone(), model.bias.detach().clone()
            model.weight.grad, model.bias.grad = torch.zeros_like(model.weight), torch.zeros_like(model.bias)
            opt.step()
            sched.step()
            shrink = wd * lr / peak if decoupled else lr * wd
            torch.testing.assert_close(model.weight.detach(), before_w * (1 - shrink), rtol=1e-14, atol=0)
            torch.testing.assert_close(model.bias.detach(), before_b, rtol=0, atol=0)
            if decoupled and step == 1:
                assert lr == pytest.approx(peak) and shrink == pytest.approx(wd)  # the configured decay, as is


def test_fully_decoupled_decay_equals_torch_optimi_decouple_lr():
    """ModernBERT's optimizer is torch-optimi's StableAdamW(decouple_lr=True) with weight decay 1e-5: ours (the
    group's weight_decay = 1e-5 / peak) follows it step for step with real gradients through warmup and decay."""
    from optimi import StableAdamW

    from pretrain.args import OptimConfig

    peak, wd = 8e-4, 1e-5
    optim = OptimConfig(optimizer="stableadamw", lr=peak, weight_decay=wd, fully_decoupled_weight_decay=True)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(torch.nn.Linear(4, 4).double())
    ours = StableAdamW(models[0].parameters(), lr=peak, weight_decay=optim.applied_weight_decay, triton=False)
    ref = StableAdamW(models[1].parameters(), lr=peak, weight_decay=wd, decouple_lr=True, max_lr=peak, triton=False)
    scheds = [WarmupLinearDecay(o, peak=peak, min_lr=0.0, warmup=2, decay_iters=6) for o in (ours, ref)]
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for _ in range(6):
        for m, o, s in zip(models, (ours, ref), scheds):
            o.zero_grad()
            (m(x) ** 2).mean().backward()
            o.step()
            s.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-13, atol=0)


def test_fully_decoupled_decay_reaches_deepspeed_optimizers_and_refuses_other_decays(tmp_path):
    """The ds_config optimizer DeepSpeed builds gets the decoupled group value; a file block whose decay is not
    AdamW-style (LAMB, Adam with an L2 penalty) is refused naming the file."""
    import json

    from pretrain.args import OptimConfig
    from pretrain.ds_config import DSConfigError, read_ds_config
    from pretrain.parallelize import configure_optimizer

    optim = OptimConfig(lr=1e-3, weight_decay=1e-5, fully_decoupled_weight_decay=True)
    ds = read_ds_config("ds_configs/zero2_fp32.json")
    configure_optimizer(ds, optim)
    assert ds.config["optimizer"]["params"]["weight_decay"] == pytest.approx(1e-2, rel=1e-15)
    for block, ok in [
        ({"type": "AdamW", "params": {"lr": 1e-3}}, True),
        ({"type": "Adam", "params": {"lr": 1e-3}}, True),
        ({"type": "Adam", "params": {"lr": 1e-3, "adam_w_mode": False}}, False),
        ({"type": "Lamb", "params": {"lr": 1e-3}}, False),
    ]:
        path = tmp_path / "ds.json"
        path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 1, "optimizer": block}))
        ds = read_ds_config(path)
        if ok:
            configure_optimizer(ds, optim)
        else:
            with pytest.raises(DSConfigError, match=f"--fully-decoupled-weight-decay needs an AdamW-style.*{path}"):
                configure_optimizer(ds, optim)
