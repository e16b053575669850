"""Slurm, tested against a real one-node cluster (tests/slurm_cluster.py: Debian's munge, slurmctld, slurmd as root):
2 srun tasks train in one world; the sbatch templates of run_scripts/slurm/ run, stop on the time-limit signal with a
committed checkpoint, requeue themselves and resume to the same losses as a straight run; preprocessing under
`srun -n 2` writes the bytes of one process. Plus the GPU index and the TorchWorld as unit tests (no cluster needed)."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data_pipeline import coordination
from pretrain.distributed import cuda_device_index
from tests import train_utils as tu
from tests.cluster_skip import start_failed
from tests.preprocess_utils import preprocess_cmd
from tests.slurm_cluster import SlurmCluster, Unavailable, why_unavailable

REPO = tu.REPO
SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"
TEMPLATES = REPO / "run_scripts" / "slurm"


# ---------------------------------------------------------------------------------------------------------- cluster
@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = why_unavailable()
    if reason:
        pytest.skip(f"no test Slurm cluster: {reason}")
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start(timeout=60)
    except Unavailable as e:
        start_failed("the test Slurm cluster", e)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tu.prepare(tmp_path_factory.mktemp("slurm_data"))


def job_env(**extra: str) -> dict[str, str]:
    return {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


ITERS = 40


def template_args(data: Path) -> list[str]:
    # a custom run through the template (`args` + trainer flags); --save/--load/--log-json come from OUT
    return ["args", *tu.train_args(data, "zero2_fp32.json", ITERS, *tu.DETERMINISTIC, global_batch=4)]


def submit(cluster: SlurmCluster, template: str, args: list[str], out: Path, **env: str) -> str:
    return cluster.sbatch(
        ["-N1", "--ntasks-per-node=2", "-o", str(out), str(TEMPLATES / template), *args], env=job_env(**env), cwd=REPO
    )


def wait_for_log_lines(path: Path, n: int, cluster: SlurmCluster, job: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and len(path.read_text().splitlines()) >= n:
            return
        if cluster.job(job).get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING"):
            break
        time.sleep(0.1)
    raise AssertionError(f"job {job}: fewer than {n} log lines in {path}\n{cluster.job(job)}")


@pytest.fixture(scope="module")
def straight(cluster, data, tmp_path_factory):
    """Template (a), uninterrupted: the reference losses, and the job's output."""
    out = tmp_path_factory.mktemp("straight")
    # through submit.sh: resources from knobs, no GPU option (GPUS unset)
    p = cluster.run(
        ["bash", str(TEMPLATES / "submit.sh"), "pretrain_srun", *template_args(data)],
        cwd=REPO,
        env=job_env(
            OUT=str(out / "run"), NODES="1", TASKS_PER_NODE="2", TIME="10", SBATCH_ARGS=f"-o {out / 'job.out'}"
        ),
    )
    job = re.search(r"Submitted batch job (\d+)", p.stdout).group(1)
    info = cluster.wait_job(job, timeout=240)
    text = (out / "job.out").read_text()
    return {"info": info, "text": text, "losses": [r["loss"] for r in tu.train_records(out / "run" / "log.jsonl")]}


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_srun_two_tasks_train_in_one_world(cluster, data, tmp_path):
    log = tmp_path / "log.jsonl"
    p = cluster.run(
        [
            "srun",
            "-n2",
            "--kill-on-bad-exit=0",
            sys.executable,
            "-m",
            "pretrain.train",
            *tu.train_args(data, "zero1_fp32.json", 2),
            "--log-json",
            str(log),
        ],
        env=job_env(),
        cwd=REPO,
        timeout=280,
        check=False,
    )
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    assert "[pretrain] 2 rank(s), backend gloo" in p.stdout
    recs = tu.train_records(log)
    assert [r["iteration"] for r in recs] == [1, 2] and all(r["loss"] > 0 for r in recs)


@pytest.mark.extended  # Slurm canary stays
@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_sbatch_srun_template_trains(straight):
    assert straight["info"]["JobState"] == "COMPLETED" and straight["info"]["ExitCode"] == "0:0", straight["text"]
    assert straight["info"]["TimeLimit"] == "00:10:00" and straight["info"]["NumTasks"] == "2"  # submit.sh's knobs
    assert "[pretrain] 2 rank(s), backend gloo" in straight["text"]
    assert f"iteration {ITERS}/{ITERS}" in straight["text"] and "[slurm] done, exit code 0" in straight["text"]
    assert len(straight["losses"]) == ITERS


@pytest.mark.extended  # ~30 s; the Slurm canary: test_srun_two_tasks_train_in_one_world
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_time_limit_signal_saves_requeues_and_resumes_exactly(cluster, data, straight, tmp_path):
    run = tmp_path / "run"
    job = submit(cluster, "pretrain_srun.sbatch", template_args(data), tmp_path / "job.out", OUT=str(run))
    wait_for_log_lines(run / "log.jsonl", 3, cluster, job, timeout=240)
    # what `#SBATCH --signal=USR1@120` does before the time limit: SIGUSR1 to the tasks of the job's steps
    cluster.run(["scancel", "--signal=USR1", job])
    info = cluster.wait_job(job, timeout=120, until=lambda j: j.get("Restarts") == "1")
    text = (tmp_path / "job.out").read_text()
    assert "SIGUSR1 received: stopping at iteration" in text, text[-3000:]
    assert "[slurm] the trainer saved and stopped on SIGUSR1: requeueing job" in text
    stopped = int((run / "ckpt" / "latest").read_text().removeprefix("iter_"))
    assert 3 <= stopped < ITERS and (run / "ckpt" / f"iter_{stopped:07d}" / "commit.json").is_file()
    # Slurm holds a requeued job back for the credential lifetime (Reason=BeginTime; cred_expire, 10 s on the test
    # cluster, 120 s by default); starting it earlier by hand fails with "Job credential revoked"
    info = cluster.wait_job(job, timeout=300)
    text = (tmp_path / "job.out").read_text()  # --open-mode=append: both runs
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert f"job {job} (restart 1)" in text and f"resumed from {run}/ckpt/iter_{stopped:07d}" in text
    recs = tu.train_records(run / "log.jsonl")
    assert [r["iteration"] for r in recs] == list(range(1, ITERS + 1))
    assert [r["loss"] for r in recs] == straight["losses"]  # exact


@pytest.mark.multirank
@pytest.mark.extended  # ~80 s (CI's budget): run_scripts/repeat_check.sh runs it
@pytest.mark.timeout(600)
def test_a_peer_that_stops_answering_requeues_the_job_which_resumes(cluster, data, straight, tmp_path):
    """Rank 1's main thread hangs at iteration 4 (SPARSEBERT_FAULT_STALL, once): rank 0's collective times out
    (exit 5, a lost peer), rank 1's watchdog ends it (exit 5), srun returns 5, job.sh requeues the job, and the
    requeued job resumes from the last committed checkpoint to the straight run's losses."""
    run = tmp_path / "run"
    args = [*template_args(data), "--distributed-timeout-minutes", "0.25", "--save-interval", "2"]
    job = submit(
        cluster,
        "pretrain_srun.sbatch",
        args,
        tmp_path / "job.out",
        OUT=str(run),
        SPARSEBERT_FAULT_STALL="1:4",
        SPARSEBERT_FAULT_ONCE_DIR=str(tmp_path / "faults"),
    )
    cluster.wait_job(job, timeout=240, until=lambda j: j.get("Restarts") == "1")
    info = cluster.wait_job(job, timeout=360)
    text = (tmp_path / "job.out").read_text()  # --open-mode=append: both runs
    assert "[slurm] a rank's peers stopped answering (watchdog, exit 5): requeueing job" in text, text[-4000:]
    assert "a collective failed because a peer rank stopped answering or died" in text, text[-4000:]
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert f"job {job} (restart 1)" in text and "resumed from" in text
    last = {r["iteration"]: r["loss"] for r in tu.train_records(run / "log.jsonl")}  # redone iterations: the rerun's
    assert [last[i] for i in range(1, ITERS + 1)] == straight["losses"]


@pytest.mark.extended  # Slurm canary stays
@pytest.mark.multirank
@pytest.mark.timeout(400)
@pytest.mark.skipif(not Path("/usr/bin/mpirun").exists(), reason="mpirun not installed (run_scripts/setup_env.sh)")
def test_deepspeed_template_forwards_the_batch_signal_and_requeues(cluster, data, tmp_path):
    run = tmp_path / "run"
    job = submit(
        cluster,
        "pretrain_deepspeed.sbatch",
        template_args(data),
        tmp_path / "job.out",
        OUT=str(run),
        MPI_ARGS="--allow-run-as-root --oversubscribe --mca btl_tcp_if_include lo",
    )
    wait_for_log_lines(run / "log.jsonl", 3, cluster, job, timeout=300)
    # `#SBATCH --signal=B:USR1@120`: the batch shell only; its trap passes the signal to mpirun, mpirun to the ranks
    cluster.run(["scancel", "--batch", "--signal=USR1", job])
    try:
        cluster.wait_job(job, timeout=120, until=lambda j: j.get("Restarts") == "1")
    finally:
        cluster.run(["scancel", job], check=False)  # the resume is the srun template's test
    text = (tmp_path / "job.out").read_text()
    assert "[slurm] hostfile" in text and "1 node(s) x 2 slot(s)" in text, text[-3000:]
    assert "[pretrain] 2 rank(s), backend gloo" in text and "forwarding it to the ranks" in text
    assert "SIGUSR1 received: stopping at iteration" in text and "requeueing job" in text
    assert (run / "ckpt" / (run / "ckpt" / "latest").read_text() / "commit.json").is_file()


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_preprocess_under_srun_equals_one_process(cluster, bert_uncased_vocab, tmp_path):
    def cmd(name: str) -> list[str]:
        return preprocess_cmd(SAMPLE, tmp_path / name, bert_uncased_vocab, "--workers", "1")

    subprocess.run(cmd("one"), cwd=REPO, check=True, capture_output=True)
    p = cluster.run(
        ["srun", "-n2", "--kill-on-bad-exit=1", *cmd("two")],
        env=job_env(),
        cwd=REPO,
        timeout=200,
        check=False,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 1/2" in p.stderr  # both tasks really worked
    # the template: two tasks again, through sbatch
    job = cluster.sbatch(
        [
            "-n2",
            "-o",
            str(tmp_path / "job.out"),
            str(TEMPLATES / "preprocess.sbatch"),
            *cmd("three")[3:],  # the template runs python -m data_pipeline.preprocess itself
        ],
        env=job_env(),
        cwd=REPO,
    )
    info = cluster.wait_job(job, timeout=200)
    assert info["ExitCode"] == "0:0", (tmp_path / "job.out").read_text()
    for ext in (".bin", ".idx"):
        one = (tmp_path / f"one_text_sentence{ext}").read_bytes()
        assert one == (tmp_path / f"two_text_sentence{ext}").read_bytes()
        assert one == (tmp_path / f"three_text_sentence{ext}").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("two")) == [
        "two_text_sentence.bin",
        "two_text_sentence.idx",
    ]  # no rendezvous left behind
    assert (tmp_path / "reports" / "two.report.json").is_file()


# ---------------------------------------------------------------------------------------------------------- units
# the launch-variable rules (srun's PMI plugins, mpirun's master, the visible GPU, preprocessing's worlds) are
# tested in tests/test_launch_module.py, next to common/launch.py


def test_cuda_device_index_with_gpus_per_task():
    assert [cuda_device_index(r, 8) for r in range(8)] == list(range(8))  # every GPU of the node visible
    assert [cuda_device_index(r, 1) for r in range(8)] == [0] * 8  # --gpus-per-task=1: its own GPU is cuda:0
    assert [cuda_device_index(r, 2) for r in range(4)] == [0, 1, 0, 1]  # --gpus-per-task=2
    with pytest.raises(RuntimeError):
        cuda_device_index(0, 0)


def _torch_rank(path: str, rank: int, fail: bool, q) -> None:
    from datetime import timedelta

    w = coordination.TorchWorld(path, rank, 3, timeout=timedelta(seconds=60))
    got = w.bcast("from 0" if rank == 0 else None)
    if fail:  # a rank that fails outside the collectives: exits without leaving the group
        w.close(ok=False)
        q.put((rank, got, "exited"))
        q.close()
        q.join_thread()  # flushed before the hard exit
        os._exit(1)
    try:
        gathered = w.gather(rank * 10)
    except RuntimeError as e:
        gathered = f"error: {e}"
    w.close()
    q.put((rank, got, gathered))


def _run_ranks(path: str, fail_rank: int | None) -> list:
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_torch_rank, args=(path, r, r == fail_rank, q)) for r in (2, 1, 0)]
    for p in procs:
        p.start()
    res = sorted(q.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    return res


@pytest.mark.timeout(200)
def test_torch_world_bcast_gather_and_cleanup(tmp_path):
    path = str(tmp_path / "out.rendezvous-1.0")
    assert _run_ranks(path, None) == [(0, "from 0", [0, 10, 20]), (1, "from 0", None), (2, "from 0", None)]
    assert not Path(path).exists()  # torch's FileStore removes its file when the last rank leaves


@pytest.mark.timeout(200)
def test_torch_world_failed_rank_stops_the_waiting_ones(tmp_path):
    res = _run_ranks(str(tmp_path / "out.rendezvous-1.0"), fail_rank=2)
    assert res[2] == (2, "from 0", "exited")
    assert isinstance(res[0][2], str) and res[0][2].startswith("error: "), res  # rank 0 does not wait for ever
