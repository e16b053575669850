"""Offline set-up (issue 32 item 2): run_scripts/make_wheelhouse.sh makes a wheelhouse for this machine's Python,
then `TORCH=system WHEELHOUSE=... run_scripts/setup_env.sh` builds a fresh .venv from it with networking refused,
on an "image" python that has only torch, and deepspeed, transformers and our model import there.

Needs the network for the wheelhouse (pip's cache makes a second run quick): skipped with the reason without it.
Networking is refused with `unshare -n` (a new network namespace: no interface but a down loopback) where the
kernel lets us; otherwise with PIP_NO_INDEX=1 and a dead proxy (the test says which).
"""

import importlib.metadata as md
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.extended]  # ~10 min: the extended check


def _online() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def _offline_prefix() -> tuple[list[str], dict[str, str], str]:
    """(command prefix, extra env, how) that refuse networking."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n"], {}, "unshare -n (no network namespace interfaces)"
    env = {"PIP_NO_INDEX": "1", "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    return [], env, "PIP_NO_INDEX=1 and a dead proxy (unshare -n not permitted here)"


def _closure(name: str) -> list[md.Distribution]:
    """`name` and every distribution it needs (markers evaluated here, extras not followed)."""
    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        n = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if n in seen:
            continue
        try:
            dist = md.distribution(n)
        except md.PackageNotFoundError:
            continue
        seen[n] = dist
        for spec in dist.requires or []:
            r = Requirement(spec)
            if r.marker is None or r.marker.evaluate({"extra": ""}):
                todo.append(r.name)
    return list(seen.values())


def _image_with_only_torch(where: Path) -> Path:
    """A venv of this machine's base python whose site-packages holds (as symlinks) torch and its dependencies
    from the running venv: an image with PyTorch preinstalled and nothing of ours."""
    subprocess.run([sys._base_executable, "-m", "venv", str(where)], check=True)
    site = Path(
        subprocess.run(
            [str(where / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    for dist in _closure("torch"):
        base = Path(dist.locate_file(""))
        tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = base / top
            if src.exists() and not (site / top).exists() and top != "__pycache__":
                (site / top).symlink_to(src)
    return where / "bin/python"


@pytest.mark.skipif(not _online(), reason="needs the network to build the wheelhouse (pypi.org:443 unreachable)")
def test_wheelhouse_then_offline_setup_on_an_image_with_torch(tmp_path):
    wh = tmp_path / "wheelhouse"
    r = subprocess.run(
        ["bash", str(ROOT / "run_scripts/make_wheelhouse.sh"), str(wh)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    names = [w.name.split("-")[0].lower() for w in wh.glob("*.whl")]
    assert len(names) == len(set(names)), "a package twice"  # each package once
    assert "deepspeed" in names and "transformers" in names
    assert not any(n == "torch" or n.startswith(("nvidia", "triton")) for n in names)
    assert re.search(r"\d+ wheels, \S+ \(\d+ bytes\)", r.stdout)

    # a fresh checkout (tracked files) and an image python with only torch
    repo = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    for f in filter(None, files):
        dst = repo / f.decode()
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f.decode(), dst)
    image_py = _image_with_only_torch(tmp_path / "image")

    prefix, net_env, how = _offline_prefix()
    print(f"networking refused with {how}")
    env = {
        **os.environ,
        **net_env,
        "TORCH": "system",  # this image's torch is a CPU build: auto would pick pinned
        "PYTHON": str(image_py),
        "WHEELHOUSE": str(wh),
        # the DeepSpeed CPU op is already built there (setup_env.sh would spend minutes on it otherwise)
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv/torch_extensions")),
    }
    s = subprocess.run(
        [*prefix, "bash", "run_scripts/setup_env.sh"], cwd=repo, capture_output=True, text=True, env=env, timeout=1200
    )
    out = s.stdout + s.stderr
    assert s.returncode == 0, out
    assert re.search(r"kept +torch \d", out) and re.search(r"install +deepspeed==", out), out
    assert "apt-get install" not in out
    check = subprocess.run(
        [
            *prefix,
            str(repo / ".venv/bin/python"),
            "-c",
            "import deepspeed, torch, transformers, model.bert; print(torch.__file__); print(deepspeed.__file__)",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, **net_env, "PYTHONPATH": str(repo)},
        timeout=600,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    torch_file, ds_file = check.stdout.strip().splitlines()[-2:]
    assert str(tmp_path / "image") in torch_file  # the image's torch, not a copy
    assert str(repo / ".venv") in ds_file  # deepspeed from the wheelhouse, into the venv
    # a second run changes nothing and says nothing about installs
    again = subprocess.run(
        [*prefix, "bash", "run_scripts/setup_env.sh"], cwd=repo, capture_output=True, text=True, env=env, timeout=600
    )
    assert again.returncode == 0 and "pip install" not in again.stdout, again.stdout + again.stderr
