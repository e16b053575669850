"""The command line: which runs, where, and in which order; resumable across sittings."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from benchmarks.pretrain_compare.data import prepare_data
from benchmarks.pretrain_compare.evaluate import evaluate_checkpoint, valid_fingerprint
from benchmarks.pretrain_compare.handoff import evaluate_command, export_run
from benchmarks.pretrain_compare.launch import check_spec, train_run
from benchmarks.pretrain_compare.presets import CONFIG_NAMES, DEFAULT_CONFIGS, PRESETS, CompareError
from benchmarks.pretrain_compare.report import print_table, report
from benchmarks.pretrain_compare.specs import run_specs
from common.errors import UserError
from common.launch import command_launchers
from common.outputs import check_dir_writable


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks.pretrain_compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", required=True, help="comparison directory (runs/, results.json, table.md, plots)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="cpu-small")
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=CONFIG_NAMES)
    p.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[1234, 1235],
        help="the first seed trains every config; later seeds only --seeded-configs",
    )
    p.add_argument("--seeded-configs", nargs="*", default=["dense", "blockbert_n2"])
    p.add_argument("--valid-seed", type=int, default=4321, help="one seed for the held-out samples and masks")
    d = p.add_argument_group("data (shards, or raw inputs preprocessed into OUT/data)")
    d.add_argument("--data-path", nargs="+", help="training shards, Megatron style (weights optional)")
    d.add_argument("--valid-data-path", nargs="+", help="held-out shards of whole documents")
    d.add_argument("--split", default="98,2,0", help="without validation shards: whole-document split of --data-path")
    d.add_argument("--train-inputs", nargs="+", help="raw training text (files, dirs, globs) to preprocess")
    d.add_argument("--valid-inputs", nargs="+", help="raw held-out text (whole documents/books) to preprocess")
    d.add_argument("--vocab-file", required=True)
    d.add_argument("--tokenizer-type", default="BertWordPieceLowerCase")
    d.add_argument("--preprocess-workers", type=int, default=2)
    t = p.add_argument_group("training (defaults from --preset)")
    t.add_argument("--train-iters", type=int)
    t.add_argument("--eval-interval", type=int)
    t.add_argument("--eval-iters", type=int)
    t.add_argument("--log-interval", type=int)
    t.add_argument("--global-batch-size", type=int)
    t.add_argument("--lr", type=float)
    t.add_argument("--warmup-fraction", type=float, default=0.1)
    t.add_argument("--ds-config", help="DeepSpeed config (default: the preset's, ZeRO-2)")
    t.add_argument("--num-workers", type=int, default=1, help="DataLoader workers per rank")
    t.add_argument(
        "--train-arg",
        action="append",
        default=[],
        help="extra trainer flag, repeatable (--train-arg=--checkpoint-activations)",
    )
    la = p.add_argument_group("launcher")
    la.add_argument(
        "--launcher",
        choices=command_launchers(),
        default="deepspeed",
        help="common/launch.py's table (docs/training.md)",
    )
    la.add_argument("--nproc", type=int, default=2, help="ranks (GPUs, or CPU ranks on gloo without GPUs)")
    la.add_argument(
        "--hostfile", help="with --launcher hostfile: DeepSpeed hostfile (see run_scripts/hostfile.example)"
    )
    la.add_argument("--master-port", type=int, help="default: a free port per launch")
    la.add_argument("--launcher-arg", action="append", default=[], help="extra launcher flag, repeatable")
    r = p.add_argument_group("sittings")
    r.add_argument("--stop-after", type=int, help="stop after this many runs trained in this sitting")
    r.add_argument(
        "--report-only", action="store_true", help="with the comparison's own flags: write results.json and plots only"
    )
    r.add_argument("--figures-dir", help="also copy the plots and results.json here (e.g. docs/figures)")
    r.add_argument("--figures-prefix", default="compare_", help="file name prefix of those copies")
    r.add_argument(
        "--recheck",
        action="store_true",
        help="re-evaluate each finished run's final checkpoint in-process (reproducibility check)",
    )
    r.add_argument(
        "--keep-checkpoints",
        action="store_true",
        help="keep finished runs' checkpoints (default: deleted once the run is done and checked)",
    )
    r.add_argument(
        "--to-hf",
        action="store_true",
        help="export each finished run to OUT/hf/<run> (Hugging Face) and print the tools.evaluate command for them",
    )
    p.add_argument("--verbose", action="store_true", help="echo every training log line")
    return p


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ns = build_parser().parse_args(argv)
    ns.argv = list(sys.argv[1:] if argv is None else argv)
    if ns.data_path is None and ns.train_inputs is None:
        raise CompareError("give --data-path (shards) or --train-inputs/--valid-inputs (raw text)")
    if (ns.train_inputs is None) != (ns.valid_inputs is None):
        raise CompareError("--train-inputs and --valid-inputs go together (held-out documents must be separate)")
    if ns.data_path is not None and ns.train_inputs is not None:
        raise CompareError("give either --data-path or --train-inputs, not both")
    if not Path(ns.vocab_file).is_file():
        raise CompareError(f"--vocab-file {ns.vocab_file}: no such file")
    # the ranks and the preprocessor run in the repository root, and a run directory's spec.json must not depend on
    # the directory the comparison was started from: every path becomes absolute
    ns.vocab_file = os.path.abspath(ns.vocab_file)
    for name in ("data_path", "valid_data_path", "train_inputs", "valid_inputs"):
        if getattr(ns, name) is not None:
            setattr(ns, name, [item if _is_weight(item) else os.path.abspath(item) for item in getattr(ns, name)])
    return ns


def _is_weight(item: str) -> bool:
    try:
        float(item)
    except ValueError:
        return False
    return True


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM/SIGHUP (e.g. `kill` of a nohup'ed comparison): unwind like Ctrl-C, so the ranks are stopped too."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        ns = parse(argv)
        preset = PRESETS[ns.preset]
        out = Path(ns.out)
        check_dir_writable(out, "--out")  # read-only or a file: one line before any run
        if ns.train_inputs is not None:
            ns.data_path, ns.valid_data_path = prepare_data(
                out, ns.train_inputs, ns.valid_inputs, ns.vocab_file, ns.tokenizer_type, ns.preprocess_workers
            )
        specs = run_specs(ns, preset)
        world = ns.nproc
        trained = 0
        for spec in [] if ns.report_only else specs:
            run_dir = out / "runs" / spec.name
            if (run_dir / "done.json").exists():
                check_spec(run_dir, spec)
                print(f"[compare] {spec.name}: done, skipped", flush=True)
                continue
            if ns.stop_after is not None and trained >= ns.stop_after:
                print(f"[compare] --stop-after {ns.stop_after}: stopping; run the same command to continue", flush=True)
                break
            print(f"[compare] {spec.name}: training ({spec.config}, seed {spec.seed})", flush=True)
            complete = train_run(ns, spec, run_dir)
            trained += 1
            if not complete:
                print(f"[compare] {spec.name}: the trainer stopped early; run the same command to continue", flush=True)
                break
            done: dict[str, Any] = {"valid_fingerprint": valid_fingerprint(spec, run_dir, world)}
            if ns.recheck:
                done["recheck"] = evaluate_checkpoint(spec, run_dir, world)
            (run_dir / "done.json").write_text(json.dumps(done, indent=1))
            if ns.to_hf:  # before the checkpoints go
                export_run(out, spec, run_dir)
            if not ns.keep_checkpoints:
                import shutil

                shutil.rmtree(run_dir / "ckpt", ignore_errors=True)
            report(ns, specs, ns.preset, preset)  # a table after every run: a later failure loses nothing
        results = report(ns, specs, ns.preset, preset)
        print_table(results)
        if not results["same_validation_batches"]:
            raise CompareError("the runs were evaluated on different validation batches (fingerprints differ)")
        print(f"[compare] wrote {out / 'results.json'} and {', '.join(Path(p).name for p in results['plots'])}")
        if ns.to_hf:
            exports = [(s.name, export_run(out, s, out / "runs" / s.name)) for s in specs
                       if (out / "runs" / s.name / "done.json").exists()]  # fmt: skip
            print(f"[compare] Hugging Face exports in {out / 'hf'}; fine-tune them side by side (docs/evaluation.md):")
            print("  " + evaluate_command(out, exports))
        return 0
    except (CompareError, UserError) as e:
        print(f"[compare] error: {e}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
