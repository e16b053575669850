"""The training steps: ``data`` (the sample corpus -> vocab -> shards, once) and the smoke, per precision (fp16 with
loss scaling; bf16 on sm80+) a tiny BlockBERT trained under ZeRO-2 (``smoke``) or ZeRO-3 (``smoke_zero3``) as one
plain ``python -m pretrain.train`` rank. Exact resume is tests/test_train_resume.py's (the ``multirank_tests`` step
runs it on CUDA), not re-proved here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from devtools.gpu_check.context import Ctx
from devtools.gpu_check.runner import Step, StepResult, skipped_step

CORPUS = "run_scripts/sample_data/corpus"


def data_step(ctx: Ctx, cap_s: float) -> Step:
    """The vocab and shards of the sample corpus, built once per work directory (a reused one keeps them)."""
    d = ctx.data
    if (d / "sample_text_sentence.idx").is_file():
        return skipped_step("data", f"the shards are there already ({d})")
    tokenizer = [ctx.python, "-m", "data_pipeline.train_tokenizer", "--input", CORPUS, "--output-dir", str(d)]
    tokenizer += ["--model-type", "wordpiece", "--vocab-size", "4000"]
    shards = [ctx.python, "-m", "data_pipeline.preprocess", "--input", CORPUS, "--output-prefix", str(d / "sample")]
    shards += ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", str(d / "vocab.txt")]
    shards += ["--split-sentences", "--workers", "2" if ctx.device == "cpu" else "4", "--no-progress"]

    def check(res: StepResult, proc) -> None:
        ok = proc.returncode == 0 and (d / "sample_text_sentence.idx").is_file()
        res.status = "passed" if ok else "failed"
        res.summary = f"vocab and shards in {d}" if ok else f"no shards (exit code {proc.returncode})"

    def prepare() -> None:
        shutil.rmtree(d, ignore_errors=True)

    return Step("data", cap_s, [tokenizer, shards], check, min_s=10, prepare=prepare)


def smoke_model(ctx: Ctx) -> list[str]:
    """A tiny BlockBERT (n=2, heads 3:1, block 16, static MLM gather); smaller still for the CPU rehearsal."""
    hidden, ffn, seq = (64, 256, 64) if ctx.device == "cpu" else (256, 1024, 128)
    return [
        *("--model-preset", "tiny", "--hidden-size", str(hidden), "--num-attention-heads", "4"),
        *("--ffn-hidden-size", str(ffn), "--attention-dropout", "0", "--blockbert-blocks", "2", "--head-assignment"),
        "3:1",
        *("--seq-length", str(seq), "--max-position-embeddings", str(seq), "--max-predictions-per-seq", "16"),
    ]


def smoke_iters(ctx: Ctx) -> int:
    """Iterations of each training run."""
    if ctx.device == "cpu":
        return 6
    return 40 if ctx.quick else 200


def smoke_checks(records: list[dict], output: str, iters: int, min_drop: float = 1.0) -> list[str]:
    """Problems of a smoke run's log: the loss must fall by more than ``min_drop`` nats (the means of the first and
    the last fifth of the logged losses, 10 at most), no recompile warnings, and the fp16 loss scaler's skipped steps
    only early: at most 16, none in the second half of the run."""
    problems = []
    loss = [r["loss"] for r in records if "loss" in r and r["loss"] == r["loss"] and r["loss"] != float("inf")]
    w = max(1, min(10, len(loss) // 5))
    if len(loss) < max(4, iters // 2):
        problems.append(f"only {len(loss)} finite logged losses")
    elif not sum(loss[:w]) / w - sum(loss[-w:]) / w > min_drop:
        problems.append(
            f"the loss did not fall by {min_drop:g} nat ({sum(loss[:w]) / w:.3f} -> {sum(loss[-w:]) / w:.3f})"
        )
    for marker in ("recompile", "cache_size_limit", "recompile_limit"):
        if marker in output:
            problems.append(f"'{marker}' in the output")
            break
    skipped = {r["iteration"]: r.get("skipped_steps", 0) for r in records if "iteration" in r and "loss" in r}
    if skipped:
        last = skipped[max(skipped)]
        half = max((v for k, v in skipped.items() if k <= iters // 2), default=0)
        if last > 16 or last > half:
            problems.append(f"{last} skipped steps ({half} by iteration {iters // 2})")
    if records and max((r.get("iteration", 0) for r in records), default=0) < iters:
        problems.append(f"the run stopped before iteration {iters}")
    return problems


def _jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def smoke_command(ctx: Ctx, zero: int, precision: str, log_json: Path) -> list[str]:
    """One training run: a single rank started as plain ``python -m pretrain.train`` (no launcher, ssh or pdsh)."""
    mb = "4" if ctx.device == "cpu" else "16"
    return [
        *(ctx.python, "-m", "pretrain.train", "--deepspeed_config", f"ds_configs/zero{zero}_{precision}.json"),
        *ctx.shards,
        *smoke_model(ctx),
        *("--micro-batch-size", mb, "--global-batch-size", mb, "--train-iters", str(smoke_iters(ctx))),
        *("--lr", "2e-3", "--lr-warmup-fraction", "0.1", "--log-interval", "1", "--eval-interval", "100000"),
        *("--eval-iters", "1", "--num-workers", "1", "--deterministic", "--log-json", str(log_json)),
    ]


def smoke_step(ctx: Ctx, zero: int, name: str, cap_s: float) -> Step:
    """Per precision one training run; passes when each one's loss falls, without recompiles or late skipped steps."""
    if not ctx.precisions:
        return skipped_step(name, "no training precision runs here (fp16 refused by DeepSpeed on this CPU, no bf16)")
    iters = smoke_iters(ctx)
    d = ctx.work / name
    logs = {p: d / f"zero{zero}_{p}.jsonl" for p in ctx.precisions}
    min_drop = 1.0 if iters >= 200 else 0.3 if ctx.device == "cuda" else 0.0

    def check(res: StepResult, proc) -> None:
        problems = [] if proc.returncode == 0 else [f"a training run failed (exit code {proc.returncode})"]
        per = {}
        for prec, log in logs.items():
            records = _jsonl(log)
            p = [f"{prec}: {x}" for x in smoke_checks(records, proc.stdout or "", iters, min_drop)]
            losses = [r["loss"] for r in records if "loss" in r]
            per[prec] = {
                "problems": p,
                "loss_first": losses[0] if losses else None,
                "loss_last": losses[-1] if losses else None,
                "skipped_steps": max((r.get("skipped_steps", 0) for r in records), default=None),
                "iterations": iters,
            }
            problems += p
        res.details = {"zero_stage": zero, "precisions": per, "problems": problems}
        res.status = "failed" if problems else "passed"
        res.summary = "; ".join(problems[:6]) or (
            ", ".join(f"{p}: loss {v['loss_first']:.2f} -> {v['loss_last']:.2f}" for p, v in per.items())
            + f" (ZeRO-{zero}, {iters} iterations)"
        )

    def prepare() -> None:
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)

    commands = [smoke_command(ctx, zero, p, log) for p, log in logs.items()]
    return Step(name, cap_s, commands, check, min_s=45 if ctx.device == "cuda" else 20, prepare=prepare)
