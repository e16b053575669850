"""Bounded exit on one host: every process group (ours and DeepSpeed's) has the run's timeout, the watchdog ends a
rank that makes no progress (exit code 5, naming why), and SIGTERM to whatever the user started stops every rank
(with --exit-signal-handler after a committed save). Across hosts (link down, SIGSTOP) see test_multinode.py."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pretrain.watchdog import EXIT_STALLED, GRACE_S, launcher_pids
from tests import train_utils as tu

TIMEOUTS_ENTRY = """import sys
sys.path.insert(0, {repo!r})
from pretrain import trainer, watchdog
real = trainer.Trainer.train
def train(self):
    print(f"[timeouts] rank {{self.dist.rank}}: {{sorted(set(watchdog.group_timeouts()))}} "
          f"groups {{len(watchdog.group_timeouts())}}", flush=True)
    return real(self)
trainer.Trainer.train = train
from pretrain.train import main
from common.process import exit_process
exit_process(main(sys.argv[1:]))
"""


@pytest.mark.extended  # ~17 s of launches; bounded-exit canary: the lost-peer cases
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_every_process_group_has_the_run_timeout(tmp_path):
    """ZeRO-3 on 2 ranks: DeepSpeed's own groups (data parallel, ZeRO's) get --distributed-timeout-minutes, not
    gloo's 30-minute default."""
    tu.prepare(tmp_path)
    entry = tmp_path / "timeouts.py"
    entry.write_text(TIMEOUTS_ENTRY.format(repo=str(tu.REPO)))
    args = tu.train_args(tmp_path, "zero3_fp32.json", 1, "--distributed-timeout-minutes", "0.75")
    p = tu.launch("deepspeed", args, entry=entry, timeout=400)
    assert p.returncode == 0, p.stdout[-3000:]
    # by pattern, not by line: the two ranks share the launcher's stdout and their lines can interleave
    found = re.findall(r"\[timeouts\] rank (\d+): (\[[^\]]*\]) groups (\d+)", p.stdout)
    assert sorted(r for r, _, _ in found) == ["0", "1"], p.stdout[-3000:]
    for _, timeouts, groups in found:
        assert timeouts == "[45.0]", found
        assert int(groups) >= 2, found  # the world and at least one DeepSpeed group


@pytest.mark.extended  # ~30 s: waits out the watchdog
@pytest.mark.timeout(600)
def test_the_watchdog_ends_a_rank_that_stalls_outside_any_collective(tmp_path):
    """A main thread that hangs (SPARSEBERT_FAULT_STALL): the watchdog ends the rank after the timeout + grace,
    exit code 5, naming the iteration; measured from the stall to the exit."""
    tu.prepare(tmp_path)
    args = tu.train_args(tmp_path, "zero1_fp32.json", 50, "--distributed-timeout-minutes", "0.1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pretrain.train", *args],
        cwd=tu.REPO,
        env=tu.env(SPARSEBERT_FAULT_STALL="0:3"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines, stalled = [], None
    try:
        for line in proc.stdout:
            lines.append(line)
            if "[fault] rank 0: stalling at iteration 3" in line:
                stalled = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - stalled if stalled else None
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert code == EXIT_STALLED, out[-3000:]
    assert "[watchdog] rank 0 on " in out and "no progress for" in out and "after iteration 2" in out
    print(f"stalled rank ended {took:.1f} s after the stall (timeout 6 s + {GRACE_S:.0f} s grace)")
    assert 6 + GRACE_S - 2 < took < 6 + GRACE_S + 15, took


def _first_child(pid: int, timeout_s: float = 30.0) -> int:
    """The pid of the first child ``pid`` starts (waits for it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        if out:
            return int(out[0])
        time.sleep(0.1)
    raise AssertionError(f"process {pid} started no child within {timeout_s:.0f} s")


def test_launcher_chain_stops_at_the_first_non_launcher():
    """deepspeed runner -> launch.py -> rank: both launchers are watched; pytest above them is not."""
    inner = "import subprocess, sys; subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"
    outer = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {inner!r}, 'deepspeed.launcher.launch'])"
    runner = subprocess.Popen([sys.executable, "-c", outer, "/venv/bin/deepspeed"])
    try:
        launch = _first_child(runner.pid)
        assert [pid for pid, _ in launcher_pids(launch)] == [launch, runner.pid]
        assert launcher_pids(os.getpid()) == []  # pytest is no launcher
    finally:
        runner.kill()
        runner.wait()


def test_a_shell_running_one_of_our_scripts_is_a_launcher_however_it_was_named(tmp_path, monkeypatch):
    """`bash ./pretrain_blockbert.sh` started from inside run_scripts/ has no "run_scripts/" on its command line; the
    script bash reads (its fd 255) says what it runs. A shell running another script is not a launcher."""
    import pretrain.watchdog as wd

    ours = tmp_path / "run_scripts"
    ours.mkdir()
    (ours / "job.sh").write_text(f"{sys.executable} -c 'import time; time.sleep(60)'\n")
    shell = subprocess.Popen(["bash", "./job.sh"], cwd=ours)
    try:
        _first_child(shell.pid)  # bash is running the script's command: launcher_pids reads from bash up
        assert wd.launcher_pids(shell.pid) == []  # the repository's run_scripts/ is elsewhere
        monkeypatch.setattr(wd, "_RUN_SCRIPTS", ours)
        assert [pid for pid, _ in wd.launcher_pids(shell.pid)] == [shell.pid]
    finally:
        shell.kill()
        shell.wait()
        subprocess.run(["pkill", "-f", f"{ours}"], check=False)


def _rank_pids(marker: str) -> list[int]:
    """Rank processes of one test run: the trainer's entry (not a launcher) with the run's files in its arguments."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        trainer = "pretrain/train.py" in argv[:3] or any(a.endswith("pretrain/train.py") for a in argv[:3])
        trainer = trainer or argv[1:3] == ["-m", "pretrain.train"]
        if trainer and any(marker in a for a in argv):
            out.append(int(d.name))
    return out


def _start(kind: str, args: list[str], log: Path, **env_extra: str) -> subprocess.Popen:
    port = str(tu.free_port())
    script = str(tu.REPO / "pretrain" / "train.py")
    env = tu.env(**env_extra)
    if kind == "script":  # our run_scripts: common.sh runs the deepspeed launcher as its child
        cmd = ["bash", str(tu.REPO / "run_scripts" / "common.sh")]
    elif kind == "deepspeed":
        cmd = [str(tu.VENV_BIN / "deepspeed"), "--num_gpus", str(tu.NPROCS), "--master_port", port, script]
    elif kind == "torchrun":
        cmd = [str(tu.VENV_BIN / "torchrun"), "--nproc_per_node", str(tu.NPROCS), "--master_port", port, script]
    else:
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(tu.NPROCS)]
        cmd += ["-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS", "-x", "MASTER_ADDR", "-x", "MASTER_PORT"]
        cmd += ["-x", "TORCH_EXTENSIONS_DIR", sys.executable, "-m", "pretrain.train"]
    return subprocess.Popen(  # a session of its own, as a command started from a terminal: its group is its own
        cmd + args, cwd=tu.REPO, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True
    )


@pytest.mark.multirank
@pytest.mark.timeout(1200)
@pytest.mark.parametrize(
    "kind, handler, how",
    [  # all in the extended tier (~20 s each); the default tier's signal canary is tests/test_exit_signal.py
        pytest.param("deepspeed", True, "SIGTERM", marks=pytest.mark.extended),
        pytest.param("deepspeed", False, "SIGTERM", marks=pytest.mark.extended),
        pytest.param("torchrun", True, "SIGTERM", marks=pytest.mark.extended),
        pytest.param("mpirun", True, "SIGTERM", marks=pytest.mark.extended),
        pytest.param(
            "script", True, "SIGTERM", marks=pytest.mark.extended
        ),  # our run_scripts/: bash dies, its deepspeed runner is left to the ranks' watch
        pytest.param("script", True, "SIGKILL", marks=pytest.mark.extended),  # nothing can catch it: the ranks' watch
        pytest.param("deepspeed", True, "ctrl-c", marks=pytest.mark.extended),  # SIGINT to the whole foreground group
    ],
)
def test_sigterm_to_the_launcher_stops_every_rank(tmp_path, kind, handler, how):
    """SIGTERM (or SIGKILL) to the process the user started, or Ctrl-C (SIGINT to its whole process group), mid-run:
    no rank trains on (every rank process is gone within 60 s); with --exit-signal-handler the ranks first save one
    committed checkpoint, which is `latest`."""
    if kind == "mpirun" and not __import__("shutil").which("mpirun"):
        pytest.skip("mpirun not installed (run_scripts/setup_env.sh)")
    tu.prepare(tmp_path)
    args = tu.train_args(tmp_path, "zero2_fp32.json", 5000, "--log-interval", "1")
    if kind == "script":  # common.sh adds --save/--load/--log-json under OUT, and the handler with EXIT_SIGNAL
        ck, log = tmp_path / "run" / "ckpt", tmp_path / "run" / "log.jsonl"
        extra = {"OUT": str(tmp_path / "run"), "NPROC": str(tu.NPROCS), "EXIT_SIGNAL": "SIGTERM"}
    else:
        ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
        args += ["--save", str(ck), "--log-json", str(log)] + (["--exit-signal-handler"] if handler else [])
        extra = {}
    proc = _start(kind, args, tmp_path / "out.log", **extra)
    try:
        deadline = time.monotonic() + 700  # start-up on the loaded 2-core box took over 300 s
        while not (log.is_file() and len(tu.train_records(log)) >= 2):
            assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no second iteration within 700 s"
            time.sleep(0.2)
        if how == "ctrl-c":  # a terminal sends SIGINT to every process of the foreground group
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(getattr(signal, how))
        sent = time.monotonic()
        proc.wait(timeout=120)
        while _rank_pids(str(tmp_path)) and time.monotonic() - sent < 60:
            time.sleep(0.2)
        left = _rank_pids(str(tmp_path))
        gone_after = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _rank_pids(str(tmp_path)):
            os.kill(pid, signal.SIGKILL)
    out = (tmp_path / "out.log").read_text()
    assert not left, f"ranks {left} still running {gone_after:.0f} s after {how} to {kind}:\n{out[-3000:]}"
    print(f"{kind} (handler {handler}): every rank gone {gone_after:.1f} s after {how}")
    assert proc.returncode != 0
    last = tu.train_records(log)[-1]["iteration"]
    time.sleep(2)
    assert tu.train_records(log)[-1]["iteration"] == last  # nothing trains on
    if handler:
        assert "received: stopping at iteration" in out, out[-3000:]
        tag = (ck / "latest").read_text()
        assert (ck / tag / "commit.json").is_file() and int(tag[5:]) == last
    else:
        assert not (ck / "latest").exists() or int((ck / "latest").read_text()[5:]) <= last


PEER_ENTRY = """import os, sys, time
from datetime import timedelta
sys.path.insert(0, {repo!r})
import torch, torch.distributed as dist
from pretrain.watchdog import peer_lost
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=timedelta(seconds=3))
dist.all_reduce(torch.ones(1))
if rank == 1:
    {peer}
try:
    dist.all_reduce(torch.ones(1))
except RuntimeError as e:
    print("PEER_LOST", peer_lost(e), flush=True)
    print("SAME_TEXT_ELSEWHERE", peer_lost(RuntimeError(str(e))), flush=True)
os._exit(0)
"""


@pytest.mark.multirank
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "peer, marker", [("os._exit(1)", ""), ("time.sleep(30)", "Timed out waiting")], ids=["died", "stopped_answering"]
)
def test_a_collective_failed_by_a_lost_peer_is_recognised(tmp_path, peer, marker):
    """A real gloo collective whose peer died (connection closed) or stopped answering (timed out after the group's
    3 s) raises an error that ``peer_lost`` recognises, so the entry point exits 5 (requeued by Slurm) instead of 1;
    the same text raised outside torch.distributed is not taken for it."""
    script = tmp_path / "peer.py"
    script.write_text(PEER_ENTRY.format(repo=str(tu.REPO), port=tu.free_port(), peer=peer))
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        out0, _ = procs[0].communicate(timeout=90)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    lost = next(line for line in out0.splitlines() if line.startswith("PEER_LOST"))
    assert lost != "PEER_LOST None" and marker in lost, out0
    assert "SAME_TEXT_ELSEWHERE None" in out0
