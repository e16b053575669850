"""No host sync in the training step: the real Trainer's steps on CPU, with every operation that would make the host
wait for the device on a GPU counted (benchmarks/support/host_syncs.py: what CUDA's sync debug mode flags) and
attributed to the
function that made it (tests/host_sync_entry.py). Allowed: the per-step decision that the loss is finite (bf16/fp32:
all ranks together, before the update), and model/cpu_shortcuts.py's CPU-only shortcuts, which never read a tensor of
another device (tested here on the meta device, which cannot be read).

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
CPU_ONLY = "model/cpu_shortcuts.py:cpu_all (_local_scalar_dense)"
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


EXTENDED = pytest.mark.extended


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "model",
    [
        {},
        {"attention": BLOCKBERT},
        # the bias and token-mask families take dense's kernel path: the extended tier (~12 s each)
        pytest.param({"position": {"type": "diet_rel", "max_distance": 64, "sharing": "none"}}, marks=EXTENDED),
        pytest.param(
            {"attention": {"kernel": "auto", "token_mask": {"pattern": "strided", "stride": 8, "seq_len": 64}}},
            marks=EXTENDED,
        ),
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


@pytest.mark.timeout(300)
@pytest.mark.parametrize(  # ZeRO-2's step runs the same patched norm and clipping: the extended tier
    "ds_config", ["zero1_bf16.json", pytest.param("zero2_bf16.json", marks=EXTENDED)]
)
def test_the_shipped_bf16_configs_keep_deepspeeds_step_from_waiting_for_the_device(tmp_path, ds_config):
    """No throughput-timer synchronize, no overflow-flag or grad-norm read, no blocking copy in the gradient norm or
    the clipping: only the all-ranks decision is left."""
    got = _syncs(tmp_path, ds_config=ds_config)
    left = {site: n for site, n in got["sites"].items() if site not in (CPU_ONLY, CPU_ADAMW)}
    assert left == {ALLOWED: got["steps"]}, got["sites"]


@pytest.mark.timeout(300)
def test_the_counter_sees_the_dynamic_mlm_gather(tmp_path):
    """--dynamic-mlm-gather selects the masked positions with a boolean mask: a sync per micro-batch, found and
    attributed to the MLM head (so the test above can fail)."""
    got = _syncs(tmp_path, "--dynamic-mlm-gather")
    micro = got["steps"] * got["gas"]
    assert got["sites"].get("model/bert.py:forward (index with a boolean mask)", 0) >= micro, got["sites"]


def test_cpu_only_shortcuts_never_read_another_device():
    import torch

    from model.cpu_shortcuts import cpu_all

    assert cpu_all(torch.ones(3, dtype=torch.bool)) and not cpu_all(torch.tensor([True, False]))
    meta = torch.ones(3, dtype=torch.bool, device="meta")
    with pytest.raises(Exception):
        bool(meta.all())  # reading a meta tensor fails: so cpu_all below did not read it
    assert cpu_all(meta) is False


def test_the_counter_sees_what_cudas_sync_debug_mode_flags():
    """benchmarks/support/host_syncs.py on CPU: each operation that waits for the device on a GPU counted once, where
    the tensor would live decided by where it was made (module docstring); each pair below differs only in that."""
    import torch

    from benchmarks.support.host_syncs import HostSyncCounter

    device_t = torch.randn(8)  # made before counting: a parameter, a gradient, a state
    kinds = {}
    cases = {
        "torch.tensor to the device": lambda: torch.tensor(-1.0, device="cpu"),
        "torch.tensor on the host": lambda: torch.tensor(-1.0),
        "blocking .to(device) of host data": lambda: torch.zeros(3).to("cpu"),
        "non-blocking .to(device)": lambda: torch.zeros(3).to("cpu", non_blocking=True),  # from pinned memory
        "masked_fill_ with a device value": lambda: device_t.clone().masked_fill_(device_t > 0, device_t.sum()),
        "masked_fill_ with a host value": lambda: device_t.clone().masked_fill_(device_t > 0, torch.tensor(0.0)),
        "masked_fill_ with a number": lambda: device_t.clone().masked_fill_(device_t > 0, -1.0),
        ".item() of a device tensor": lambda: device_t.sum().item(),
        ".item() of a host tensor": lambda: torch.zeros(2).sum().item(),
        ".tolist() of a device tensor": lambda: device_t.tolist(),
        ".cpu() of a device tensor": lambda: device_t.cpu(),
        "boolean-mask indexing": lambda: device_t[device_t > 0],
        "boolean-mask assignment": lambda: device_t.clone().__setitem__(device_t > 0, 0.0),
        "nonzero": lambda: torch.nonzero(device_t),
        "unique": lambda: torch.unique(device_t),
        "repeat_interleave without output_size": lambda: torch.repeat_interleave(device_t.long().abs()),
        "repeat_interleave with output_size": lambda: device_t.repeat_interleave(2, output_size=16),
        "arithmetic on the device": lambda: (device_t * 2).sum(),
    }
    for name, op in cases.items():
        with HostSyncCounter() as c:
            op()
        kinds[name] = sum(c.sites.values())
    assert kinds == {
        "torch.tensor to the device": 1,
        "torch.tensor on the host": 0,
        "blocking .to(device) of host data": 1,
        "non-blocking .to(device)": 0,
        "masked_fill_ with a device value": 1,
        "masked_fill_ with a host value": 0,
        "masked_fill_ with a number": 0,
        ".item() of a device tensor": 1,
        ".item() of a host tensor": 0,
        ".tolist() of a device tensor": 1,
        ".cpu() of a device tensor": 1,
        "boolean-mask indexing": 1,
        "boolean-mask assignment": 1,
        "nonzero": 1,
        "unique": 1,
        "repeat_interleave without output_size": 1,
        "repeat_interleave with output_size": 0,
        "arithmetic on the device": 0,
    }
