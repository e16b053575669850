"""Starting one run through the real trainer under the DeepSpeed launcher; resuming an unfinished one."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from benchmarks.pretrain_compare.logs import read_log
from benchmarks.pretrain_compare.presets import REPO, CompareError
from benchmarks.pretrain_compare.specs import RunSpec
from common.errors import UserError
from common.launch import LaunchRequest, command, free_port


def launcher_command(ns: argparse.Namespace, program: list[str]) -> list[str]:
    """The command line of one launch (common/launch.py's table): deepspeed on one node (CPU ranks on gloo when
    there is no GPU), a hostfile, torchrun, ...; each launch gets its own master port unless --master-port is
    given (other jobs may hold 29500)."""
    req = LaunchRequest(
        launcher=ns.launcher,
        nproc=ns.nproc,
        master_port=ns.master_port or free_port(),
        hostfile=ns.hostfile,
        launcher_args=shlex.join(ns.launcher_arg) if ns.launcher_arg else None,
    )
    try:
        return command(req, program, cwd=REPO)
    except UserError as e:
        raise CompareError(str(e)) from e


def _spec_json(spec: RunSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "config": spec.config,
        "seed": spec.seed,
        "train_args": spec.train_args,
        "model_config": spec.model_config,
    }


def check_spec(run_dir: Path, spec: RunSpec) -> None:
    """A run directory belongs to one set of flags: resuming it with others would mix two experiments."""
    path = run_dir / "spec.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old != _spec_json(spec):
            diff = [k for k in old if old.get(k) != _spec_json(spec).get(k)]
            raise CompareError(
                f"{run_dir} was started with other settings ({', '.join(diff)} differ); use another "
                f"--out, or delete that run directory to retrain it"
            )
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_spec_json(spec), indent=1))


def train_run(ns: argparse.Namespace, spec: RunSpec, run_dir: Path) -> bool:
    """Train (or continue) one run to its last iteration. Returns True when it is complete."""
    check_spec(run_dir, spec)
    (run_dir / "model.json").write_text(json.dumps(spec.model_config, indent=1))
    ckpt = run_dir / "ckpt"
    eval_interval = int(spec.train_args[spec.train_args.index("--eval-interval") + 1])
    cmd = launcher_command(
        ns,
        [
            "-m",
            "pretrain.train",
            *spec.train_args,
            "--model-config",
            str(run_dir / "model.json"),
            "--save",
            str(ckpt),
            "--load",
            str(ckpt),
            "--save-interval",
            str(eval_interval),
            "--keep-last",
            "1",
            "--log-json",
            str(run_dir / "log.jsonl"),
        ],
    )
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    env["PYTHONUNBUFFERED"] = "1"
    start = time.time()
    with open(run_dir / "stdout.log", "a", buffering=1) as log:  # line-buffered: tail -f works
        log.write(f"\n# {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        try:
            for line in proc.stdout:
                log.write(line)
                if line.startswith("[pretrain]") and (
                    "validation" in line or "resumed" in line or "iteration" in line and ns.verbose
                ):
                    print(f"[compare] {spec.name}: {line[11:].rstrip()}", flush=True)
            rc = proc.wait()
        except BaseException:  # Ctrl-C or a kill: take the ranks down with us, the checkpoint stays
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait()
            raise
    segments = run_dir / "launches.jsonl"
    with open(segments, "a") as f:
        f.write(json.dumps({"start": start, "wall_s": time.time() - start, "rc": rc}) + "\n")
    if rc != 0:
        tail = "".join((run_dir / "stdout.log").read_text().splitlines(keepends=True)[-30:])
        raise CompareError(f"{spec.name}: the trainer exited with code {rc}; see {run_dir / 'stdout.log'}:\n{tail}")
    train, _ = read_log(run_dir / "log.jsonl")
    iters = int(spec.train_args[spec.train_args.index("--train-iters") + 1])
    return bool(train) and train[-1]["iteration"] >= iters
