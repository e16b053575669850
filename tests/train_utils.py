"""Tiny inputs for the training tests: a 128-entry WordPiece vocabulary, synthetic shards, and a runner for
`deepspeed` / `torchrun` / `mpirun` / plain python launches with a hard timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from common.launch import LaunchRequest, command, command_env, free_port
from common.process import kill_group
from data_pipeline.indexed import IndexedDatasetBuilder, best_dtype

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB_SIZE = 128


def write_vocab(path: Path) -> Path:
    words = SPECIALS + [f"w{i}" for i in range(VOCAB_SIZE - len(SPECIALS))]
    path.write_text("\n".join(words) + "\n")
    return path


def write_shard(prefix: Path, num_docs: int = 60, seed: int = 0) -> Path:
    """Documents of 3-12 sentences of 4-20 tokens; tokens follow a simple Markov chain so MLM can learn."""
    rng = np.random.default_rng(seed)
    with IndexedDatasetBuilder(prefix, best_dtype(VOCAB_SIZE)) as b:
        for _ in range(num_docs):
            for _ in range(rng.integers(3, 13)):
                n = int(rng.integers(4, 21))
                start = int(rng.integers(len(SPECIALS), VOCAB_SIZE))
                steps = rng.integers(0, 3, size=n)
                ids = len(SPECIALS) + (start - len(SPECIALS) + np.cumsum(steps)) % (VOCAB_SIZE - len(SPECIALS))
                b.add_item(ids.astype(np.int64))
            b.end_document()
    return prefix


def tiny_model_config(path: Path, **overrides) -> Path:
    from model.config import ModelConfig

    cfg = ModelConfig.preset("tiny", vocab_size=VOCAB_SIZE, **overrides)
    path.write_text(json.dumps(cfg.to_dict()))
    return path


def train_args(
    tmp: Path, ds_config: str, iters: int, *extra: str, seq: int = 64, micro: int = 2, global_batch: int | None = None
) -> list[str]:
    """Common flags for a tiny run reading the fixtures of `tmp` (prepared by `prepare`)."""
    args = [
        "--deepspeed_config",
        str(REPO / "ds_configs" / ds_config),
        "--data-path",
        str(tmp / "shard"),
        "--vocab-file",
        str(tmp / "vocab.txt"),
        "--model-config",
        str(tmp / "model.json"),
        "--seq-length",
        str(seq),
        "--micro-batch-size",
        str(micro),
        "--train-iters",
        str(iters),
        "--lr",
        "1e-3",
        "--lr-warmup-fraction",
        "0.2",
        "--log-interval",
        "1",
        "--eval-interval",
        "0",
        "--num-workers",
        "0",
        "--split",
        "90,10,0",
        "--seed",
        "7",
    ]
    if global_batch is not None:
        args += ["--global-batch-size", str(global_batch)]
    return args + list(extra)


def prepare(tmp: Path, **model_overrides) -> Path:
    write_vocab(tmp / "vocab.txt")
    write_shard(tmp / "shard")
    tiny_model_config(tmp / "model.json", **model_overrides)
    return tmp


def env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    e.update(extra)
    return e


def run_one_rank(entry: str, *argv: str, timeout: float, **env_extra: str) -> None:
    """``python tests/ENTRY ARGV...`` as rank 0 of a one-rank job (what the trainer's entries read from the
    environment), asserting it succeeds; its output is shown when it does not."""
    rank = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1"}
    e = env(**rank, MASTER_PORT=str(free_port()), **env_extra)
    p = subprocess.run(
        [sys.executable, str(REPO / "tests" / entry), *argv],
        cwd=REPO,
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    assert p.returncode == 0, p.stdout[-4000:]


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


#: the launched ranks run on CUDA GPUs (NCCL) rather than CPU (gloo)
CUDA = _cuda_count() > 0
#: ranks a multi-rank test starts: 2 CPU ranks on gloo, or one per GPU up to 2 (NCCL needs a GPU per rank)
NPROCS = min(2, _cuda_count()) if _cuda_count() else 2
#: flags that make CUDA runs bitwise repeatable (CPU runs are without them)
DETERMINISTIC: list[str] = ["--deterministic"] if CUDA else []


def launch(
    kind: str, args: list[str], nprocs: int = NPROCS, timeout: float = 240, entry: Path | None = None, **env_extra: str
):
    """Run training through one launch path (the command line of common/launch.py's table); returns
    CompletedProcess (stdout+stderr merged).

    ``entry`` replaces pretrain/train.py as the script the launchers start."""
    port = free_port()
    program = [str(entry)] if entry else ["-m", "pretrain.train"]
    req = LaunchRequest(launcher=kind, nproc=nprocs, master_port=port, python=sys.executable)
    if kind == "mpirun":
        # an explicit master (the documented `-x MASTER_ADDR -x MASTER_PORT` path): DeepSpeed's MPI discovery would
        # take the fixed port 29500, which collides with any other run on the machine (seen with concurrent tests)
        env_extra = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), **env_extra}
        flags = ["--allow-run-as-root", "--oversubscribe", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS"]
        req.launcher_args = " ".join(flags + sum((["-x", k] for k in env_extra), []))
    elif kind == "python":
        req.nproc = None
    else:
        req.launcher_args = ""  # no launcher knob of the caller's environment
    cmd = command(req, program, env(**env_extra), cwd=REPO)
    return run_group(cmd + args, timeout=timeout, cwd=REPO, env=env(**env_extra))


def deepspeed_pdsh(hostfile: Path, master_addr: str, ssh_args: str) -> tuple[list[str], dict[str, str]]:
    """``deepspeed --hostfile HOSTFILE --launcher pdsh ... pretrain/train.py`` (append the trainer's flags) and its
    environment, as ``python -m common.launch --launcher hostfile`` starts it: the table's command line and its ssh
    keep-alives added to ``ssh_args`` (the user's PDSH_SSH_ARGS_APPEND: the test hosts' key). No ssh check (the key is
    only in those arguments), ``master_addr`` as rank 0's host, a free port."""
    flags = f"--launcher pdsh --no_ssh_check --master_addr {master_addr}"
    req = LaunchRequest("hostfile", hostfile=str(hostfile), master_port=free_port(), launcher_args=flags)
    cmd = command(req, [str(REPO / "pretrain" / "train.py")], {}, REPO)
    e = env(PDSH_SSH_ARGS_APPEND=ssh_args)
    return cmd, {**e, **command_env(req.launcher, e)}


def run_group(cmd: list[str], timeout: float, **popen_kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, timeout=...)`` with merged text output, but in a session of its own that is killed whole
    on timeout: subprocess.run kills only the launcher, and its ranks (children of DeepSpeed's launch.py, torchrun's
    agent, mpirun's orted) lived on after a timed-out test, holding ports, files and CPU for the tests after it."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True, **popen_kwargs
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid, grace_s=0.0)
        out, _ = proc.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, output=out) from None
    finally:
        if proc.poll() is None:  # an exception in communicate (e.g. KeyboardInterrupt): no rank outlives the test
            kill_group(proc.pid, grace_s=0.0)
            proc.wait()
    # the launcher has exited: a rank it left behind (its own exit came first) goes too
    kill_group(proc.pid, grace_s=0.0)
    return subprocess.CompletedProcess(cmd, proc.returncode, out)


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def train_records(path: Path) -> list[dict]:
    return [r for r in read_log(path) if "loss" in r]


def cpu_fp16_missing() -> str | None:
    """Why DeepSpeed refuses fp16 on this machine's CPU ranks (None where it runs: a CUDA GPU, or AVX512-FP16/AMX)."""
    import torch

    if torch.cuda.is_available():
        return None
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().is_fp16_supported():
        return None
    return (
        "DeepSpeed runs fp16 on CPU only with AVX512-FP16 or AMX (torch.ops.mkldnn._is_mkldnn_fp16_supported() "
        "is False on this CPU)"
    )


# A launcher target that sets DeepSpeed's CPU fp16 policy. Lifted: torch's fp16 CPU kernels compute correctly on
# any x86 CPU (only slowly without AVX512-FP16/AMX), so the fp16 logic that is ours is tested on every machine.
# Imposed: the refusal on CPUs without fp16 is tested on CPUs that have it too.
FP16_POLICY_ENTRY = """import sys
sys.path.insert(0, {repo!r})
from deepspeed.accelerator import get_accelerator
type(get_accelerator()).is_fp16_supported = lambda self: {supported}
from pretrain.train import main
sys.exit(main(sys.argv[1:]))
"""


def fp16_policy_entry(tmp: Path, supported: bool) -> Path:
    path = tmp / f"train_cpu_fp16_{'on' if supported else 'off'}.py"
    path.write_text(FP16_POLICY_ENTRY.format(repo=str(REPO), supported=bool(supported)))
    return path


def bf16_gpu_skip_reason() -> str | None:
    """Why a bf16 run cannot be tested on this machine's GPUs (None on CPU and on sm80+): below compute capability
    8.0 the trainer refuses bf16 with exit 2 (tested in tests/test_ds_config.py), so bf16 training tests skip."""
    import torch

    from pretrain.ds_config import gpus_support_bf16

    if torch.cuda.is_available() and not gpus_support_bf16():
        return "bf16 needs compute capability 8.0+ (this GPU has none; the trainer refuses it with exit 2)"
    return None
