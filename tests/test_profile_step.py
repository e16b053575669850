"""benchmarks/profile_step.py (gpu_check's profile step) at CPU scale: the same report shape the GPU run fills, on the
trainer's own batches (padded and packed rows), and its stop at the step's deadline with the variants it has."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from benchmarks import profile_step as ps
from tests import train_utils as tu

REPO = tu.REPO


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_cpu_profile_reports_every_field_for_padded_and_packed_rows(tmp_path):
    tu.prepare(tmp_path)
    out, trace = tmp_path / "p.json", tmp_path / "trace.json.gz"
    cmd = [sys.executable, "-m", "benchmarks.profile_step", "--model-preset", "tiny", "--device", "cpu"]
    cmd += ["--seq-len", "64", "--batch", "2", "--warmup", "1", "--steps", "1", "--vocab-size", str(tu.VOCAB_SIZE)]
    cmd += ["--data-path", str(tmp_path / "shard"), "--vocab-file", str(tmp_path / "vocab.txt")]
    cmd += ["--sample-mode", "doc-sentences", "--variants", "eager", "packed"]
    cmd += ["--json", str(out), "--trace", str(trace)]
    p = subprocess.run(cmd, cwd=REPO, env=tu.env(), capture_output=True, text=True, timeout=220)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["complete"] and result["left_out"] == []
    eager, packed = result["rows"]
    assert (eager["variant"], packed["variant"]) == ("eager", "packed")
    assert packed["case"]["sample_mode"] == "packed-docs" and eager["case"]["sample_mode"] is None
    assert eager["padding_share"] > packed["padding_share"]  # doc-sentences rows are padded, packed ones filled
    for r in (eager, packed):
        assert r["case"]["batch"] == 2 and r["case"]["seq_len"] == 64 and r["mfu"] is None  # no peak on CPU
        assert 0 < len(r["top_kernels"]) <= ps.TOP_KERNELS and r["top_kernels"][0]["name"].startswith("aten::")
        shares = [k["share"] for k in r["top_kernels"]]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= r["busy_fraction"] <= 1.05
        assert r["tflops"] == pytest.approx(r["tokens_per_s"] * _fpt(r) / 1e12, rel=1e-9)
        # DeepSpeed's bf16 ZeRO-1 step makes none: its gradient norm and clipping patched (pretrain/deepspeed_patch.py,
        # applied by initialize_engine), its throughput timers off in the shipped config; torch's CPU AdamW reads
        # its step counts (CPU-only: the CUDA AdamW is fused)
        assert r["host_syncs_per_step"] == sum(r["host_sync_sites"].values()) > 0
        assert not any(s.startswith("(deepspeed)") for s in r["host_sync_sites"]), r["host_sync_sites"]
        assert any(s.startswith("(torch.optim)") for s in r["host_sync_sites"]), r["host_sync_sites"]
        assert r["peak_memory_mib"] > 0 and r["step_s"] > 0
    assert "trace" not in packed and eager["trace"] == str(trace)
    assert any(e.get("name", "").startswith("aten::") for e in json.load(gzip.open(trace))["traceEvents"])
    md = "\n".join(ps.markdown(result))
    assert "| eager | 64 | 2 | 1 | 0.1 | padded (" in md and "| packed | 64 | 2 | 1 | 0.1 | packed |" in md
    assert "Top kernels of `eager`" in md and "Host syncs of `eager` per step, by site: " in md
    assert "(torch.optim)" in md.split("Host syncs of `eager`")[1]


def _fpt(row: dict) -> float:
    """The benchmark's FLOPs per token, recomputed from model.flops with the tiny preset's shapes."""
    from model.flops import flops_per_token
    from model.presets import PRESETS

    t = PRESETS["tiny"]
    return flops_per_token(t["hidden_size"], t["num_layers"], 64, tu.VOCAB_SIZE, 1.0, row["predicted_share"])


def test_variants_run_in_priority_order_until_the_deadline(monkeypatch, tmp_path):
    clock = [1000.0]
    monkeypatch.setattr(ps.time, "time", lambda: clock[0])
    ran = []

    def fake(name, case, args, device, trace):
        ran.append((name, case.compile, case.batch, trace))
        clock[0] += 10.0  # each variant takes 10 s
        return {
            "variant": name,
            "case": {"batch": case.batch},
            "step_s": 1.0,
            "busy_fraction": 1,
            "host_syncs_per_step": 0,
        }

    monkeypatch.setattr(ps, "profile_variant", fake)
    monkeypatch.setenv(ps.STEP_DEADLINE_ENV, str(1000.0 + 40.0 + ps.MARGIN_S))
    args = SimpleNamespace(
        budget_s=None,
        compile_estimate_s=15.0,
        precision="bf16",
        seq_len=512,
        batch=32,
        model_preset="bert-base",
        variants=list(ps.VARIANTS),
    )
    args.json, args.trace = str(tmp_path / "p.json"), str(tmp_path / "t.json.gz")
    result = ps.run(args, None, "dev")
    # eager (10 s) at t=0, zero1_overlap 10 -> 20, zero0_autocast 20 -> 30; compiled needs max(2 x 10 s, 15 s) with
    # 10 left: left out; batch_x2 at 30 needs 10 s with 10 left: runs to 40; the rest have 0 s left
    assert [r[0] for r in ran] == ["eager", "zero1_overlap", "zero0_autocast", "batch_x2"]
    assert not any(r[1] for r in ran) and [r[2] for r in ran] == [32, 32, 32, 64]
    assert ran[0][3] == args.trace and all(r[3] is None for r in ran[1:])  # the trace of the first variant only
    left = ["compiled", "batch_x4", "dropout0", "packed", "zero0", "zero2"]
    assert result["left_out"] == left and not result["complete"]
    assert json.loads((tmp_path / "p.json").read_text())["left_out"] == result["left_out"]
