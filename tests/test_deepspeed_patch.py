"""pretrain/deepspeed_patch.py and docs/upstream/deepspeed-zero-norm-syncs.patch: DeepSpeed's ZeRO-1/2 gradient norm
and clipping with the same results bit for bit and no host sync (benchmarks/support/host_syncs.py counts what a GPU
would)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.support.host_syncs import HostSyncCounter
from pretrain import deepspeed_patch
from tests import train_utils as tu

PATCH = tu.REPO / "docs" / "upstream" / "deepspeed-zero-norm-syncs.patch"
#: what the H200's sync debug mode found in DeepSpeed's step, runtime/utils.py:233, 887, 888 x2 (docs/performance.md)
H200_SITES = {
    "(deepspeed) deepspeed/runtime/utils.py:is_invalid_grad_norm <- stage_1_and_2.py:unscale_and_clip_grads "
    "(_local_scalar_dense)": 2,
    "(deepspeed) deepspeed/runtime/utils.py:mask_nan_or_inf_with_val_inplace <- stage_1_and_2.py:get_grad_norm_direct "
    "(host-to-device copy)": 2,
    "(deepspeed) deepspeed/runtime/utils.py:mask_nan_or_inf_with_val_inplace <- stage_1_and_2.py:get_grad_norm_direct "
    "(masked_fill_ with a device value)": 2,
}
NORMS = {"finite": 0.5, "clipped": 30.0, "inf": float("inf"), "nan": float("nan"), "sentinel": -1.0}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)  # bitwise comparison, NaN included


@pytest.mark.parametrize("norm", list(NORMS.values()), ids=list(NORMS))
def test_the_norm_mask_equals_deepspeeds_and_makes_no_sync(norm):
    original = deepspeed_patch.originals()["mask_nan_or_inf_with_val_inplace"]
    ours, theirs = torch.tensor(norm), torch.tensor(norm)
    with HostSyncCounter() as c_ours:
        deepspeed_patch.mask_nan_or_inf_with_val_inplace(ours, device="cpu")
    with HostSyncCounter() as c_theirs:
        original(theirs, device="cpu")
    assert torch.equal(_bits(ours), _bits(theirs)), (ours, theirs)
    assert sum(c_ours.sites.values()) == 0, c_ours.sites
    assert sum(c_theirs.sites.values()) == 2, c_theirs.sites  # the copy of -1.0 and its read in masked_fill_


@pytest.mark.parametrize("loss_scale", [1.0, 1024.0])
@pytest.mark.parametrize("clip_grad", [0.0, 1.0])
@pytest.mark.parametrize("norm", list(NORMS.values()), ids=list(NORMS))
def test_clipping_equals_deepspeeds_and_makes_no_sync(norm, clip_grad, loss_scale):
    original = deepspeed_patch.originals()["unscale_and_clip_grads"]
    optimizer = SimpleNamespace(clip_grad=clip_grad, loss_scale=loss_scale, device=torch.device("cpu"))
    grads = [torch.randn(7, generator=torch.Generator().manual_seed(0)) * 40.0, torch.randn(3)]
    ours, theirs = [[g.clone() for g in grads]], [[g.clone() for g in grads]]  # one group of sub-partitions
    total_norm = torch.tensor(norm * loss_scale)  # made before counting: a norm on the device
    with HostSyncCounter() as c_ours:
        deepspeed_patch.unscale_and_clip_grads(optimizer, ours, total_norm.clone())
    with HostSyncCounter() as c_theirs:
        original(optimizer, theirs, total_norm.clone())
    for a, b in zip(ours[0], theirs[0]):
        assert torch.equal(_bits(a), _bits(b)), (norm, a, b)
    assert sum(c_ours.sites.values()) == 0, c_ours.sites
    invalid = not norm >= 0 or norm == float("inf")
    # DeepSpeed's: the validity read, and for an invalid norm the copy of +inf to the device
    assert sum(c_theirs.sites.values()) == (0 if clip_grad == 0 else 2 if invalid else 1), c_theirs.sites


def test_apply_patches_every_home_and_refuses_other_versions(monkeypatch):
    import importlib

    import deepspeed
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    monkeypatch.setattr(deepspeed, "__version__", "0.19.9")
    before = DeepSpeedZeroOptimizer.unscale_and_clip_grads
    line = deepspeed_patch.apply()
    assert "0.19.9" in line and "left as they are" in line
    if not deepspeed_patch._applied:  # nothing was patched before this test: nothing is now
        assert DeepSpeedZeroOptimizer.unscale_and_clip_grads is before
    monkeypatch.setattr(deepspeed, "__version__", deepspeed_patch.PATCHED_VERSION)
    assert "without host syncs" in deepspeed_patch.apply()
    assert DeepSpeedZeroOptimizer.unscale_and_clip_grads is deepspeed_patch.unscale_and_clip_grads
    for home in deepspeed_patch._MASK_HOMES:
        module = importlib.import_module(home)
        assert module.mask_nan_or_inf_with_val_inplace is deepspeed_patch.mask_nan_or_inf_with_val_inplace


def _engine_run(tmp_path: Path, mode: str, pythonpath: Path | None = None) -> dict:
    out = tmp_path / f"{mode}.pt"
    extra = {} if pythonpath is None else {"PYTHONPATH": f"{pythonpath}:{tu.REPO}"}
    tu.run_one_rank("deepspeed_patch_entry.py", mode, str(out), timeout=200, **extra)
    return torch.load(out)


def _deepspeeds(syncs: list[dict]) -> list[dict]:
    return [{s: n for s, n in step.items() if s.startswith("(deepspeed)")} for step in syncs]


@pytest.mark.extended  # ~30 s; the runtime patch's bitwise results are tested above
@pytest.mark.timeout(300)
def test_the_upstream_patch_and_the_runtime_patch_train_alike_without_syncs(tmp_path):
    """The upstream patch applied to a copy of the installed DeepSpeed, the runtime patch, and DeepSpeed as it is:
    ZeRO-1 bf16 with clipping, a clipped step, an inf step, a clipped step: the same parameters bit for bit after
    every step, the inf step skipped alike when bf16.check_grad_overflow asks for it, and no sync left in
    ``engine.step()`` but the overflow checks that setting asks for."""
    import deepspeed

    copy = tmp_path / "site"
    shutil.copytree(Path(deepspeed.__file__).parent, copy / "deepspeed")
    subprocess.run(["patch", "-p1", "-d", str(copy), "-i", str(PATCH)], check=True, capture_output=True)
    runs = {
        "original": _engine_run(tmp_path, "original"),
        "runtime": _engine_run(tmp_path, "runtime"),
        "upstream": _engine_run(tmp_path, "upstream", copy),
    }
    assert Path(runs["upstream"]["deepspeed"]).is_relative_to(copy)
    base = runs["original"]
    for mode, got in runs.items():
        for check in ("off", "on"):
            for step, (a, b) in enumerate(zip(base[check]["params"], got[check]["params"])):
                assert all(torch.equal(_bits(x), _bits(y)) for x, y in zip(a, b)), (mode, check, step)
            assert got[check]["skipped"] == (1 if check == "on" else 0), (mode, check)
    # per group: the mask's copy and read, the clipping check; and the copy of +inf once the norm is invalid (the
    # inf step, and the next: with the check off its update was applied, the parameters are NaN)
    assert [sum(s.values()) for s in _deepspeeds(base["off"]["syncs"])] == [6, 8, 8], base["off"]["syncs"]
    assert _deepspeeds(base["off"]["syncs"])[0] == H200_SITES, base["off"]["syncs"]
    for mode in ("runtime", "upstream"):
        assert _deepspeeds(runs[mode]["off"]["syncs"]) == [{}, {}, {}], (mode, runs[mode]["off"]["syncs"])
        overflow_checks = {
            "(deepspeed) deepspeed/runtime/zero/stage_1_and_2.py:has_overflow <- stage_1_and_2.py:_check_overflow "
            "(_local_scalar_dense)",
            "(deepspeed) deepspeed/runtime/utils.py:is_invalid_grad_norm <- stage_1_and_2.py:step "
            "(_local_scalar_dense)",
        }
        for step in _deepspeeds(runs[mode]["on"]["syncs"]):
            assert set(step) <= overflow_checks, (mode, step)
