"""Across hosts: a cluster of test hosts on one machine (tests/netns_cluster.py: network namespaces on a private
bridge, an sshd each, the machine's filesystem as the shared one). Skipped, naming what is missing, without root,
`ip netns`, sshd or pdsh."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import train_utils as tu
from tests.netns_cluster import IFNAME, NetnsCluster, Unavailable, why_unavailable

pytestmark = [pytest.mark.slow, pytest.mark.multirank]


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
        pytest.skip(str(e))
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
    cmd = [str(tu.VENV_BIN / "deepspeed"), "--hostfile", str(launch / "hostfile"), "--launcher", "pdsh"]
    cmd += ["--no_ssh_check", "--master_addr", c.addresses[0], "--master_port", str(tu.free_port())]
    env = tu.env(PDSH_SSH_ARGS_APPEND=" ".join(c.ssh_options))
    return c.run(0, cmd + [str(tu.REPO / "pretrain" / "train.py")] + args, timeout=timeout, cwd=launch, env=env)


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


@pytest.mark.timeout(900)
def test_a_lost_node_costs_one_checkpoint_interval(cluster, tmp_path):
    """Every process of host 1 is killed mid-run: the surviving rank exits non-zero within a bounded time, no
    checkpoint is half-written, and the same command on host 0 alone resumes from the last committed checkpoint
    with one rank (ZeRO-2 state re-partitioned, global batch and sample position kept)."""
    import subprocess
    import time

    data = tu.prepare(tmp_path, hidden_dropout=0.0, attention_dropout=0.0)
    launch = _launch_dir(tmp_path, cluster)
    ck = tmp_path / "ck"
    args = tu.train_args(data, "zero2_fp32.json", 400, global_batch=4)
    args += ["--save", str(ck), "--load", str(ck), "--save-interval", "3", "--distributed-timeout-minutes", "1"]
    cmd = [str(tu.VENV_BIN / "deepspeed"), "--hostfile", str(launch / "hostfile"), "--launcher", "pdsh"]
    cmd += ["--no_ssh_check", "--master_addr", cluster.addresses[0], "--master_port", str(tu.free_port())]
    env = tu.env(PDSH_SSH_ARGS_APPEND=" ".join(cluster.ssh_options))
    full = ["ip", "netns", "exec", cluster.namespaces[0], *cmd, str(tu.REPO / "pretrain" / "train.py"), *args]
    log = open(tmp_path / "lost.log", "w")
    proc = subprocess.Popen(full, cwd=launch, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not (ck / "iter_0000006" / "commit.json").is_file():
            assert proc.poll() is None, (tmp_path / "lost.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no second checkpoint within 300 s"
            time.sleep(0.2)
        killed = time.monotonic()
        cluster.kill_host(1)
        code = proc.wait(timeout=180)
        waited = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "lost.log").read_text()
    assert code != 0, out[-3000:]
    assert waited < 120, f"the surviving rank took {waited:.0f} s to stop"
    tags = sorted(p.name for p in ck.glob("iter_*"))
    committed = [t for t in tags if (ck / t / "commit.json").is_file()]
    assert committed and committed[-1] >= "iter_0000006"
    resumed = cluster.run(
        0,
        [
            str(tu.VENV_BIN / "deepspeed"),
            "--num_gpus",
            "1",
            "--master_port",
            str(tu.free_port()),
            str(tu.REPO / "pretrain" / "train.py"),
            *tu.train_args(data, "zero2_fp32.json", int(committed[-1][5:]) + 2, global_batch=4),
            "--save",
            str(ck),
            "--load",
            str(ck),
            "--override-opt-param-scheduler",
            "--log-json",
            str(tmp_path / "after.jsonl"),
        ],
        timeout=400,
        cwd=launch,
        env=env,
    )
    assert resumed.returncode == 0, resumed.stdout[-4000:]
    assert "was saved by 2 rank(s), this run has 1" in resumed.stdout
    assert "global batch 4 kept (2 accumulation step(s) of 2 on 1 rank(s))" in resumed.stdout
    last = int(committed[-1][5:])
    recs = tu.train_records(tmp_path / "after.jsonl")
    assert [r["iteration"] for r in recs] == [last + 1, last + 2]
    assert recs[0]["consumed_samples"] == (last + 1) * 4


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
