"""The torch build setup_env.sh installs, chosen from the GPUs and the driver a faked `nvidia-smi` reports: V100s
(7.0) need PyTorch's CUDA 12.6 build, newer GPUs and CPU machines the default one (CUDA 13), a driver older than 580
the CUDA 12.6 build, and one older than 525.60.13 none (a clear error); a changed choice reinstalls torch. The
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


def _fake_smi(bin_dir: Path, output: str | None, rc: int = 0, driver: str = "580.159.04", caps: bool = True) -> None:
    """An nvidia-smi answering --query-gpu=compute_cap with ``output`` and driver_version with ``driver`` on each of
    its lines (caps=False: a driver older than 510, which does not know the compute_cap field)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if output is None:
        smi.unlink(missing_ok=True)
        return
    drivers = f"{driver}\\n" * output.count("\\n")
    cap_answer = f"printf '{output}'; exit {rc}" if caps else "echo 'Field compute_cap is not a valid field'; exit 2"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$1" in\n'
        f"  --query-gpu=compute_cap) {cap_answer};;\n"
        f"  --query-gpu=driver_version) printf '{drivers}'; exit {rc};;\n"
        f"  *) printf '{output}'; exit {rc};;\n"
        "esac\n"
    )
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


@pytest.mark.parametrize(
    "caps, driver, variant, why",
    [
        ("9.0\\n", "580.65.06", "default", "driver 580.65.06"),  # H100 on a CUDA 13 driver
        ("9.0\\n", "570.124.06", "cu126", "older than 580"),  # H100, driver too old for CUDA 13: the 12.6 build
        ("8.0\\n8.0\\n", "535.183.01", "cu126", "older than 580"),  # the common 535 LTS driver
        ("7.5\\n", "525.60.13", "cu126", "older than 580"),  # exactly the CUDA 12.x minimum
        ("7.0\\n", "580.95.05", "cu126", "Volta"),  # V100 on a new driver: still the 12.6 build (no sm_70 in 13)
        ("7.0\\n", "535.54.03", "cu126", "Volta"),
    ],
)
def test_variant_follows_the_driver(tmp_path, caps, driver, variant, why):
    """NVIDIA's minor-version compatibility table: CUDA 13.x programs need a driver >= 580, CUDA 12.x >= 525.60.13."""
    _fake_smi(tmp_path / "bin", caps, driver=driver)
    r = _variant(tmp_path / "bin", "--explain")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"{variant}: ") and why in r.stdout, r.stdout


@pytest.mark.parametrize(
    "caps, driver, known_caps",
    [("9.0\\n", "525.60.11", True), ("7.0\\n", "470.256.02", False), ("8.0\\n", "450.80.02", False)],
)
def test_a_driver_too_old_for_every_build_is_refused_clearly(tmp_path, caps, driver, known_caps):
    """Below 525.60.13 neither build runs: a clear error naming the driver and both minimums (also when the driver
    is too old to know nvidia-smi's compute_cap field), unless TORCH_VARIANT forces a build."""
    _fake_smi(tmp_path / "bin", caps, driver=driver, caps=known_caps)
    r = _variant(tmp_path / "bin")
    assert r.returncode == 2
    assert f"driver {driver} is too old" in r.stderr and ">= 580" in r.stderr and ">= 525.60.13" in r.stderr
    assert _variant(tmp_path / "bin", TORCH_VARIANT="cu126").stdout.strip() == "cu126"


def test_the_driver_rule_in_python():
    sys.path.insert(0, str(VARIANT.parent))
    try:
        import torch_variant as tv
    finally:
        sys.path.pop(0)
    assert tv.driver_tuple("580.159.04") == (580, 159, 4) and tv.driver_tuple("N/A") is None
    assert tv.driver_runs_cuda("580.65.06", 13) and not tv.driver_runs_cuda("575.51.03", 13)
    assert tv.driver_runs_cuda("525.60.13", 12) and not tv.driver_runs_cuda("525.60.11", 12)
    assert not tv.driver_runs_cuda("garbage", 12) and not tv.driver_runs_cuda("999.0", 99)
    assert tv.choose([(9, 0)], driver=None)[0] == "default"  # driver unknown: decided by the GPUs alone
    assert tv.choose(None, driver=None)[0] == "default"


@pytest.mark.skipif(
    shutil.which("mpirun") is None or shutil.which("pdsh") is None,
    reason="setup_env.sh would apt-get install openmpi/pdsh first (run run_scripts/setup_env.sh)",
)
def test_setup_env_installs_the_chosen_build_and_reinstalls_when_it_changes(tmp_path):
    root = tmp_path / "repo"
    (root / "run_scripts").mkdir(parents=True)
    for f in ("run_scripts/setup_env.sh", "run_scripts/torch_variant.py", "run_scripts/reqs.py", "requirements.txt"):
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
        "-m pip install -q -r .venv/.setup/pins.txt",  # requirements.txt but `# cpu-torch` (triton)
    ]
    assert (root / ".venv" / ".requirements.sha256").read_text().strip().endswith(" cu126")
    assert setup("7.0\n") == []  # nothing changed: nothing installed
    calls = setup("9.0\n")  # the machine's GPUs changed: torch is replaced by the default build
    assert calls[1:] == [
        "-m pip install -q --force-reinstall --no-deps torch==2.13.0",
        "-m pip install -q -r .venv/.setup/pins.txt",  # requirements.txt but `# cpu-torch` (triton)
    ]
    assert " " not in (root / ".venv" / ".requirements.sha256").read_text().strip()
    assert setup(None) == []  # default again on a CPU machine: the same stamp
