"""The torch build setup_env.sh installs, chosen from the GPUs a faked `nvidia-smi` reports: V100s (7.0) need
PyTorch's CUDA 12.6 build, newer GPUs and CPU machines the default one; a changed choice reinstalls torch. The
shell logic runs for real in a scratch copy of the set-up files with a stand-in `.venv/bin/python` that records
what pip would be asked to do (nothing is installed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VARIANT = REPO / "run_scripts" / "torch_variant.py"


def _fake_smi(bin_dir: Path, output: str | None, rc: int = 0) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if output is None:
        smi.unlink(missing_ok=True)
        return
    smi.write_text(f"#!/bin/sh\nprintf '{output}'\nexit {rc}\n")
    smi.chmod(0o755)


def _env(bin_dir: Path, **extra: str) -> dict[str, str]:
    # only the fake bin dir and the system dirs (a real nvidia-smi elsewhere on PATH must not leak in)
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_VARIANT", "TORCH_INDEX_URL")}
    env["PATH"] = f"{bin_dir}{os.pathsep}/usr/local/bin{os.pathsep}/usr/bin{os.pathsep}/bin"
    env.update(extra)
    return env


def _variant(bin_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(VARIANT), *args], env=_env(bin_dir, **env), capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "smi, rc, variant",
    [
        (None, 0, "default"),  # no nvidia-smi: a CPU machine
        ("", 0, "default"),  # nvidia-smi without GPUs
        ("x", 9, "default"),  # nvidia-smi failing (no driver)
        ("9.0\\n", 0, "default"),  # H100
        ("8.0\\n8.0\\n", 0, "default"),  # 2 x A100
        ("7.5\\n", 0, "default"),  # T4
        ("7.0\\n7.0\\n", 0, "cu126"),  # V100s
        ("8.0\\n7.0\\n", 0, "cu126"),  # mixed: the oldest decides
    ],
)
def test_variant_follows_the_gpus(tmp_path, smi, rc, variant):
    _fake_smi(tmp_path / "bin", smi, rc)
    r = _variant(tmp_path / "bin")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == variant
    args = _variant(tmp_path / "bin", "--pip-args").stdout.split()
    if variant == "cu126":
        assert args == ["torch==2.13.0", "--index-url", "https://download.pytorch.org/whl/cu126"]
        assert "7.0" in _variant(tmp_path / "bin", "--explain").stdout
    else:
        assert args == []


def test_overrides_and_bad_values(tmp_path):
    _fake_smi(tmp_path / "bin", "9.0\\n")
    assert _variant(tmp_path / "bin", TORCH_VARIANT="cu126").stdout.strip() == "cu126"
    r = _variant(tmp_path / "bin", "--pip-args", TORCH_VARIANT="cu126", TORCH_INDEX_URL="https://mirror/whl/cu126")
    assert r.stdout.split() == ["torch==2.13.0", "--index-url", "https://mirror/whl/cu126"]
    r = _variant(tmp_path / "bin", TORCH_VARIANT="cu999")
    assert r.returncode == 2 and "TORCH_VARIANT='cu999'" in r.stderr


@pytest.mark.skipif(
    shutil.which("mpirun") is None or shutil.which("pdsh") is None,
    reason="setup_env.sh would apt-get install openmpi/pdsh first (run run_scripts/setup_env.sh)",
)
def test_setup_env_installs_the_chosen_build_and_reinstalls_when_it_changes(tmp_path):
    root = tmp_path / "repo"
    (root / "run_scripts").mkdir(parents=True)
    for f in ("run_scripts/setup_env.sh", "run_scripts/torch_variant.py", "requirements.txt"):
        shutil.copy(REPO / f, root / f)
    log = tmp_path / "pip.log"
    venv_py = root / ".venv" / "bin" / "python"
    venv_py.parent.mkdir(parents=True)
    venv_py.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')  # records pip calls, installs nothing
    venv_py.chmod(0o755)
    ext = tmp_path / "ext"
    ext.mkdir()
    (ext / ".shm_op_built").write_text("")
    bin_dir = tmp_path / "bin"

    def setup(smi: str | None) -> list[str]:
        log.write_text("")
        _fake_smi(bin_dir, smi)
        env = _env(bin_dir, PYTHON=sys.executable, TORCH_EXTENSIONS_DIR=str(ext))
        r = subprocess.run(
            ["bash", str(root / "run_scripts" / "setup_env.sh")], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return [line for line in log.read_text().splitlines() if line.startswith("-m pip install")]

    calls = setup("7.0\n")  # V100: the legacy build first, then the rest
    assert calls[1:] == [
        "-m pip install -q torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126",
        "-m pip install -q -r requirements.txt",
    ]
    assert (root / ".venv" / ".requirements.sha256").read_text().strip().endswith(" cu126")
    assert setup("7.0\n") == []  # nothing changed: nothing installed
    calls = setup("9.0\n")  # the machine's GPUs changed: torch is replaced by the default build
    assert calls[1:] == [
        "-m pip install -q --force-reinstall --no-deps torch==2.13.0",
        "-m pip install -q -r requirements.txt",
    ]
    assert " " not in (root / ".venv" / ".requirements.sha256").read_text().strip()
    assert setup(None) == []  # default again on a CPU machine: the same stamp
