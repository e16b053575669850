"""A cluster of test hosts on one machine: K Linux network namespaces on a private bridge, each with its own address
and its own sshd (Debian's openssh-server, keys made here), so launchers that reach hosts over ssh (the deepspeed
launcher's pdsh path) run for real across them. The machine's filesystem stands in for the cluster's shared one.

Each host also has its own host name (a UTS namespace per command, named like its network namespace) that every
host resolves through its own ``/etc/hosts`` (``/etc/netns/NS/hosts``, mounted over ``/etc/hosts`` in the
host's mount namespace), as on a real cluster where Slurm node names, MASTER_ADDR and gloo's default interface come from
host names. ``private_dirs`` gives a host node-local directories: its commands (and its sshd's sessions) see an
empty directory of their own at those paths, every other host the shared one.

Traffic stays between the namespaces: the bridge has no address in the root namespace, there is no default route,
no forwarding and no NAT. Every name carries a random run id (parallel runs never collide) and ``close()`` removes
namespaces, links, daemons, ``/etc/netns`` entries and keys, also after a failure.

    with NetnsCluster(tmp_dir, hosts=2) as c:      # raises Unavailable(reason) where it cannot start
        c.run(0, ["hostname", "-I"])                # a command inside host 0's namespace
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

IFNAME = "sbeth0"
"""The cluster interface's name inside every host (what GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME name)."""


class Unavailable(RuntimeError):
    """The cluster cannot start here; the message says why (for pytest.skip)."""


def why_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root; not root here"
    for tool, package in (("ip", "iproute2"), ("sshd", "openssh-server"), ("ssh-keygen", "openssh-client")):
        if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
            return f"{tool} not installed (run_scripts/setup_env.sh installs {package})"
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    if res.returncode != 0:
        return f"`ip netns` does not work here: {res.stderr.strip()}"
    return None


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    if check and res.returncode != 0:
        raise Unavailable(f"`{' '.join(cmd)}` failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


class NetnsCluster:
    def __init__(self, root: Path, hosts: int = 2, private_dirs: dict[int, list[Path]] | None = None) -> None:
        reason = why_unavailable()
        if reason:
            raise Unavailable(reason)
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.id = secrets.token_hex(3)
        subnet = 16 + int(self.id[:2], 16) % 200
        self.addresses = [f"10.77.{subnet}.{i + 2}" for i in range(hosts)]
        self.namespaces = [f"sb{self.id}h{i}" for i in range(hosts)]
        self.names = list(self.namespaces)
        """Each host's name (its UTS host name; every host resolves all of them)."""
        self.private_dirs = {h: [Path(d) for d in ds] for h, ds in (private_dirs or {}).items()}
        self.bridge = f"sb{self.id}br"
        self.key = self.root / "id_ed25519"
        self._sshd_pids: list[Path] = []
        self._links: list[str] = []
        try:
            self._network()
            self._sshd()
        except BaseException:
            self.close()
            raise

    # -- set-up ------------------------------------------------------------------------------------------------------
    def _network(self) -> None:
        hosts = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for a, n in zip(self.addresses, self.names))
        for ns in self.namespaces:
            Path("/etc/netns", ns).mkdir(parents=True, exist_ok=True)
            Path("/etc/netns", ns, "hosts").write_text(hosts)
        _sh("ip", "link", "add", self.bridge, "type", "bridge")
        self._links.append(self.bridge)
        _sh("ip", "link", "set", self.bridge, "up")
        for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
            _sh("ip", "netns", "add", ns)
            outer, inner = f"sb{self.id}v{i}", f"sb{self.id}p{i}"
            _sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            self._links.append(outer)
            _sh("ip", "link", "set", inner, "netns", ns)
            _sh("ip", "link", "set", outer, "master", self.bridge, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "name", IFNAME)
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{addr}/24", "dev", IFNAME)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", IFNAME, "up")
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")

    def _sshd(self) -> None:
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key))
        host_key = self.root / "host_ed25519"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
        shutil.copyfile(f"{self.key}.pub", self.root / "authorized_keys")
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
        sshd = shutil.which("sshd") or "/usr/sbin/sshd"
        for i, (ns, addr) in enumerate(zip(self.namespaces, self.addresses)):
            pid = self.root / f"sshd{i}.pid"
            conf = self.root / f"sshd{i}.conf"
            conf.write_text(
                f"ListenAddress {addr}\nPort 22\nHostKey {host_key}\nPidFile {pid}\n"
                f"AuthorizedKeysFile {self.root / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
                "PrintMotd no\nMaxStartups 100\nMaxSessions 100\n"
            )
            _sh(*self.host_cmd(i, [sshd, "-f", str(conf), "-E", str(self.root / f"sshd{i}.log")]))
            self._sshd_pids.append(pid)
        deadline = time.monotonic() + 30
        for i in range(len(self.namespaces)):
            while self.ssh(0, i, ["true"]).returncode != 0:
                if time.monotonic() > deadline:
                    raise Unavailable(f"sshd of host {i} did not answer: {(self.root / f'sshd{i}.log').read_text()}")
                time.sleep(0.5)

    # -- use ---------------------------------------------------------------------------------------------------------
    def host_cmd(self, host: int, cmd: list[str]) -> list[str]:
        """``cmd`` as host ``host`` runs it: in its network namespace, under its host name, with its ``/etc/hosts``
        and private dirs (in a mount namespace of its own). Not ``ip netns exec``: that remounts ``/sys``, which
        hides the cgroup mounts slurmd needs."""
        binds = f"mount --bind '/etc/netns/{self.namespaces[host]}/hosts' /etc/hosts && "
        for j, d in enumerate(self.private_dirs.get(host, [])):
            local = self.root / f"local{host}_{j}"
            local.mkdir(parents=True, exist_ok=True)
            d.mkdir(parents=True, exist_ok=True)
            binds += f"mount --bind '{local}' '{d}' && "
        script = f'hostname "$0" && {binds}exec "$@"'
        netns = f"--net=/run/netns/{self.namespaces[host]}"
        return ["nsenter", netns, "unshare", "--mount", "--uts", "sh", "-c", script, self.names[host], *cmd]

    @property
    def ssh_options(self) -> list[str]:
        return ["-i", str(self.key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"] + [
            "-o",
            "LogLevel=ERROR",
            "-o",
            "BatchMode=yes",
        ]

    def ssh(self, src: int, dst: int, cmd: list[str]) -> subprocess.CompletedProcess:
        """``cmd`` on host ``dst``, over ssh from host ``src``."""
        return self.run(src, ["ssh", *self.ssh_options, self.addresses[dst], *cmd], timeout=30)

    def run(self, host: int, cmd: list[str], timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
        """``cmd`` inside host ``host``'s namespace (stdout and stderr merged)."""
        return subprocess.run(
            self.host_cmd(host, cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            **kwargs,
        )

    def kill_host(self, host: int) -> None:
        """Every process of a host dies at once (a lost node): SIGKILL to all pids in its namespace."""
        pids = _sh("ip", "netns", "pids", self.namespaces[host], check=False).stdout.split()
        for p in pids:
            try:
                os.kill(int(p), 9)
            except ProcessLookupError:
                pass

    # -- tear-down ---------------------------------------------------------------------------------------------------
    def close(self) -> None:
        for ns in self.namespaces:
            for p in _sh("ip", "netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(p), 9)
                except ProcessLookupError:
                    pass
            _sh("ip", "netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns", ns), ignore_errors=True)
        for link in reversed(self._links):
            _sh("ip", "link", "del", link, check=False)
        for f in self.root.glob("*ed25519*"):
            f.unlink(missing_ok=True)

    def __enter__(self) -> "NetnsCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
