"""Fine-tune and score checkpoints the way a paper did, and write its table.

    python -m tools.evaluate --protocol sparsebert --suite glue --model dense=runs/dense_hf \\
        --model blockbert=runs/blockbert_hf --data-dir glue_data --output-dir evals/glue
    python -m tools.evaluate --protocol blockbert --suite squad2 --model ... --data-dir squad --output-dir evals/sq2

Every model x task x grid point x seed of the protocol (tools/evaluate/protocols.py) is one fine-tuning
(tools/finetune.py) scored on the dev sets (tools/evaluate/metrics.py); each run is kept with its predictions under
--output-dir, and the same command resumes a sweep that stopped. The table (table.md, table.json) gives per task the
median over seeds of the best grid point, its spread over seeds and the compute. Narrow a sweep for a quick look with
--tasks, --lr/--batch-size/--weight-decay/--epochs, --seeds, --limit-train/--limit-eval (the table says so).
docs/evaluation.md: the suites, the protocols, running on a cluster.
"""

from __future__ import annotations

import argparse
import sys

from common.error_exit import run_entry


def build_parser() -> argparse.ArgumentParser:
    """The command line's flags (tools/evaluate/cli.py, generated from EvaluateConfig)."""
    from tools.evaluate.cli import build_parser as build

    return build(__doc__ or "")


def _main(argv: list[str]) -> int:
    from tools.evaluate import sweep, table
    from tools.evaluate.cli import parse

    cfg = parse(argv, __doc__ or "")
    plan = cfg.sweep()
    if cfg.dry_run:
        runs = plan.runs()
        shard = cfg.shard_pair()
        mine = runs[shard[0] :: shard[1]] if shard else runs
        for r in mine:
            print(r.path(cfg.output_dir))
        print(f"[evaluate] {len(mine)} runs" + (f" (shard {cfg.shard} of {len(runs)})" if shard else ""))
        return 0
    if not cfg.report_only:
        counts = sweep.execute(
            plan,
            cfg.output_dir,
            max_runs=cfg.max_runs,
            shard=cfg.shard_pair(),
            allow_changed_settings=cfg.allow_changed_settings,
        )
        print(
            f"[evaluate] {counts['ran']} runs now, {counts['done_before']} done before, {counts['left']} left"
            + (" (run the same command to go on)" if counts["left"] else ""),
            flush=True,
        )
    report = sweep.summarize(plan, cfg.output_dir)
    md, js = table.write(report, cfg.output_dir)
    print(md.read_text())
    print(f"[evaluate] wrote {md} and {js}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2."""
    return run_entry("tools.evaluate", _main, argv)


if __name__ == "__main__":
    sys.exit(main())
