"""Across hosts: a cluster of test hosts on one machine (tests/netns_cluster.py: network namespaces on a private
bridge, an sshd each, the machine's filesystem as the shared one). Skipped, naming what is missing, without root,
`ip netns`, sshd or pdsh."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from pretrain.checkpoint import committed_tags, verify_tag
from tests import train_utils as tu
from tests.cluster_skip import start_failed
from tests.netns_cluster import IFNAME, NetnsCluster, Unavailable, why_unavailable

pytestmark = [pytest.mark.multirank]


def _skip_reason() -> str | None:
    return why_unavailable() or (None if shutil.which("pdsh") else "pdsh not installed (run_scripts/setup_env.sh)")


@pytest.fixture
def cluster(tmp_path):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    try:
        c = NetnsCluster(tmp_path / "cluster", hosts=2)
    except Unavailable as e:
        start_failed("the 2-host test cluster", e)
    try:
        yield c
    finally:
        c.close()


def _launch_dir(tmp_path: Path, c: NetnsCluster) -> Path:
    """The launcher's working directory: its .deepspeed_env reaches every host (DeepSpeed's own mechanism)."""
    d = tmp_path / "launch"
    d.mkdir(exist_ok=True)
    (d / ".deepspeed_env").write_text(
        f"GLOO_SOCKET_IFNAME={IFNAME}\nTORCH_EXTENSIONS_DIR={tu.env()['TORCH_EXTENSIONS_DIR']}\nOMP_NUM_THREADS=1\n"
    )
    (d / "hostfile").write_text("".join(f"{a} slots=1\n" for a in c.addresses))
    return d


def deepspeed_across(c: NetnsCluster, launch: Path, args: list[str], timeout: float = 400):
    """`deepspeed --hostfile` with the pdsh launcher, started on host 0, one rank per host."""
    cmd, env = _pdsh(c, launch / "hostfile")
    return c.run(0, cmd + args, timeout=timeout, cwd=launch, env=env)


def _wait_records(proc, log: Path, n: int, out_path: Path, within: float = 400) -> None:
    """Wait until the run logged ``n`` iterations (the launcher still running)."""
    import time

    deadline = time.monotonic() + within
    while not (log.is_file() and len(tu.train_records(log)) >= n):
        assert proc.poll() is None, out_path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"no iteration {n} within {within:.0f} s"
        time.sleep(0.2)


def _set_link(c: NetnsCluster, host: int, state: str) -> None:
    """Host ``host``'s cluster link ``down`` (no reset reaches anyone: a power loss, a switch failure) or ``up``."""
    import subprocess

    subprocess.run(["ip", "-n", c.namespaces[host], "link", "set", IFNAME, state], check=True)


def _pdsh(c: NetnsCluster, hostfile: Path) -> tuple[list[str], dict[str, str]]:
    """The deepspeed pdsh command (the trainer's flags follow) and its environment, with the test hosts' ssh key."""
    return tu.deepspeed_pdsh(hostfile, c.addresses[0], " ".join(c.ssh_options))


@pytest.mark.extended  # ~60 s; the default tier's multi-host canary: test_deepspeed_openmpi_launcher_across_two_hosts
@pytest.mark.timeout(900)
def test_deepspeed_pdsh_across_two_hosts_trains_saves_and_resumes_exactly(cluster, tmp_path):
    data = tu.prepare(tmp_path)
    launch = _launch_dir(tmp_path, cluster)
    common = tu.train_args(data, "zero2_fp32.json", 4, *tu.DETERMINISTIC, global_batch=4)
    straight = deepspeed_across(cluster, launch, common + ["--log-json", str(tmp_path / "a.jsonl")])
    assert straight.returncode == 0, straight.stdout[-4000:]
    assert "2 rank(s), backend gloo" in straight.stdout
    ck = str(tmp_path / "ck")
    resumable = common + ["--log-json", str(tmp_path / "b.jsonl"), "--save", ck, "--load", ck]
    first = deepspeed_across(cluster, launch, resumable + ["--exit-interval", "2"])
    assert first.returncode == 0, first.stdout[-4000:]
    second = deepspeed_across(cluster, launch, resumable)
    assert second.returncode == 0, second.stdout[-4000:]
    a, b = tu.train_records(tmp_path / "a.jsonl"), tu.train_records(tmp_path / "b.jsonl")
    assert [r["iteration"] for r in b] == [1, 2, 3, 4]
    assert [r["loss"] for r in a] == [r["loss"] for r in b]  # bitwise: same ranks, same batches


@pytest.mark.extended  # ~95 s (CI's budget): run_scripts/repeat_check.sh runs it
@pytest.mark.timeout(1200)
def test_a_lost_node_costs_one_checkpoint_interval(cluster, tmp_path):
    """Every process of host 1 is killed mid-run: the surviving rank exits non-zero within the bounded-exit limit
    (timeout + 60 s), no checkpoint is half-written, and the same command with the hostfile minus host 1 resumes
    on one rank (ZeRO-2 state re-partitioned, global batch, sample position and LR schedule unchanged) to the losses
    of a straight 2-host run within 1e-4 relative (dropout 0)."""
    import subprocess
    import time

    data = tu.prepare(tmp_path, hidden_dropout=0.0, attention_dropout=0.0)
    launch = _launch_dir(tmp_path, cluster)
    ck = tmp_path / "ck"
    iters, log = 12, tmp_path / "run.jsonl"
    common = tu.train_args(data, "zero2_fp32.json", iters, global_batch=4)
    common += ["--distributed-timeout-minutes", str(TIMEOUT_MIN)]
    straight = deepspeed_across(cluster, launch, [*common, "--log-json", str(tmp_path / "a")])
    args = [*common, "--log-json", str(log), "--save", str(ck), "--load", str(ck), "--save-interval", "3"]
    assert straight.returncode == 0, straight.stdout[-4000:]

    # rank 0 reads each micro-batch 1 s late (no effect on the numbers), so the run is still going when host 1 dies
    slow = launch / "slow"
    slow.mkdir()
    (slow / ".deepspeed_env").write_text((launch / ".deepspeed_env").read_text() + "SPARSEBERT_FAULT_SLOW_DATA=0:1\n")
    cmd, env = _pdsh(cluster, launch / "hostfile")
    full = cluster.host_cmd(0, [*cmd, *args])
    out_path = tmp_path / "lost.log"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(full, cwd=slow, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while not (ck / "iter_0000006" / "commit.json").is_file():
                assert proc.poll() is None, out_path.read_text()[-3000:]
                assert time.monotonic() < deadline, "no second checkpoint within 300 s"
                time.sleep(0.1)
            killed = time.monotonic()
            cluster.kill_host(1)
            code = proc.wait(timeout=TIMEOUT_MIN * 60 + 120)
            waited = time.monotonic() - killed
        finally:
            if proc.poll() is None:
                proc.kill()
    lost = out_path.read_text()
    assert code != 0, lost[-3000:]
    assert f"iteration {iters}/{iters}" not in lost, "the run ended before host 1 was lost"
    print(f"lost node: the launcher exited {code} after {waited:.1f} s (bound {TIMEOUT_MIN * 60 + 60:.0f} s)")
    assert waited < TIMEOUT_MIN * 60 + 60, f"the surviving rank took {waited:.0f} s to stop"
    committed = sorted(p.parent.name for p in ck.glob("iter_*/commit.json"))
    assert committed and committed[-1] >= "iter_0000006"
    assert all((ck / t / "commit.json").is_file() for t in (p.name for p in ck.glob("iter_*")) if t <= committed[-1])
    last = int(committed[-1][5:])

    one_host = launch / "hostfile.left"
    one_host.write_text(f"{cluster.addresses[0]} slots=1\n")
    cmd, env = _pdsh(cluster, one_host)
    resumed = cluster.run(0, [*cmd, *args], timeout=400, cwd=launch, env=env)
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "was saved by 2 rank(s), this run has 1" in resumed.stdout
    assert "global batch 4 kept (2 accumulation step(s) of 2 on 1 rank(s))" in resumed.stdout
    a = {r["iteration"]: r for r in tu.train_records(tmp_path / "a")}
    after = tu.train_records(log)[-(iters - last) :]  # the resumed run appends to the lost run's log
    assert [r["iteration"] for r in after] == list(range(last + 1, iters + 1))
    for r in after:
        assert r["consumed_samples"] == a[r["iteration"]]["consumed_samples"]
        assert r["lr"] == a[r["iteration"]]["lr"]  # no schedule change
    worst = max(abs(r["loss"] - a[r["iteration"]]["loss"]) / abs(a[r["iteration"]]["loss"]) for r in after)
    print(f"lost node: resumed from {committed[-1]} on 1 rank, largest relative loss difference {worst:.3g}")
    assert worst <= 1e-4, ([a[r["iteration"]]["loss"] for r in after], [r["loss"] for r in after])


TIMEOUT_MIN = 0.5
"""--distributed-timeout-minutes of the bounded-exit tests: the survivor must be gone within this + 60 s."""


def _rank_pid(cluster: NetnsCluster, host: int) -> int | None:
    """The training rank's pid on a host (its launch.py's child: `train.py --local_rank=...`)."""
    import subprocess

    pids = subprocess.run(["ip", "netns", "pids", cluster.namespaces[host]], capture_output=True, text=True)
    for p in pids.stdout.split():
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "train.py" in cmd and "--local_rank" in cmd and "deepspeed.launcher" not in cmd:
            return int(p)
    return None


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "fault",
    [pytest.param(f, marks=pytest.mark.extended) for f in ("link_down", "sigstop")],  # ~25 s each after the cluster
)
def test_a_peer_that_stops_answering_ends_the_survivor_in_bounded_time(cluster, tmp_path, fault):
    """Host 1 stops answering without any reset reaching host 0: its link goes down (`ip link set ... down` inside
    its namespace: a power loss, a switch failure) or its rank is SIGSTOPped (a frozen process). The rank on host 0
    must be gone within --distributed-timeout-minutes + 60 s (measured), non-zero, naming rank 1; with the link down
    the `deepspeed` command itself ends too (pdsh's ssh gives up through ServerAliveInterval)."""
    import signal
    import subprocess
    import time

    data = tu.prepare(tmp_path, hidden_dropout=0.0, attention_dropout=0.0)
    launch = _launch_dir(tmp_path, cluster)
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    args = tu.train_args(data, "zero2_fp32.json", 400, global_batch=4)
    args += ["--save", str(ck), "--load", str(ck), "--save-interval", "3", "--log-json", str(log)]
    args += ["--distributed-timeout-minutes", str(TIMEOUT_MIN)]
    cmd, env = _pdsh(cluster, launch / "hostfile")  # with ssh keep-alives, as common.launch starts it
    full = cluster.host_cmd(0, [*cmd, *args])
    out_path = tmp_path / "run.log"
    proc = subprocess.Popen(full, cwd=launch, env=env, stdout=open(out_path, "w"), stderr=subprocess.STDOUT)
    try:
        _wait_records(proc, log, 4, out_path)
        survivor, peer = _rank_pid(cluster, 0), _rank_pid(cluster, 1)
        assert survivor and peer
        if fault == "link_down":
            _set_link(cluster, 1, "down")
        else:
            os.kill(peer, signal.SIGSTOP)
        start = time.monotonic()
        bound = TIMEOUT_MIN * 60 + 60
        while Path(f"/proc/{survivor}").exists() and time.monotonic() - start < bound + 60:
            time.sleep(0.2)
        survivor_s = time.monotonic() - start
        launcher_s = None
        if fault == "link_down":
            proc.wait(timeout=max(1.0, bound + 30 - survivor_s))
            launcher_s = time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
    out = out_path.read_text()
    print(f"{fault}: survivor gone after {survivor_s:.1f} s; launcher after {launcher_s} s (bound {bound:.0f} s)")
    assert survivor_s < bound, f"the surviving rank took {survivor_s:.0f} s to stop:\n{out[-4000:]}"
    codes = [int(x) for x in re.findall(r"exits with return code = (-?\d+)", out)]
    assert codes and all(c != 0 for c in codes), out[-4000:]
    assert 5 in codes, out[-4000:]  # the survivor: a peer lost, the code Slurm's requeue acts on
    assert "Timed out" in out or "waited for rank 1" in out, out[-4000:]
    if launcher_s is not None:
        assert proc.returncode != 0 and launcher_s < bound + 30, (proc.returncode, launcher_s)
    committed = [t for _, t in committed_tags(ck)]
    assert committed  # only committed checkpoints count; each verifies
    assert all(verify_tag(ck, t) == ([], True) for t in committed)


def readme_multi_host_command(launcher: str = "hostfile") -> str:
    """The README's `python -m common.launch --launcher LAUNCHER` line of its "Several nodes" block, without its
    comment: what a user copies."""
    block = (tu.REPO / "README.md").read_text().split("Several nodes:", 1)[1].split("```", 2)[1]
    lines = [ln.split("  #")[0].strip() for ln in block.splitlines() if f"--launcher {launcher} " in ln]
    assert len(lines) == 1, f"README.md, Several nodes: one `--launcher {launcher}` line expected, found {lines}"
    return lines[0]


README_TIMEOUT_MIN = 1
"""--distributed-timeout-minutes of the README command's lost-host test (the README run a user would start)."""


@pytest.mark.extended  # 136-141 s, 385 s on a busier run (CI's budget): run_scripts/repeat_check.sh runs it
@pytest.mark.timeout(900)
def test_the_readmes_multi_host_command_ends_when_a_host_is_lost(cluster, tmp_path):
    """The README's multi-host command, as written (its hostfile and ARGS filled in; the test hosts' ssh key in
    PDSH_SSH_ARGS_APPEND and the master in DS_ARGS, the knobs a user sets), on two hosts; host 1's link goes down
    mid-run (no reset reaches anyone). The command itself must end, non-zero, within --distributed-timeout-minutes
    + 60 s: the survivor times out, and pdsh's ssh session to host 1 gives up through the keep-alives
    common.launch adds (without them it waits forever)."""
    import shlex
    import subprocess
    import time

    data = tu.prepare(tmp_path, hidden_dropout=0.0, attention_dropout=0.0)
    launch = _launch_dir(tmp_path, cluster)
    log = tmp_path / "log.jsonl"
    args = tu.train_args(data, "zero2_fp32.json", 400, global_batch=4)
    args += ["--log-json", str(log), "--distributed-timeout-minutes", str(README_TIMEOUT_MIN)]
    line = readme_multi_host_command().replace("run_scripts/hostfile", str(launch / "hostfile"))
    line = line.replace("ARGS", shlex.join(args))
    env = tu.env(
        PDSH_SSH_ARGS_APPEND=" ".join(cluster.ssh_options),
        DS_ARGS=f"--no_ssh_check --master_addr {cluster.addresses[0]} --master_port {tu.free_port()}",
        DS_ENV_FILE=str(launch / ".deepspeed_env"),
    )
    out_path = tmp_path / "run.log"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(
            cluster.host_cmd(0, ["bash", "-c", line]), cwd=tu.REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            _wait_records(proc, log, 4, out_path)
            _set_link(cluster, 1, "down")
            start = time.monotonic()
            bound = README_TIMEOUT_MIN * 60 + 60
            try:
                code = proc.wait(timeout=bound + 30)
            except subprocess.TimeoutExpired:
                code = None
            took = time.monotonic() - start
        finally:
            if proc.poll() is None:
                proc.kill()
    out = out_path.read_text()
    print(
        f"README command ({line.split(' --', 1)[0]} ...): host 1's link down; the command "
        + (f"ended after {took:.1f} s, code {code}" if code is not None else f"still ran after {took:.1f} s")
        + f" (bound {bound} s)"
    )
    assert code is not None and took < bound, f"the README's command still ran {took:.0f} s after:\n{out[-4000:]}"
    assert code != 0, out[-4000:]
    assert "2 rank(s), backend gloo" in out, out[-4000:]


@pytest.mark.extended  # ~10 s; multi-host canary stays
@pytest.mark.timeout(600)
def test_a_wrong_network_interface_fails_in_bounded_time_naming_it(cluster, tmp_path):
    import time

    data = tu.prepare(tmp_path)
    launch = _launch_dir(tmp_path, cluster)
    env_file = launch / ".deepspeed_env"
    env_file.write_text(env_file.read_text().replace(f"GLOO_SOCKET_IFNAME={IFNAME}", "GLOO_SOCKET_IFNAME=ib0"))
    start = time.monotonic()
    p = deepspeed_across(
        cluster, launch, tu.train_args(data, "zero2_fp32.json", 2) + ["--distributed-timeout-minutes", "1"]
    )
    took = time.monotonic() - start
    assert p.returncode != 0
    assert "ib0" in p.stdout, p.stdout[-3000:]
    assert took < 240, f"{took:.0f} s"


@pytest.mark.timeout(600)
def test_deepspeed_openmpi_launcher_across_two_hosts(cluster, tmp_path):
    """`deepspeed --hostfile --launcher openmpi`: mpirun starts its daemons on the other host over ssh (its rsh agent
    with the cluster's key) and the ranks meet over the cluster interface."""
    if not shutil.which("mpirun"):
        pytest.skip("mpirun not installed (run_scripts/setup_env.sh)")
    data = tu.prepare(tmp_path)
    launch = _launch_dir(tmp_path, cluster)
    ssh = "ssh " + " ".join(cluster.ssh_options)
    mpi = f"--allow-run-as-root --mca plm_rsh_agent '{ssh}' --mca oob_tcp_if_include {IFNAME}"
    port = tu.free_port()
    # the master given to every rank (-x): no MPI call at all (DeepSpeed's MPI discovery would bcast over the btl
    # that its openmpi runner pins to eth0, which these hosts do not have)
    mpi += f" -x GLOO_SOCKET_IFNAME={IFNAME} -x TORCH_EXTENSIONS_DIR -x OMP_NUM_THREADS=1"
    mpi += f" -x MASTER_ADDR={cluster.addresses[0]} -x MASTER_PORT={port}"
    cmd = [str(tu.VENV_BIN / "deepspeed"), "--hostfile", str(launch / "hostfile"), "--launcher", "openmpi"]
    cmd += ["--launcher_args", mpi, "--no_ssh_check", "--master_addr", cluster.addresses[0]]
    cmd += ["--master_port", str(port), str(tu.REPO / "pretrain" / "train.py")]
    args = tu.train_args(data, "zero2_fp32.json", 2, "--log-json", str(tmp_path / "log.jsonl"))
    p = cluster.run(0, cmd + args, timeout=500, cwd=launch, env=tu.env())
    assert p.returncode == 0, p.stdout[-4000:]
    assert "2 rank(s), backend gloo" in p.stdout
    assert [r["iteration"] for r in tu.train_records(tmp_path / "log.jsonl")] == [1, 2]


@pytest.mark.timeout(600)
def test_preprocessing_under_mpirun_across_two_hosts_writes_the_bytes_of_one_process(
    cluster, bert_uncased_vocab, tmp_path
):
    """`mpirun --host A,B python -m data_pipeline.preprocess`: one rank per host, rank 0 merges what both wrote on
    the shared filesystem; the shards equal a single process's byte for byte."""
    import sys

    if not shutil.which("mpirun"):
        pytest.skip("mpirun not installed (run_scripts/setup_env.sh)")
    vocab = bert_uncased_vocab
    sample = tu.REPO / "run_scripts" / "sample_data" / "corpus"
    args = ["-m", "data_pipeline.preprocess", "--input", str(sample), "--tokenizer-type", "BertWordPieceLowerCase"]
    args += ["--vocab-file", str(vocab), "--split-sentences", "--workers", "1", "--no-progress"]
    one = cluster.run(0, [sys.executable, *args, "--output-prefix", str(tmp_path / "one")], env=tu.env(), cwd=tu.REPO)
    assert one.returncode == 0, one.stdout[-3000:]
    ssh = "ssh " + " ".join(cluster.ssh_options)
    mpirun = ["mpirun", "--allow-run-as-root", "--host", ",".join(cluster.addresses), "-np", "2"]
    mpirun += ["--mca", "plm_rsh_agent", ssh, "--mca", "oob_tcp_if_include", IFNAME]
    mpirun += ["--mca", "btl_tcp_if_include", IFNAME, "--mca", "btl", "tcp,self", "-x", "PYTHONPATH"]
    two = cluster.run(
        0, mpirun + [sys.executable, *args, "--output-prefix", str(tmp_path / "two")], env=tu.env(), cwd=tu.REPO
    )
    assert two.returncode == 0, two.stdout[-3000:]
    assert "rank 1/2" in two.stdout
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one_text_sentence{ext}").read_bytes() == (
            tmp_path / f"two_text_sentence{ext}"
        ).read_bytes()


@pytest.mark.extended  # multi-host refusal; multi-host canary stays
@pytest.mark.timeout(600)
def test_a_node_local_save_directory_stops_the_run_at_start_naming_the_host(tmp_path):
    """Host 1 sees an empty directory of its own at the --save path (a node-local disk, in a mount namespace of its
    own): the run stops before training, on every rank, with the message that names host 1."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    save = tmp_path / "ck"
    try:
        c = NetnsCluster(tmp_path / "cluster", hosts=2, private_dirs={1: [save]})
    except Unavailable as e:
        start_failed("the 2-host test cluster", e)
    try:
        data = tu.prepare(tmp_path)
        launch = _launch_dir(tmp_path, c)
        args = tu.train_args(data, "zero2_fp32.json", 2) + ["--save", str(save), "--log-json", str(tmp_path / "l")]
        p = deepspeed_across(c, launch, args + ["--distributed-timeout-minutes", "1"])
    finally:
        c.close()
    assert p.returncode != 0
    assert f"rank 1 on {c.names[1]} cannot see it" in p.stdout, p.stdout[-3000:]
    assert "a shared file system, not node-local disks" in p.stdout
    assert not (tmp_path / "l").exists() or not tu.train_records(tmp_path / "l")  # stopped before any step
    assert not list(save.iterdir())  # the probe is gone; nothing half-written


# ---------------------------------------------------------------------------------------------------- Slurm, 2 nodes
ITERS = 60  # long enough that the time-limit signal (sent after 2 steps) always lands before the run's end


@pytest.fixture(scope="module")
def slurm2(tmp_path_factory):
    """Two test hosts with a slurmd each (slurmctld on the first): `sbatch -N 2` spans both."""
    from tests.slurm_cluster import SlurmCluster, slurm_run_dir
    from tests.slurm_cluster import Unavailable as SlurmUnavailable
    from tests.slurm_cluster import why_unavailable as slurm_why

    reason = _skip_reason() or slurm_why()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("slurm2")
    try:
        hosts = NetnsCluster(root / "hosts", hosts=2, private_dirs={i: [slurm_run_dir(root / "slurm")] for i in (0, 1)})
    except Unavailable as e:
        start_failed("the 2-host test cluster", e)
    try:
        with SlurmCluster(root / "slurm", hosts=hosts) as s:
            yield s
    except SlurmUnavailable as e:
        start_failed("the 2-node test Slurm cluster", e)
    finally:
        hosts.close()


def _job_env(**extra: str) -> dict[str, str]:
    """What a user's job gets: no GLOO_SOCKET_IFNAME (gloo takes the interface of the host's name, as on a cluster
    whose host names resolve to the cluster network)."""
    e = {"PYTHONPATH": str(tu.REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return {**e, "TORCH_EXTENSIONS_DIR": tu.env()["TORCH_EXTENSIONS_DIR"], **extra}


def _template_job(s, template: str, data: Path, out: Path, **env: str) -> str:
    args = ["args", *tu.train_args(data, "zero2_fp32.json", ITERS, global_batch=4)]
    sbatch = ["-N2", "--ntasks-per-node=1", "-o", str(out), str(tu.REPO / "run_scripts" / "slurm" / template), *args]
    return s.sbatch(sbatch, env=_job_env(**env), cwd=tu.REPO)


def _wait_lines(path: Path, n: int, s, job: str, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.is_file() and len(tu.train_records(path)) >= n:
            return
        if s.job(job).get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
            break
        time.sleep(0.2)
    raise AssertionError(f"job {job}: fewer than {n} records in {path}: {s.job(job)}\n{s.daemon_logs()}")


@pytest.mark.extended  # ~75 s (CI's budget; test_slurm's time-limit requeue stays in CI): run_scripts/repeat_check.sh
@pytest.mark.timeout(900)
def test_sbatch_two_nodes_srun_template_trains_and_a_requeue_resumes_exactly(slurm2, tmp_path):
    """`sbatch -N 2 pretrain_srun.sbatch`: one rank per node; the time-limit signal mid-run saves, the job requeues
    itself (on both nodes again) and resumes to the losses of the uninterrupted job, bitwise."""
    data = tu.prepare(tmp_path)
    job = _template_job(slurm2, "pretrain_srun.sbatch", data, tmp_path / "a.out", OUT=str(tmp_path / "a"))
    info = slurm2.wait_job(job, timeout=400)
    text = (tmp_path / "a.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:] + slurm2.daemon_logs()
    assert info["NumNodes"] == "2" and "2 node(s), 2 task(s)" in text and "[pretrain] 2 rank(s), backend gloo" in text
    straight = [r["loss"] for r in tu.train_records(tmp_path / "a" / "log.jsonl")]
    assert len(straight) == ITERS

    run = tmp_path / "b"
    job = _template_job(slurm2, "pretrain_srun.sbatch", data, tmp_path / "b.out", OUT=str(run))
    _wait_lines(run / "log.jsonl", 2, slurm2, job, timeout=300)
    slurm2.run(["scancel", "--signal=USR1", job])  # what --signal=USR1@120 does before the time limit
    slurm2.wait_job(job, timeout=180, until=lambda j: j.get("Restarts") == "1")
    info = slurm2.wait_job(job, timeout=400)
    text = (tmp_path / "b.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    import re

    stop = re.search(r"SIGUSR1 received: stopping at iteration (\d+)", text)
    assert stop and f"job {job} (restart 1)" in text, text[-3000:]
    stopped = int(stop.group(1))
    assert f"resumed from {run}/ckpt/iter_{stopped:07d}" in text and 2 <= stopped < ITERS
    recs = tu.train_records(run / "log.jsonl")
    assert [r["iteration"] for r in recs] == list(range(1, ITERS + 1))
    assert [r["loss"] for r in recs] == straight  # exact, across the requeue


@pytest.mark.extended  # ~10-15 s per launcher after the cluster; Slurm canary: tests/test_slurm.py
@pytest.mark.timeout(600)
@pytest.mark.parametrize("launcher", ["openmpi", "pdsh"])
def test_sbatch_two_nodes_deepspeed_template(slurm2, launcher, tmp_path):
    """`sbatch -N 2 pretrain_deepspeed.sbatch`: the hostfile comes from the allocation; DS_LAUNCHER=openmpi: mpirun
    starts its daemon on the second node through srun; pdsh: over ssh (the test hosts' sshd and key, as a cluster
    with passwordless ssh between its nodes), the environment through DeepSpeed's .deepspeed_env file."""
    if not shutil.which("mpirun" if launcher == "openmpi" else "pdsh"):
        pytest.skip(f"{'mpirun' if launcher == 'openmpi' else 'pdsh'} not installed (run_scripts/setup_env.sh)")
    data = tu.prepare(tmp_path)
    env = {"DS_LAUNCHER": launcher}
    if launcher == "pdsh":
        env_file = tmp_path / "deepspeed_env"
        env_file.write_text(f"TORCH_EXTENSIONS_DIR={tu.env()['TORCH_EXTENSIONS_DIR']}\nOMP_NUM_THREADS=1\n")
        env.update(DS_ENV_FILE=str(env_file), PDSH_SSH_ARGS_APPEND=" ".join(slurm2.hosts.ssh_options))
    out = tmp_path / "job.out"
    job = _template_job(slurm2, "pretrain_deepspeed.sbatch", data, out, OUT=str(tmp_path / "run"), **env)
    info = slurm2.wait_job(job, timeout=500)
    text = (tmp_path / "job.out").read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-4000:] + slurm2.daemon_logs()
    assert "2 node(s) x 1 slot(s)" in text and "[pretrain] 2 rank(s), backend gloo" in text
    assert len(tu.train_records(tmp_path / "run" / "log.jsonl")) == ITERS


@pytest.mark.timeout(600)
def test_preprocessing_under_srun_across_two_nodes_writes_the_bytes_of_one_process(
    slurm2, bert_uncased_vocab, tmp_path
):
    import subprocess
    import sys

    sample = tu.REPO / "run_scripts" / "sample_data" / "corpus"
    args = ["-m", "data_pipeline.preprocess", "--input", str(sample), "--tokenizer-type", "BertWordPieceLowerCase"]
    args += ["--vocab-file", str(bert_uncased_vocab), "--split-sentences", "--workers", "1", "--no-progress"]
    one = [sys.executable, *args, "--output-prefix", str(tmp_path / "one")]
    subprocess.run(one, cwd=tu.REPO, check=True, capture_output=True, env=tu.env())
    srun = ["srun", "-N2", "-n2", "--kill-on-bad-exit=1", sys.executable, *args]
    p = slurm2.run(
        srun + ["--output-prefix", str(tmp_path / "two")], env=_job_env(), cwd=tu.REPO, timeout=300, check=False
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 1/2" in p.stderr
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"one_text_sentence{ext}").read_bytes() == (
            tmp_path / f"two_text_sentence{ext}"
        ).read_bytes()


@pytest.mark.extended  # multi-host signal; the signal canary is tests/test_exit_signal.py
@pytest.mark.timeout(900)
def test_sigterm_to_deepspeed_across_two_hosts_saves_on_every_rank_and_stops(cluster, tmp_path):
    """SIGTERM to `deepspeed --hostfile --launcher pdsh` mid-run with --exit-signal-handler: the runner passes it on
    (pkill on every host) and ends the ssh sessions the ranks write through; every rank still stops at the same
    iteration after saving one committed checkpoint there (a rank's output outliving its reader: common/process.py),
    and no rank is left on either host within 60 s."""
    import signal
    import subprocess
    import time

    data = tu.prepare(tmp_path)
    launch = _launch_dir(tmp_path, cluster)
    ck, log = tmp_path / "ck", tmp_path / "log.jsonl"
    args = tu.train_args(data, "zero2_fp32.json", 400, global_batch=4)
    args += ["--save", str(ck), "--log-json", str(log), "--exit-signal-handler"]
    cmd, env = _pdsh(cluster, launch / "hostfile")
    full = cluster.host_cmd(0, [*cmd, *args])
    out_path = tmp_path / "run.log"
    with open(out_path, "w") as out:
        proc = subprocess.Popen(full, cwd=launch, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_records(proc, log, 3, out_path)
            proc.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            proc.wait(timeout=60)
            while any(_train_pids(cluster, h) for h in (0, 1)) and time.monotonic() - sent < 60:
                time.sleep(0.2)
            left = [_train_pids(cluster, h) for h in (0, 1)]
            gone_s = time.monotonic() - sent
        finally:
            if proc.poll() is None:
                proc.kill()
    print(f"SIGTERM to deepspeed (pdsh, 2 hosts): exit {proc.returncode}, ranks gone after {gone_s:.1f} s")
    assert not any(left), f"ranks left {gone_s:.0f} s after SIGTERM: {left}\n{out_path.read_text()[-3000:]}"
    last = tu.train_records(log)[-1]["iteration"]
    assert last < 400
    tags = committed_tags(ck)
    assert tags and tags[-1][0] == last, (tags, last, out_path.read_text()[-3000:])  # saved where it stopped
    assert (ck / "latest").read_text() == tags[-1][1] and verify_tag(ck, tags[-1][1]) == ([], True)


# ------------------------------------------------------------------------------------------------------------ chaos
CHAOS_ITERS = 80
"""Room for three interruptions at most 5 iterations past their resume points, each of which may run on: SIGTERM
reaches the ranks after a latency (pdsh's kill over ssh; a one-host `deepspeed` runner does not pass it on, and the
ranks' launcher watch polls each second), during which the tiny model trains on: 4-14 iterations measured. The worst
case (seed 130: SIGTERM at +5 three times) needs about 60."""


def _train_pids(cluster: NetnsCluster, host: int, launchers: bool = False) -> list[int]:
    """The training processes of a host: ranks (`train.py --local_rank`), with ``launchers`` also the per-node
    launch.py and the deepspeed runner."""
    import subprocess

    pids = subprocess.run(["ip", "netns", "pids", cluster.namespaces[host]], capture_output=True, text=True)
    out = []
    for p in pids.stdout.split():
        try:
            cmd = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rank = "train.py" in cmd and "--local_rank" in cmd and "deepspeed.launcher" not in cmd
        if rank or (launchers and ("deepspeed" in cmd or "pdsh" in cmd)):
            out.append(int(p))
    return out


@pytest.mark.extended
@pytest.mark.timeout(2400)
def test_chaos_three_interruptions_at_random_steps_lose_nothing(cluster, tmp_path):
    """One run interrupted 3 times at random iterations in random modes (the rank's processes killed, host 1's link
    down, SIGTERM to the `deepspeed` command), the same command rerun after each on the hosts left or given back
    (2 -> 1 -> 2 -> 1 ranks). Every logged loss, the interrupted segments' included, equals an uninterrupted 2-host
    run's within 1e-4 relative (dropout 0); no committed checkpoint is lost and each verifies. Goodput (iterations
    of the run / wall time, restarts included) is printed. SPARSE_BERT_CHAOS_SEED replays a failure."""
    import random
    import signal
    import subprocess
    import time

    seed = int(os.environ.get("SPARSE_BERT_CHAOS_SEED", random.SystemRandom().randrange(10**6)))
    print(f"chaos seed {seed} (SPARSE_BERT_CHAOS_SEED={seed} replays it)")
    rng = random.Random(seed)
    data = tu.prepare(tmp_path, hidden_dropout=0.0, attention_dropout=0.0)
    launch = _launch_dir(tmp_path, cluster)
    ck, log = tmp_path / "ck", tmp_path / "run.jsonl"
    common = tu.train_args(data, "zero2_fp32.json", CHAOS_ITERS, global_batch=4)
    common += ["--distributed-timeout-minutes", str(TIMEOUT_MIN)]
    t0 = time.monotonic()
    straight = deepspeed_across(cluster, launch, [*common, "--log-json", str(tmp_path / "a")])
    straight_s = time.monotonic() - t0
    assert straight.returncode == 0, straight.stdout[-4000:]
    reference = {r["iteration"]: r for r in tu.train_records(tmp_path / "a")}
    args = [*common, "--log-json", str(log), "--save", str(ck), "--load", str(ck), "--save-interval", "3"]
    args += ["--exit-signal-handler"]
    hostfiles = {2: launch / "hostfile", 1: launch / "hostfile.left"}
    hostfiles[1].write_text(f"{cluster.addresses[0]} slots=1\n")

    def command(world: int) -> tuple[list[str], dict[str, str]]:
        cmd, env = _pdsh(cluster, hostfiles[world])
        return cluster.host_cmd(0, [*cmd, *args]), env

    def logged(since: int) -> int:
        """The last iteration the current segment logged (0 before its first): the log file is appended by every
        segment, and a segment that ran past its interruption left higher iterations there than its rerun's target."""
        recs = tu.train_records(log)[since:] if log.is_file() else []
        return recs[-1]["iteration"] if recs else 0

    started, events, seen = time.monotonic(), [], set()
    for segment, world in enumerate([2, 1, 2, 1]):
        out_path = tmp_path / f"segment{segment}.log"
        since = len(tu.train_records(log)) if log.is_file() else 0
        with open(out_path, "w") as out:
            cmd, env = command(world)
            proc = subprocess.Popen(cmd, cwd=launch, env=env, stdout=out, stderr=subprocess.STDOUT)
            try:
                if segment == 3:
                    code = proc.wait(timeout=900)
                    events.append(f"segment {segment} on {world} rank(s): ran to the end")
                    assert code == 0, out_path.read_text()[-4000:]
                    break
                modes = ["kill", "link_down", "sigterm"] if world == 2 else ["kill", "sigterm"]
                mode = rng.choice(modes)
                start_iter = committed_tags(ck)[-1][0] if committed_tags(ck) else 0
                target = start_iter + rng.randint(2, 5)
                assert target < CHAOS_ITERS, f"segment {segment}: no room left for an interruption: {events}"
                deadline = time.monotonic() + 600
                while logged(since) < target:
                    assert proc.poll() is None, out_path.read_text()[-4000:]
                    assert time.monotonic() < deadline, f"segment {segment}: iteration {target} not reached"
                    time.sleep(0.1)
                hit = time.monotonic()
                if mode == "kill":
                    for p in _train_pids(cluster, world - 1):
                        os.kill(p, signal.SIGKILL)
                elif mode == "link_down":
                    _set_link(cluster, 1, "down")
                else:
                    proc.send_signal(signal.SIGTERM)  # the `deepspeed` command (host_cmd execs into it)
                code = proc.wait(timeout=TIMEOUT_MIN * 60 + 120)
                waited = time.monotonic() - hit
            finally:
                if proc.poll() is None:
                    proc.kill()
        # every rank ends by itself within the bound (the deepspeed runner returns at once on SIGTERM while its
        # ranks save; a rank cut off by the link times out): the rerun starts only then, as a scheduler's would
        while any(_train_pids(cluster, h) for h in (0, 1)) and time.monotonic() - hit < TIMEOUT_MIN * 60 + 60:
            time.sleep(0.2)
        ranks_s = time.monotonic() - hit
        left = [_train_pids(cluster, h) for h in (0, 1)]
        if mode == "link_down":
            _set_link(cluster, 1, "up")
        events.append(
            f"segment {segment} on {world} rank(s): {mode} at iteration {target} (from {start_iter}), "
            f"the command exited {code} after {waited:.1f} s, every rank gone after {ranks_s:.1f} s"
        )
        assert waited < TIMEOUT_MIN * 60 + 60, events[-1] + "\n" + out_path.read_text()[-4000:]
        assert not any(left), f"ranks still running: {left}; " + events[-1] + "\n" + out_path.read_text()[-4000:]
        if mode == "sigterm":  # --exit-signal-handler: the ranks saved where they stopped before exiting (their
            # "stopping" line may not reach the command's output: pdsh's ssh sessions end with the signal)
            stopped = logged(since)
            assert committed_tags(ck)[-1][0] == stopped, (committed_tags(ck), stopped, out_path.read_text()[-4000:])
        committed = {t for _, t in committed_tags(ck)}
        assert seen <= committed, f"committed checkpoints lost: {sorted(seen - committed)}"
        seen = committed
    wall = time.monotonic() - started
    print("\n".join(events))
    recs = tu.train_records(log)
    assert recs[-1]["iteration"] == CHAOS_ITERS
    worst = max(
        abs(r["loss"] - reference[r["iteration"]]["loss"]) / abs(reference[r["iteration"]]["loss"]) for r in recs
    )
    for r in recs:
        assert (
            r["lr"] == reference[r["iteration"]]["lr"]
            and r["consumed_samples"] == reference[r["iteration"]]["consumed_samples"]
        ), r
    print(
        f"chaos: {len(recs)} iterations logged for {CHAOS_ITERS} ({len(recs) - CHAOS_ITERS} redone), largest "
        f"relative loss difference {worst:.3g}; goodput {CHAOS_ITERS / wall:.3f} it/s over {wall:.0f} s with 3 "
        f"restarts; the straight 2-host run {CHAOS_ITERS / straight_s:.3f} it/s ({straight_s:.0f} s)"
    )
    assert worst <= 1e-4
    committed = [t for _, t in committed_tags(ck)]
    assert seen <= set(committed) and all(verify_tag(ck, t) == ([], True) for t in committed)
