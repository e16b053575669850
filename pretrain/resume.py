"""What a resumed run takes from its checkpoint and what from the flags: decided the same way on every rank, and said.

The LR schedule follows Megatron-LM's rules and flag names. The schedule stored with the checkpoint (DeepSpeed saves
our scheduler's state) is compared with the one the flags give; any difference is refused, naming each flag, unless
``--override-opt-param-scheduler`` (the flags win: the step count carries on and the LR follows the new schedule
from there) or ``--use-checkpoint-opt-param-scheduler`` (the checkpoint's schedule wins) says which one to use.
Without this, extending ``--train-iters`` would silently keep the old decay length and run at ``--min-lr``.
The optimizer's hyperparameters (``--weight-decay``, ``--adam-beta1/2``, ``--adam-eps``) follow the same two flags:
DeepSpeed restores the checkpoint's values on a same-size ZeRO load (torch's ``load_state_dict``) but keeps the new
optimizer's on a universal (re-partitioned) load, so a changed value would be ignored on one path and used on the
other. The chosen values are set after every load; a different ``--optimizer`` is refused (its state is another
optimizer's).

The other settings a resume can silently change:

- global batch size: handled. The data position is stored in samples (``consumed_train_samples``), so a new global
  batch continues at exactly the next sample; iterations count optimizer steps of whatever size they had. Said.
- micro batch size (global batch unchanged): same samples per step, only the accumulation changes. Said.
- sequence length: refused. Samples of another length are another sample stream and the checkpoint's position in
  it means nothing; a new length is phase 2 of a two-phase run (``--finetune``).
- the sample stream (data path, split, sample mode, masking, seed, tokenizer): said, one line per setting; the run
  continues at the stored sample position of the new stream, so it no longer replays a straight run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from pretrain.args import CheckpointConfig, RunConfig, applied_weight_decay
from pretrain.checkpoint import CheckpointError
from pretrain.schedule import LEGACY_SETTINGS, SETTINGS, schedule_settings

__all__ = ["schedule_settings", "plan_resume", "install_schedule", "install_optimizer_settings"]

# (scheduler state key, how the flags name it: {unit} iters or samples, {steps} steps or samples)
SCHEDULE_SETTINGS = (
    ("peak", "--lr"),
    ("min_lr", "--min-lr"),
    ("warmup", "warmup {steps} (--lr-warmup-{unit}, or --lr-warmup-fraction x decay {steps})"),
    ("decay_iters", "--lr-decay-{unit} (default: --train-{unit})"),
    ("style", "--lr-decay-style"),
    ("wsd_decay_iters", "--lr-wsd-decay-{unit}"),
    ("wsd_style", "--lr-wsd-decay-style"),
    ("unit", "the schedule's unit (iters with --train-iters, samples with --train-samples)"),
)
# (OptimConfig field, flag): hyperparameters every parameter group of the checkpoint's optimizer holds
OPTIMIZER_SETTINGS = (
    ("weight_decay", "--weight-decay"),
    ("adam_beta1", "--adam-beta1"),
    ("adam_beta2", "--adam-beta2"),
    ("adam_eps", "--adam-eps"),
    ("fully_decoupled_weight_decay", "--fully-decoupled-weight-decay"),
)
#: what a checkpoint from before an optimizer setting existed ran with
OPTIMIZER_DEFAULTS = {"fully_decoupled_weight_decay": False}
#: what a checkpoint from before WSD (or sample counting) existed ran with
SCHEDULE_DEFAULTS = LEGACY_SETTINGS
# (args section, field, flag): settings that define which samples a run reads, in which order
STREAM_SETTINGS = (
    ("data", "data_path", "--data-path"),
    ("data", "split", "--split"),
    ("data", "valid_data_path", "--valid-data-path"),
    ("data", "sample_mode", "--sample-mode"),
    ("data", "short_seq_prob", "--short-seq-prob"),
    ("data", "mask_prob", "--mask-prob"),
    ("data", "whole_word_masking", "--whole-word-masking"),
    ("data", "max_predictions_per_seq", "--max-predictions-per-seq"),
    ("data", "dynamic_mlm_gather", "--dynamic-mlm-gather"),
    ("data", "tokenizer_type", "--tokenizer-type"),
    ("data", "vocab_file", "--vocab-file"),
    ("data", "tokenizer_model", "--tokenizer-model"),
    ("loop", "seed", "--seed"),
)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
        except (TypeError, ValueError):
            return False
    return a == b


def schedule_differences(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """'flag: checkpoint X, now Y' for each schedule setting that differs (flags named in the unit the flags use)."""
    unit = now.get("unit", "iters")
    names = {"unit": unit, "steps": "steps" if unit == "iters" else "samples"}
    return [
        f"{flag.format(**names)}: checkpoint {saved.get(key, SCHEDULE_DEFAULTS.get(key))!r}, now {now[key]!r}"
        for key, flag in SCHEDULE_SETTINGS
        if not _same(saved.get(key, SCHEDULE_DEFAULTS.get(key)), now[key])
    ]


@dataclass
class ResumePlan:
    """The outcome of comparing a checkpoint with the flags."""

    schedule: dict[str, Any] | None = None
    """The schedule to install after DeepSpeed restored the checkpoint's (None: keep the checkpoint's)."""
    optimizer: dict[str, float] | None = None
    """Values to set on the restored optimizer: adam_beta1/2, adam_eps, and weight_decay as the decayed group holds
    it (divided by the peak LR when fully decoupled); None: a checkpoint that did not record them."""
    notes: list[str] = field(default_factory=list)
    """Lines rank 0 prints: every setting that changed and what the run does about it."""


def plan_resume(
    where: str,
    client: dict[str, Any],
    run: RunConfig,
    now_schedule: dict[str, Any],
    global_batch: int,
    micro_batch: int,
) -> ResumePlan:
    """Compare the checkpoint's settings (``client``: read_client_state's dict) with this run's; raise
    CheckpointError for a refused difference, else say what happens to each one. The steps, in the order their
    refusals are checked: optimizer and LR schedule, sequence length, batch sizes, sample-stream settings."""
    plan = ResumePlan()
    saved_args = client.get("args") or {}
    saved_sched = client.get("lr_scheduler")
    if saved_sched is None:
        raise CheckpointError(f"{where} has no LR scheduler state; it was not written by pretrain/train.py")
    now_args = run.to_dict()
    _plan_optimizer_and_schedule(plan, where, saved_sched, saved_args, now_args["optim"], now_schedule, run.checkpoint)
    _check_seq_length(where, saved_args, run.data.seq_length)
    plan.notes += _batch_notes(client, saved_args, global_batch, micro_batch)
    plan.notes += _stream_notes(saved_args, now_args, client.get("consumed_train_samples"))
    return plan


def _optimizer_differences(where: str, saved_optim: dict[str, Any], now_optim: dict[str, Any]) -> list[str]:
    """The optimizer settings that differ from the checkpoint's; another --optimizer is refused (its state is
    the checkpoint's)."""
    saved_type = saved_optim.get("optimizer")
    if saved_type is not None and saved_type != now_optim["optimizer"]:
        raise CheckpointError(
            f"{where}: --optimizer {now_optim['optimizer']} differs from the checkpoint's {saved_type}, whose state "
            f"the checkpoint holds. Keep --optimizer {saved_type} to resume, or start from the checkpoint's weights "
            "with a fresh optimizer (--finetune)"
        )
    return [
        f"{flag}: checkpoint {saved_optim[key]!r}, now {now_optim[key]!r}"
        for key, flag in OPTIMIZER_SETTINGS
        if key in saved_optim and not _same(saved_optim[key], now_optim[key])
    ]


def _plan_optimizer_and_schedule(
    plan: ResumePlan,
    where: str,
    saved_sched: dict[str, Any],
    saved_args: dict[str, Any],
    now_optim: dict[str, Any],
    now_schedule: dict[str, Any],
    ck: CheckpointConfig,
) -> None:
    """Which optimizer settings and LR schedule the run follows (``plan.optimizer``, ``plan.schedule``): the
    flags' with --override-opt-param-scheduler, the checkpoint's with --use-checkpoint-opt-param-scheduler, and a
    difference without either is refused, as is a schedule counted in another unit."""
    sched_diffs = schedule_differences(saved_sched, now_schedule)
    saved_optim = saved_args.get("optim") or {}
    if saved_optim:
        saved_optim = {**OPTIMIZER_DEFAULTS, **saved_optim}
    optim_diffs = _optimizer_differences(where, saved_optim, now_optim)
    if all(key in saved_optim for key, _ in OPTIMIZER_SETTINGS):
        source = saved_optim if optim_diffs and ck.use_checkpoint_opt_param_scheduler else now_optim
        plan.optimizer = {key: float(source[key]) for key in ("weight_decay", "adam_beta1", "adam_beta2", "adam_eps")}
        # the peak LR of the schedule the run follows (fully decoupled decay is relative to it)
        peak = saved_sched["peak"] if sched_diffs and ck.use_checkpoint_opt_param_scheduler else now_schedule["peak"]
        plan.optimizer["weight_decay"] = applied_weight_decay(
            source["weight_decay"], float(peak), bool(source["fully_decoupled_weight_decay"])
        )
    diffs = sched_diffs + optim_diffs
    what = " and ".join(name for name, d in (("LR schedule", sched_diffs), ("optimizer settings", optim_diffs)) if d)
    saved_unit = saved_sched.get("unit", SCHEDULE_DEFAULTS["unit"])
    if saved_unit != now_schedule["unit"] and not ck.use_checkpoint_opt_param_scheduler:
        raise CheckpointError(
            f"{where}: the checkpoint's LR schedule counts {saved_unit}, this run's {now_schedule['unit']} (--train-"
            f"{now_schedule['unit']}); its step count cannot carry over to the other unit. Give the run's length as "
            f"the checkpoint did (--train-{saved_unit}), or keep the checkpoint's schedule with "
            "--use-checkpoint-opt-param-scheduler"
        )
    if diffs and ck.override_opt_param_scheduler:
        plan.schedule = now_schedule if sched_diffs else None
        changed = [
            ("the LR follows the flags' schedule", sched_diffs),
            ("the optimizer runs with the flags' settings", optim_diffs),
        ]
        plan.notes.append(
            "--override-opt-param-scheduler: "
            + " and ".join(text for text, d in changed if d)
            + f" from step {saved_sched.get('last_epoch')} on ("
            + "; ".join(diffs)
            + ")"
        )
    elif diffs and ck.use_checkpoint_opt_param_scheduler:
        plan.notes.append(
            f"--use-checkpoint-opt-param-scheduler: keeping the checkpoint's {what} (" + "; ".join(diffs) + ")"
        )
    elif diffs:
        verb = "differs" if what == "LR schedule" else "differ"
        raise CheckpointError(
            f"{where}: the {what} of the checkpoint {verb} from the flags':\n  "
            + "\n  ".join(diffs)
            + "\nPass --override-opt-param-scheduler to use the flags (the step count carries on and the LR follows "
            "the new schedule from there), or --use-checkpoint-opt-param-scheduler to keep the checkpoint's "
            "(as Megatron-LM)."
        )


def _check_seq_length(where: str, saved_args: dict[str, Any], seq_length: int) -> None:
    """Another --seq-length is another sample stream: refused (phase 2 of a two-phase run uses --finetune)."""
    saved_seq = (saved_args.get("data") or {}).get("seq_length")
    if saved_seq is not None and saved_seq != seq_length:
        raise CheckpointError(
            f"{where}: --seq-length {seq_length} differs from the checkpoint's {saved_seq}; samples of "
            "another length are another sample stream, so the checkpoint's data position does not apply. Keep "
            f"--seq-length {saved_seq} to resume, or start phase 2 of a two-phase run with --finetune (weights "
            "only, fresh optimizer; see run_scripts/pretrain_two_phase.sh)"
        )


def _batch_notes(client: dict[str, Any], saved_args: dict[str, Any], global_batch: int, micro_batch: int) -> list[str]:
    """What another global or micro batch size does (both allowed: the run continues at the consumed sample)."""
    notes = []
    saved_global = client.get("global_batch")
    if saved_global is not None and int(saved_global) != global_batch:
        notes.append(
            f"global batch size {global_batch} differs from the checkpoint's {saved_global}: "
            f"continuing at sample {client.get('consumed_train_samples')} with {global_batch} samples per step "
            f"from iteration {client.get('iteration')} on"
        )
    saved_micro = (saved_args.get("loop") or {}).get("micro_batch_size")
    if (
        isinstance(saved_micro, int)  # the chosen number ('auto' is recorded as what it chose)
        and saved_micro != micro_batch
        and (saved_global is None or int(saved_global) == global_batch)
    ):
        notes.append(
            f"micro batch size {micro_batch} differs from the checkpoint's {saved_micro}: same "
            "samples per step, gradient accumulation steps change"
        )
    return notes


def _stream_notes(saved_args: dict[str, Any], now_args: dict[str, Any], consumed: Any) -> list[str]:
    """The sample-stream settings (STREAM_SETTINGS) that changed: allowed, said, since the run will not replay."""
    notes = []
    for section, key, flag in STREAM_SETTINGS:
        if section not in saved_args or key not in saved_args[section]:
            continue
        old, new = saved_args[section][key], now_args[section][key]
        if not _same(old, new):
            notes.append(
                f"{flag} {new!r} differs from the checkpoint's {old!r}: the run continues at sample "
                f"{consumed} of the new sample stream (it will not replay a run that kept the old one)"
            )
    return notes


def install_schedule(scheduler, schedule: dict[str, Any]) -> None:
    """Replace a restored WarmupLinearDecay's settings, keeping its step count, and set the LR it implies now."""
    for key in SETTINGS:
        setattr(scheduler, key, schedule[key])
    lrs = scheduler.get_lr()
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = list(lrs)


def install_optimizer_settings(optimizer, settings: dict[str, float]) -> None:
    """Set the plan's hyperparameters on a restored optimizer (DeepSpeed's wrappers expose the base optimizer's
    groups). Groups are [decayed, not decayed] (pretrain.parallelize.param_groups): only the first decays."""
    for i, group in enumerate(optimizer.param_groups):
        if "betas" in group:
            group["betas"] = (settings["adam_beta1"], settings["adam_beta2"])
        if "eps" in group:
            group["eps"] = settings["adam_eps"]
        if i == 0 and "weight_decay" in group:
            group["weight_decay"] = settings["weight_decay"]
