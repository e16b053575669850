"""Entry point: `deepspeed pretrain/train.py ...`, `torchrun pretrain/train.py ...`, `mpirun -np K python -m
pretrain.train ...` or `python -m pretrain.train ...`. See docs/training.md.

Exit codes: 0 done, 2 bad settings/config/checkpoint (message names the file or flag), 3 non-finite loss,
4 stopped by --exit-signal-handler after saving (run the same command with --load to continue), 5 a peer rank
stopped answering or died (a collective failed on it, or the watchdog ended this rank).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script by a launcher: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __name__ == "__main__":  # a rank: its output may outlive its reader (pdsh); before any logger takes sys.stdout
    from common.process import outlive_lost_output

    outlive_lost_output()

from common.error_exit import report  # noqa: E402
from common.errors import UserError, os_error_message, take_debug_flag  # noqa: E402
from common.process import exit_process  # noqa: E402
from pretrain.args import RunConfig, parse_args  # noqa: E402
from pretrain.distributed import destroy_distributed  # noqa: E402


def record_run(run: RunConfig, text: str) -> None:
    """Rank 0's start-up lines saying where the settings came from, and the resolved run (``text``: the one each
    checkpoint holds, pretrain/parts.py) written as config.toml in the run directory (``--config`` of it starts the
    same run)."""
    from pretrain import run_file

    for line in run_file.describe_sources(run.sources, run.config_file, run.explicit):
        print(f"[pretrain] {line}", flush=True)
    where = run_file.run_dir(run)
    if where is None:
        print("[pretrain] no run directory (--save, --tensorboard-dir or --log-json): the run file is not written")
        return
    path = run_file.write(text, where / run_file.CONFIG_NAME)
    print(f"[pretrain] run file: {path} (python -m pretrain.train --config {path} starts this run)", flush=True)


def main(argv: list[str] | None = None) -> int:
    """Bad settings, files and checkpoints are one line from rank 0 and exit 2 (common/errors.py: ``--debug`` or
    SPARSE_BERT_DEBUG=1 adds the traceback); a bug keeps its traceback."""
    argv = take_debug_flag(argv)
    try:
        run = parse_args(argv)
    except UserError as e:
        return report("pretrain", str(e))
    from pretrain.trainer import NonFiniteLossError, Trainer

    trainer = None
    try:
        trainer = Trainer(run)
        if trainer.dist.rank == 0:
            record_run(trainer.run, trainer.checkpointer.run_config_text)
        return 0 if trainer.train() else 4
    except NonFiniteLossError as e:
        print(f"pretrain: error: {e}", file=sys.stderr, flush=True)
        return 3
    except UserError as e:
        return report("pretrain", str(e))
    except OSError as e:
        return report("pretrain", os_error_message(e))
    except RuntimeError as e:
        from pretrain.watchdog import EXIT_STALLED, peer_lost

        lost = peer_lost(e)
        if lost is None:
            raise
        rank = trainer.dist.rank if trainer is not None else "?"
        print(
            f"pretrain: error: rank {rank}: a collective failed because a peer rank stopped answering or died "
            f"({lost}); exit code {EXIT_STALLED}: run the same command with --load on the hosts left (a Slurm job "
            "requeues itself)",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_STALLED
    finally:
        if trainer is not None:
            trainer.close()
        else:
            destroy_distributed()


if __name__ == "__main__":
    # Trainer.close() has flushed and closed everything; skipping interpreter finalization keeps gloo's worker
    # threads from aborting the process after a complete run (see exit_process).
    exit_process(main())
