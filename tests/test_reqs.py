"""run_scripts/reqs.py: requirements.txt's pins and floors, and what TORCH=system keeps or installs (issue 32)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("reqs", ROOT / "run_scripts" / "reqs.py")
reqs = importlib.util.module_from_spec(_spec)
sys.modules["reqs"] = reqs  # dataclasses look their module up
_spec.loader.exec_module(reqs)

DEVICE_FREEZE = ROOT / "run_scripts" / "images" / "torch2.11-cuda13-py3.12.freeze.txt"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "requirements.txt"
    p.write_text(text)
    return p


def test_version_order():
    order = ["1.0.dev1", "1.0a1", "1.0b2", "1.0rc1", "1.0", "1.0.post1", "1.0.1", "1.2", "1.10", "2.11.0", "2.13.0"]
    keys = [reqs.version_key(v) for v in order]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert reqs.version_key("2.11.0+cu130") == reqs.version_key("2.11.0") == reqs.version_key("2.11")


def test_parse_pins_floors_ranges_and_dev(tmp_path):
    rs = reqs.parse(
        _write(
            tmp_path,
            "# comment\ntorch==2.13.0  # floor: 2.11.0\nnumpy>=1.26,<3\ndeepspeed==0.19.8\nruff==0.17.6  # dev\n",
        )
    )
    by = {r.key: r for r in rs}
    assert (by["torch"].pin, by["torch"].floor, by["torch"].cap) == ("2.13.0", "2.11.0", None)
    assert (by["numpy"].pin, by["numpy"].floor, by["numpy"].cap) == (None, "1.26", "3")
    assert by["deepspeed"].floor == "0.19.8" and not by["deepspeed"].dev and by["ruff"].dev
    assert by["torch"].accepts("2.11.0+cu130") and by["torch"].accepts("2.15.0") and not by["torch"].accepts("2.10.1")
    assert by["numpy"].accepts("2.5.2") and not by["numpy"].accepts("3.0.0") and not by["numpy"].accepts("1.25.2")
    assert by["numpy"].install_line() == "numpy>=1.26,<3" and by["torch"].install_line() == "torch==2.13.0"


@pytest.mark.parametrize(
    "text, message",
    [
        ("torch=2.1\n", "cannot read requirement"),
        ("torch>=2.11  # floor: 2.10\n", "needs a `==` pin"),
        ("torch==2.11  # floor: 2.13\n", "above the pin"),
        ("torch<=2.11\n", "not supported"),
    ],
)
def test_bad_lines_are_refused_naming_the_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message) as e:
        reqs.parse(_write(tmp_path, text))
    assert "requirements.txt:1" in str(e.value)


def test_our_requirements_floor_torch_at_2_11():
    by = {r.key: r for r in reqs.parse()}
    assert by["torch"].floor == "2.11.0" and by["transformers"].floor == "5.17.0" and by["tokenizers"].floor == "0.23.2"
    assert {r.key for r in reqs.parse() if r.dev} == {"ruff", "pytest", "pytest-timeout", "pytest-xdist", "triton",
                                                      "datasets"}  # fmt: skip
    assert {r.key for r in reqs.parse() if r.cpu_torch} == {"triton"}


def test_cpu_torch_requirements_only_beside_a_cpu_torch_that_has_none(tmp_path):
    """triton (`# cpu-torch`): never planned, pinned or floored beside the image's torch (a CUDA torch brings its
    own), installed beside a CPU torch that has none, kept where present."""
    rs = reqs.parse()
    assert "triton" not in {r.key for r, _ in reqs.plan(rs, reqs.read_freeze(DEVICE_FREEZE)).kept}
    assert "triton" not in {r.key for r, _ in reqs.plan(rs, {"torch": "2.13.0"}).install}
    assert [r.key for r in reqs.cpu_torch_extras(rs, {"torch": "2.13.0"}, cpu_build=True)] == ["triton"]
    assert reqs.cpu_torch_extras(rs, {"torch": "2.13.0"}, cpu_build=False) == []
    assert reqs.cpu_torch_extras(rs, {"torch": "2.13.0", "triton": "3.2.0"}, cpu_build=True) == []
    req = tmp_path / "requirements.txt"
    req.write_text("torch==2.13.0  # floor: 2.11.0\npytorch-triton-absent==1.2  # dev, cpu-torch\n")
    run = [sys.executable, str(ROOT / "run_scripts/reqs.py"), "--requirements", str(req)]
    out = {cmd: subprocess.run(run + cmd.split(), capture_output=True, text=True) for cmd in ("pins", "floors",
                                                                                           "cpu-torch")}  # fmt: skip
    assert all(r.returncode == 0 for r in out.values()), {k: r.stderr for k, r in out.items()}
    assert "triton" not in out["pins"].stdout + out["floors"].stdout
    want = "pytorch-triton-absent==1.2\n" if reqs.torch_is_cpu_build() else ""
    assert out["cpu-torch"].stdout == want
    req.write_text("numpy==2.0  # cpu-torch\n")
    with pytest.raises(ValueError, match=r"requirements.txt:1: numpy: `# cpu-torch` is for torch's own family"):
        reqs.parse(req)


def test_plan_on_the_device_image_keeps_its_packages_and_installs_the_rest():
    """The GPU test image (run_scripts/images/...freeze.txt): its torch 2.11, transformers 5.17, tokenizers 0.23.2
    and pyarrow 25 are in range and kept, pinned by constraints; only what it lacks is installed."""
    p = reqs.plan(reqs.parse(), reqs.read_freeze(DEVICE_FREEZE))
    kept = {r.key: v for r, v in p.kept}
    assert kept["torch"] == "2.11.0" and kept["transformers"] == "5.17.0" and kept["tokenizers"] == "0.23.2"
    assert {r.key for r, _ in p.install} == {"deepspeed", "blingfire", "mwparserfromhell", "torch-optimi",
                                              "megatron-core", "ruff", "datasets", "tomli-w"}  # fmt: skip
    assert kept["scikit-learn"] == "1.9.1" and kept["scipy"] == "1.18.1"  # the image's, above our floors
    assert "torch==2.11.0" in p.constraints and "transformers==5.17.0" in p.constraints


def test_plan_installs_too_old_and_refuses_torch_out_of_range():
    rs = reqs.parse()
    p = reqs.plan(rs, {"torch": "2.13.0", "transformers": "5.16.0", "numpy": None})
    assert ("transformers", "5.16.0") in [(r.key, v) for r, v in p.install]  # too old: the pin goes in
    assert "numpy" in {r.key for r, _ in p.kept}  # present at a version not known: kept
    with pytest.raises(ValueError, match=r"torch 2\.10\.0 is outside the supported range >=2\.11\.0"):
        reqs.plan(rs, {"torch": "2.10.0"})
    with pytest.raises(ValueError, match="has no torch"):
        reqs.plan(rs, {})


def test_offline_plan_skips_dev_requirements_missing_from_the_wheelhouse(tmp_path, capsys):
    (tmp_path / "deepspeed-0.19.8-py3-none-any.whl").write_bytes(b"")
    p = reqs.plan(reqs.parse(), reqs.read_freeze(DEVICE_FREEZE))
    p = reqs.drop_dev_not_in(p, tmp_path)
    assert "ruff" not in {r.key for r, _ in p.install} and "deepspeed" in {r.key for r, _ in p.install}
    assert "skipped   ruff==" in capsys.readouterr().out


def test_cli_plan_writes_install_and_constraints(tmp_path):
    out = tmp_path / "plan"
    r = subprocess.run(
        [sys.executable, str(ROOT / "run_scripts/reqs.py"), "plan", "--present", str(DEVICE_FREEZE), "--out-dir", out],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert "kept      transformers 5.17.0" in r.stdout and "install   deepspeed==0.19.8: missing" in r.stdout
    assert (out / "install.txt").read_text().splitlines()[0] == "deepspeed==0.19.8"
    cons = (out / "constraints.txt").read_text().splitlines()
    assert "torch==2.11.0" in cons and "packaging==26.3" in cons  # the node's other packages pin the resolution
    assert not any(c.startswith(("nvidia-", "triton")) for c in cons)  # torch's CUDA libraries never
    bad = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run_scripts/reqs.py"),
            "plan",
            "--present",
            str(tmp_path / "nope"),
            "--out-dir",
            out,
        ],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "nope" in bad.stderr
