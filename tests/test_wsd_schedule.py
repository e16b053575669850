"""Warmup-stable-decay (Megatron's --lr-decay-style WSD; ModernBERT's 1-sqrt anneal): values from the definition,
flag checks, and the LR of a run resumed inside the anneal equal to a straight run's."""

from __future__ import annotations

import math

import pytest

from pretrain.args import ArgsError, parse_args
from pretrain.resume import schedule_differences, schedule_settings
from pretrain.schedule import WarmupLinearDecay, lr_at
from tests import train_utils as tu
from tests.megatron_lr import megatron_get_lr

BASE = ["--deepspeed_config", "ds_configs/zero2_fp32.json", "--data-path", "x", "--vocab-file", "v"]
BASE += ["--train-iters", "20"]


def test_wsd_values_follow_the_definition():
    """warmup 2, 10 decay iterations, anneal over the last 4: peak until step 5, then 1 - sqrt(k/4) for k = 1..4."""
    peak, lo = 1.0, 0.1
    lrs = [lr_at(s, peak, lo, 2, 10, "WSD", 4, "minus_sqrt") for s in range(12)]
    assert lrs[:2] == pytest.approx([0.5, 1.0])  # warmup (step + 1) / warmup
    assert lrs[2:6] == pytest.approx([1.0] * 4)  # stable: applied steps 3..6 of 10
    want = [lo + (peak - lo) * (1 - math.sqrt(k / 4)) for k in (1, 2, 3, 4)]
    assert lrs[6:10] == pytest.approx(want)
    assert lrs[9] == pytest.approx(lo) and lrs[10:] == pytest.approx([lo, lo])


@pytest.mark.parametrize(
    "style, coeff",
    [
        ("linear", lambda r: 1 - r),
        ("cosine", lambda r: (1 + math.cos(math.pi * r)) / 2),
        ("exponential", lambda r: 2 * 0.5**r - 1),
    ],
)
def test_wsd_anneal_shapes(style, coeff):
    got = [lr_at(s, 2.0, 0.0, 0, 8, "WSD", 4, style) for s in range(4, 8)]
    assert got == pytest.approx([2.0 * coeff(k / 4) for k in (1, 2, 3, 4)])


def test_wsd_flags_are_checked_and_never_ignored():
    run = parse_args(BASE + ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "5"])
    assert run.optim.wsd == {"wsd_decay_iters": 5, "wsd_style": "exponential"}  # Megatron's default shape
    with pytest.raises(ArgsError, match="--lr-wsd-decay-iters"):
        parse_args(BASE + ["--lr-decay-style", "WSD"])
    with pytest.raises(ArgsError, match="--lr-wsd-decay-style need --lr-decay-style WSD"):
        parse_args(BASE + ["--lr-wsd-decay-style", "minus_sqrt"])
    with pytest.raises(ArgsError, match="--lr-wsd-decay-iters need --lr-decay-style WSD"):
        parse_args(BASE + ["--lr-decay-style", "linear", "--lr-wsd-decay-iters", "3"])


def test_a_checkpoint_from_before_wsd_resumes_with_a_linear_schedule():
    """Old scheduler states have no WSD keys: they load, and compare equal to the same linear flags."""
    import torch

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    old = {"peak": 1e-3, "min_lr": 0.0, "warmup": 1, "decay_iters": 8, "style": "linear", "last_epoch": 3}
    sched = WarmupLinearDecay(opt, peak=1e-3, min_lr=0.0, warmup=1, decay_iters=8)
    sched.load_state_dict(old)
    assert (sched.wsd_decay_iters, sched.wsd_style) == (0, "exponential")
    assert schedule_differences(old, schedule_settings(1e-3, 0.0, 1, 8, "linear")) == []
    assert schedule_differences(old, schedule_settings(1e-3, 0.0, 1, 8, "WSD", 3, "minus_sqrt")) == [
        "--lr-decay-style: checkpoint 'linear', now 'WSD'",
        "--lr-wsd-decay-iters: checkpoint 0, now 3",
        "--lr-wsd-decay-style: checkpoint 'exponential', now 'minus_sqrt'",
    ]


@pytest.mark.timeout(400)
def test_resume_inside_the_anneal_continues_the_schedule_exactly(tmp_path):
    """8 iterations, WSD anneal over the last 4 (1 - sqrt): saved at 6, resumed; LRs and losses equal a straight run."""
    data = tu.prepare(tmp_path)
    wsd = ["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "4", "--lr-wsd-decay-style", "minus_sqrt"]

    def run(name, iters, *extra):
        ck, log = tmp_path / f"{name}_ck", tmp_path / f"{name}.jsonl"
        args = tu.train_args(
            data, "zero2_fp32.json", iters, "--save", str(ck), "--load", str(ck), "--log-json", str(log), *wsd, *extra
        )
        return args, log

    args, straight_log = run("straight", 8)
    p = tu.launch("python", args)
    assert p.returncode == 0, p.stdout[-3000:]
    args, resumed_log = run("resumed", 8, "--exit-interval", "6")
    p = tu.launch("python", args)
    assert p.returncode == 0, p.stdout[-3000:]
    p = tu.launch("python", args[: args.index("--exit-interval")])
    assert p.returncode == 0, p.stdout[-3000:]
    straight, resumed = tu.train_records(straight_log), tu.train_records(resumed_log)
    assert [r["iteration"] for r in resumed] == list(range(1, 9))
    assert [r["lr"] for r in resumed] == [r["lr"] for r in straight]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in straight]
    warmup = int(0.2 * 8)  # train_args: --lr-warmup-fraction 0.2
    assert [r["lr"] for r in straight] == pytest.approx(
        [lr_at(s, 1e-3, 0.0, warmup, 8, "WSD", 4, "minus_sqrt") for s in range(8)]
    )


# -- the registry of LR decay styles (issue 55): one reference case per registered style ---------------------------
STYLE_CASES = {
    # style: the schedules it is checked on against the reference (warmup, decay, wsd_decay, wsd_style)
    "linear": [(3, 12, 0, "exponential"), (0, 7, 0, "exponential")],
    "cosine": [(3, 12, 0, "exponential"), (0, 7, 0, "exponential")],
    "constant": [(3, 12, 0, "exponential")],
    "WSD": [(2, 12, 4, s) for s in ("linear", "cosine", "exponential", "minus_sqrt")] + [(0, 9, 9, "exponential")],
}


def test_every_registered_style_has_a_reference_case_and_is_a_flag_choice():
    from pretrain.args import build_parser
    from pretrain.schedule import LR_STYLES

    assert set(STYLE_CASES) == set(LR_STYLES), "add a STYLE_CASES entry for each registered LR style"
    action = next(a for a in build_parser()._actions if a.dest == "lr_decay_style")
    assert list(action.choices) == list(LR_STYLES)


@pytest.mark.parametrize("style", sorted(STYLE_CASES))
def test_each_style_matches_megatron(style):
    for warmup, decay, wsd_decay, wsd_style in STYLE_CASES[style]:
        for s in range(decay + 3):
            got = lr_at(s, 3e-4, 1e-5, warmup, decay, style, wsd_decay, wsd_style)
            want = megatron_get_lr(s + 1, 3e-4, 1e-5, warmup, decay, style, wsd_decay, wsd_style)
            assert got == pytest.approx(want, rel=1e-12, abs=1e-18), (style, warmup, decay, s)


def test_a_registered_style_is_a_flag_choice_and_drives_the_scheduler():
    """The worked example of docs/architecture.md: one registered function adds a schedule."""
    import torch

    from pretrain import schedule
    from pretrain.args import build_parser

    saved = dict(schedule.LR_STYLES)
    try:

        @schedule.register_lr_style("step")
        def _step(p: schedule.Point) -> float:
            """Halve the LR at every third of the decay length."""
            return p.min_lr if p.decayed else p.peak * 0.5 ** int(3 * p.ratio)

        action = next(a for a in build_parser()._actions if a.dest == "lr_decay_style")
        assert "step" in action.choices
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = WarmupLinearDecay(opt, peak=1.0, min_lr=0.0, warmup=0, decay_iters=6, style="step")
        lrs = []
        for _ in range(7):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        assert lrs == [1.0, 0.5, 0.5, 0.25, 0.25, 0.125, 0.0]  # update n = 1..6: int(3 n / 6) halvings; n = 7: min_lr
        with pytest.raises(ValueError, match="twice"):
            schedule.register_lr_style("step")(_step)
    finally:
        schedule.LR_STYLES.clear()
        schedule.LR_STYLES.update(saved)
