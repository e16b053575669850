"""A real Slurm cluster for tests: Debian's munge, slurmctld and slurmd, started as root in a temp dir. One node (this
host), or one node per test host of a ``NetnsCluster`` (tests/netns_cluster.py): a slurmd in each host's network
namespace under its host name, slurmctld on the first host, one munged for all (its socket is a file every host
sees), clients run on the first host.

Everything lives under the given directory: its own munge key and socket (so a system munged, if any, is neither
used nor touched), ``slurm.conf`` with free ports for slurmctld and slurmd, state and spool dirs, pid and log
files. Clients find it through ``SLURM_CONF`` (``cluster.env``); nothing system-wide is read or written.

    with SlurmCluster(tmp_dir) as c:       # raises Unavailable(reason) where it cannot start
        c.run(["srun", "-n2", "hostname"])

Also a script, to poke at a cluster by hand: ``python -m tests.slurm_cluster DIR`` starts one, prints the
``export SLURM_CONF=...`` line and waits for Ctrl-C (then stops it).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from common.launch import free_port

SBIN = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")
DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("srun", "sbatch", "squeue", "sinfo", "scontrol", "scancel")


class Unavailable(RuntimeError):
    """The cluster cannot run here; the message says why (for pytest.skip)."""


def _which(name: str) -> str | None:
    return shutil.which(name) or next((str(Path(d, name)) for d in SBIN if Path(d, name).is_file()), None)


def why_unavailable() -> str | None:
    """Why no cluster can start on this machine (None when it may)."""
    if os.geteuid() != 0:
        return "the test Slurm cluster runs its daemons as root (SlurmUser=root); not root here"
    missing = [n for n in DAEMONS + CLIENTS if _which(n) is None]
    if missing:
        return (
            f"Slurm/munge not installed ({', '.join(missing)} missing): run_scripts/setup_env.sh installs "
            "slurmctld slurmd slurm-client munge"
        )
    return None


def _die_with_parent() -> None:
    """In the daemon, before exec: SIGTERM when the process that started it dies (a test run killed on timeout
    leaves no daemon behind)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _tail(path: Path, n: int = 15) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} not written)"
    return "\n".join(lines[-n:]) or f"({path} empty)"


class SlurmCluster:
    """One partition ``test`` over one node (this host) or the hosts of ``hosts`` (each with all CPUs of the
    machine); daemons in the foreground, as children. ``hosts`` must give every host ``slurm_run_dir(root)`` as a
    private directory (each slurmd writes its pid file there)."""

    def __init__(self, root: Path, partition: str = "test", hosts=None) -> None:
        self.root = Path(root).resolve()
        self.partition = partition
        self.hosts = hosts
        self.nodes = list(hosts.names) if hosts else [socket.gethostname().split(".")[0]]
        self.node = self.nodes[0]
        self.conf = self.root / "slurm.conf"
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = {name: self.root / "log" / f"{name}.log" for name in DAEMONS}
        self.logs.update({f"slurmd-{n}": self.root / "log" / f"slurmd-{n}.log" for n in self.nodes})
        if hosts:
            for i in range(len(self.nodes)):
                if slurm_run_dir(self.root) not in hosts.private_dirs.get(i, []):
                    raise ValueError(f"host {i} needs {slurm_run_dir(self.root)} as a private directory")

    def _on_host(self, host: int, cmd: list[str]) -> list[str]:
        return self.hosts.host_cmd(host, cmd) if self.hosts else cmd

    # ------------------------------------------------------------------ set-up
    @property
    def env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF, minus any Slurm job variables of an enclosing job."""
        e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        e["SLURM_CONF"] = str(self.conf)
        return e

    def _write_files(self) -> None:
        for d in ("munge", "state", "spool", "log", "run"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        for n in self.nodes:
            (self.root / "spool" / n).mkdir(exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        cpus = os.cpu_count() or 1
        try:
            mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
        except (ValueError, OSError):
            mem_mb = 1024
        ctld_port, d_port = free_port(), free_port()
        r = self.root
        if self.hosts:
            ctld = f"{self.node}({self.hosts.addresses[0]})"
            nodes = "\n".join(
                f"NodeName={n} NodeAddr={a} NodeHostname={n} CPUs={cpus} RealMemory={max(mem_mb // 2 - 256, 256)}"
                " State=UNKNOWN"
                for n, a in zip(self.nodes, self.hosts.addresses)
            )
        else:
            ctld = self.node
            nodes = f"NodeName={self.node} CPUs={cpus} RealMemory={max(mem_mb - 512, 256)} State=UNKNOWN"
        self.conf.write_text(f"""# written by tests/slurm_cluster.py: a test cluster of {len(self.nodes)} node(s)
ClusterName=sbtest{ctld_port}
SlurmctldHost={ctld}
SlurmctldPort={ctld_port}
SlurmdPort={d_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={r}/munge/munge.socket,cred_expire=10
SlurmUser=root
SlurmdUser=root
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=60
MinJobAge=600
KillWait=10
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={self.logs["slurmctld"]}
SlurmdLogFile={r}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
{nodes}
PartitionName={self.partition} Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")

    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True, preexec_fn=_die_with_parent
        )
        log.close()

    def _failed(self, what: str) -> Unavailable:
        tails = []
        for name in ("munged", "slurmctld", *(f"slurmd-{n}" for n in self.nodes)):
            p = self.procs.get(name)
            state = "not started" if p is None else ("running" if p.poll() is None else f"exited {p.returncode}")
            tails.append(
                f"--- {name} ({state}) log tail:\n{_tail(self.logs[name])}\n"
                f"--- {name} stdout:\n{_tail(self.root / 'log' / f'{name}.out', 5)}"
            )
        return Unavailable(f"{what}\n" + "\n".join(tails))

    def start(self, timeout: float = 60) -> "SlurmCluster":
        why = why_unavailable()
        if why:
            raise Unavailable(why)
        self._write_files()
        r = self.root
        try:
            self._spawn(
                "munged",
                [
                    _which("munged"),
                    "--foreground",
                    "--force",
                    f"--socket={r}/munge/munge.socket",
                    f"--key-file={r}/munge/munge.key",
                    f"--pid-file={r}/munge/munged.pid",
                    f"--seed-file={r}/munge/munged.seed",
                    f"--log-file={self.logs['munged']}",
                ],
            )
            self._wait(lambda: (r / "munge" / "munge.socket").exists(), 15, "munged did not create its socket")
            self._spawn("slurmctld", self._on_host(0, [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)]))
            self._wait(lambda: self._ok(["scontrol", "ping"], "UP"), 30, "slurmctld did not answer `scontrol ping`")
            for i, node in enumerate(self.nodes):
                slurmd = [_which("slurmd"), "-D", "-f", str(self.conf), "-N", node]
                self._spawn(f"slurmd-{node}", self._on_host(i, slurmd))
            self._wait(self._node_idle, timeout, f"nodes {self.nodes} not idle in `sinfo` within {timeout:.0f} s")
            n = len(self.nodes)
            srun = ["srun", f"-N{n}", f"-n{2 if n == 1 else n}", "--time=1", "hostname"]
            p = self.run(srun, timeout=60, check=False)
            if p.returncode != 0 or len(p.stdout.split()) != (2 if n == 1 else n):
                raise self._failed(f"`{' '.join(srun)}` failed (exit {p.returncode}): {p.stdout}{p.stderr}")
        except BaseException:
            self.stop()
            raise
        return self

    def _ok(self, cmd: list[str], want: str) -> bool:
        try:
            p = self.run(cmd, timeout=10, check=False)
        except subprocess.TimeoutExpired:
            return False
        return p.returncode == 0 and want in p.stdout

    def _node_idle(self) -> bool:
        p = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10, check=False)
        return p.returncode == 0 and all(f"{n} idle" in p.stdout for n in self.nodes)

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise self._failed(f"{', '.join(dead)} exited during start-up")
            if ready():
                return
            time.sleep(0.5)
        raise self._failed(what)

    def stop(self) -> None:
        """Stop the daemons this object started (slurmd, slurmctld, then munged); kill what does not go."""
        for name in (*(f"slurmd-{n}" for n in self.nodes), "slurmctld", "munged"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ using it
    def run(
        self, cmd: list[str], timeout: float = 60, check: bool = True, env: dict | None = None, **kw
    ) -> subprocess.CompletedProcess:
        e = self.env
        e.update(env or {})
        p = subprocess.run(self._on_host(0, cmd), env=e, capture_output=True, text=True, timeout=timeout, **kw)
        if check and p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
        return p

    def sbatch(self, args: list[str], env: dict | None = None, cwd: Path | None = None) -> str:
        """Submit; returns the job id."""
        p = self.run(["sbatch", "--parsable", *args], env=env, cwd=cwd)
        return p.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` fields (JobState, ExitCode, Restarts, StdOut, ...); {} once the job is forgotten."""
        p = self.run(["scontrol", "show", "job", "-o", job_id], check=False)
        if p.returncode != 0:
            return {}
        return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", p.stdout))

    def wait_job(self, job_id: str, timeout: float, until=None) -> dict[str, str]:
        """Poll until ``until(fields)`` (default: the job has ended); raises TimeoutError with the state."""
        done = until or (
            lambda j: (
                j.get("JobState")
                in (
                    "COMPLETED",
                    "FAILED",
                    "CANCELLED",
                    "TIMEOUT",
                    "NODE_FAIL",
                    "OUT_OF_MEMORY",
                    "BOOT_FAIL",
                    "DEADLINE",
                )
            )
        )
        deadline = time.time() + timeout
        j: dict[str, str] = {}
        while time.time() < deadline:
            j = self.job(job_id)
            if j and done(j):
                return j
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} not done in {timeout:.0f} s: {j}")

    def daemon_logs(self) -> str:
        names = ("slurmctld", *(f"slurmd-{n}" for n in self.nodes))
        return "\n".join(f"--- {n}:\n{_tail(self.logs[n], 30)}" for n in names)


def slurm_run_dir(root: Path) -> Path:
    """Where the daemons write their pid files: private to each test host (one slurmd per host, one pid file name)."""
    return Path(root).resolve() / "run"


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "/tmp/slurm-test-cluster")
    with SlurmCluster(root) as c:
        print(f"export SLURM_CONF={c.conf}   # Ctrl-C stops the cluster", flush=True)
        try:
            while all(p.poll() is None for p in c.procs.values()):
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
