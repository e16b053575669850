"""No host sync in the training step: the real Trainer's steps on CPU, with every operation that would make the host
wait for the device on a GPU counted (tools/host_syncs.py: what CUDA's sync debug mode flags) and attributed to the
function that made it (tests/host_sync_entry.py). Allowed: the per-step decision that the loss is finite (bf16/fp32:
all ranks together, before the update), and model/host.py's CPU-only shortcuts, which never read a tensor of another
device (tested here on the meta device, which cannot be read).

DeepSpeed's own syncs are counted too (its accelerator's ``synchronize()``, its reads and blocking copies). With the
shipped bf16 ZeRO-1/2 configs (throughput timers and ``bf16.check_grad_overflow`` off) and DeepSpeed's ZeRO-1/2
gradient norm and clipping patched at start-up (pretrain/deepspeed_patch.py; docs/upstream/deepspeed-sync.md) none is
left: before the patch each step made six (per parameter group: the norm mask's copy of -1.0 to the device and its read
in ``masked_fill_``, and the clipping check), as the H200 counted (docs/performance.md). torch's foreach AdamW reads
its step counts on CPU; on CUDA the trainer's AdamW is fused (tests/test_ds_config.py), whose step counts stay on the
device."""

from __future__ import annotations

import json

import pytest

from tests import train_utils as tu

ALLOWED = "pretrain/distributed.py:all_ranks_true (_local_scalar_dense)"
CPU_ONLY = "model/host.py:cpu_all (_local_scalar_dense)"
CPU_ADAMW = "(torch.optim) optimizer.py:_get_value (_local_scalar_dense)"
BLOCKBERT = {
    "kernel": "auto",
    "sparsity": {"mode": "blockbert", "num_blocks": 2, "block": 16, "head_assignment": "3:1"},
}


def _syncs(tmp_path, *extra: str, ds_config: str = "zero1_fp32.json", **model) -> dict:
    out = tmp_path / "syncs.json"
    tu.prepare(tmp_path, **model)
    args = tu.train_args(tmp_path, ds_config, 8, *extra, global_batch=4)
    tu.run_one_rank("host_sync_entry.py", str(out), *args, timeout=240)
    return json.loads(out.read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "model",
    [
        {},
        {"attention": BLOCKBERT},
        {"position": {"type": "diet_rel", "max_distance": 64, "sharing": "none"}},
        {"attention": {"kernel": "auto", "token_mask": {"pattern": "strided", "stride": 8, "seq_len": 64}}},
        {
            "position": {"type": "rotary", "rope_theta": 160000.0, "rope_theta_local": 10000.0},
            "pre_layer_norm": True,
            "ffn_type": "glu",
            "attention": {
                "kernel": "auto",
                "global_every": 2,
                "local": {"token_mask": {"pattern": "sliding_window", "window": 16}},
            },
        },
    ],
    ids=["dense", "blockbert", "diet_rel", "sparsebert_strided", "modernbert"],
)
def test_a_training_step_makes_no_host_sync_but_the_finite_loss_decision(tmp_path, model):
    got = _syncs(tmp_path, **model)
    ours = {site: n for site, n in got["sites"].items() if not site.startswith("(") and site != CPU_ONLY}
    assert ours == {ALLOWED: got["steps"]}, got["sites"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("ds_config", ["zero1_bf16.json", "zero2_bf16.json"])
def test_the_shipped_bf16_configs_keep_deepspeeds_step_from_waiting_for_the_device(tmp_path, ds_config):
    """No throughput-timer synchronize, no overflow-flag or grad-norm read, no blocking copy in the gradient norm or
    the clipping: only the all-ranks decision is left."""
    got = _syncs(tmp_path, ds_config=ds_config)
    left = {site: n for site, n in got["sites"].items() if site not in (CPU_ONLY, CPU_ADAMW)}
    assert left == {ALLOWED: got["steps"]}, got["sites"]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_counter_sees_the_dynamic_mlm_gather(tmp_path):
    """--dynamic-mlm-gather selects the masked positions with a boolean mask: a sync per micro-batch, found and
    attributed to the MLM head (so the test above can fail)."""
    got = _syncs(tmp_path, "--dynamic-mlm-gather")
    micro = got["steps"] * got["gas"]
    assert got["sites"].get("model/bert.py:forward (index with a boolean mask)", 0) >= micro, got["sites"]


def test_cpu_only_shortcuts_never_read_another_device():
    import torch

    from model.host import cpu_all

    assert cpu_all(torch.ones(3, dtype=torch.bool)) and not cpu_all(torch.tensor([True, False]))
    meta = torch.ones(3, dtype=torch.bool, device="meta")
    with pytest.raises(Exception):
        bool(meta.all())  # reading a meta tensor fails: so cpu_all below did not read it
    assert cpu_all(meta) is False
