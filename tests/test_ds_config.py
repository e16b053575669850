"""ds_config handling: legacy blocks, unknown keys, batch arithmetic, and every shipped preset passing DeepSpeed's
own validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pretrain.args import OptimConfig
from pretrain.ds_config import (
    DSConfigError,
    apply_clip_grad,
    check_precision_supported,
    read_ds_config,
    resolve_batch_sizes,
    validate_with_deepspeed,
)
from pretrain.parallelize import configure_optimizer

REPO = Path(__file__).resolve().parents[1]
PRESETS = sorted((REPO / "ds_configs").glob("*.json"))


def write(tmp_path: Path, cfg, name: str = "cfg.json") -> Path:
    p = tmp_path / name
    p.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return p


def test_presets_cover_every_stage_and_precision():
    names = {p.name for p in PRESETS}
    for stage in range(4):
        for prec in ("fp32", "fp16", "bf16"):
            assert f"zero{stage}_{prec}.json" in names


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_every_preset_passes_deepspeed_validation(path):
    ds = read_ds_config(path)
    resolve_batch_sizes(ds, 2, 4, 1)
    configure_optimizer(ds, OptimConfig())
    validate_with_deepspeed(ds)  # DeepSpeed's own pydantic models and batch assertions
    assert "sparse_attention" not in ds.config and "amp" not in ds.config
    if path.name.startswith("zero"):
        assert ds.zero_stage == int(path.name[4])
        assert ds.precision == path.stem.split("_")[1]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_no_preset_keeps_a_setting_that_syncs_the_host_every_step(path):
    """The shipped configs turn off DeepSpeed's throughput timers (and, for bf16 ZeRO 1-2, its grad-overflow read):
    tests/test_host_syncs.py counts what remains."""
    ds = read_ds_config(path)
    assert not [n for n in ds.notes if "host syncs" in n], ds.notes
    assert ds.applies_nonfinite_grads == (
        path.name in ("zero1_bf16.json", "zero1_bf16_overlap.json", "zero2_bf16.json")
    )


def test_a_user_config_that_syncs_the_host_gets_a_note_not_an_override(tmp_path):
    p = write(tmp_path, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 2}})
    ds = read_ds_config(p)
    notes = [n for n in ds.notes if "host syncs" in n]
    assert len(notes) == 2 and all(str(p) in n for n in notes), ds.notes
    assert "timers.throughput is on" in notes[0] and "bf16.check_grad_overflow is on" in notes[1]
    assert "timers" not in ds.config and ds.config["bf16"] == {"enabled": True}  # told, not changed
    assert not ds.applies_nonfinite_grads
    off = {"enabled": False}
    for cfg in ({"timers": {"throughput": off}}, {"timers": {"throughput": {"synchronized": False}}}):
        assert not [n for n in read_ds_config(write(tmp_path, cfg)).notes if "host syncs" in n]
    stage3 = read_ds_config(write(tmp_path, {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}))
    assert ["timers" in n for n in stage3.notes] == [True]  # check_grad_overflow is read by ZeRO 1-2 only


def test_sparse_attention_block_is_read_and_removed(tmp_path):
    block = {"mode": "fixed", "block": 16, "num_local_blocks": 4, "num_global_blocks": 1}
    p = write(tmp_path, {"zero_optimization": {"stage": 1}, "sparse_attention": block})
    ds = read_ds_config(p)
    assert ds.sparse_attention.items() >= block.items()  # plus the keys DeepSpeed's parser defaulted
    assert "sparse_attention" not in ds.config
    assert any(str(p) in n for n in ds.notes)
    resolve_batch_sizes(ds, 2, None, 1)
    validate_with_deepspeed(ds)  # DeepSpeed 0.19.8 itself would raise on the block


def test_sparse_attention_block_reaches_the_model_config(tmp_path):
    from pretrain.args import DataArgs, ModelArgs
    from pretrain.builders import build_model_config

    block = {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16}
    cfg = build_model_config(
        ModelArgs(model_preset="tiny"), DataArgs(data_path=["x"], seq_length=128), 100, block, "f.json"
    )
    assert cfg.attention.sparsity == block and cfg.vocab_size == 100 and not cfg.nsp_head
    with pytest.raises(Exception, match="f.json"):
        build_model_config(
            ModelArgs(model_preset="tiny", attention={"sparsity": block}),
            DataArgs(data_path=["x"], seq_length=128),
            100,
            block,
            "f.json",
        )


def test_amp_block_refused_with_replacement(tmp_path):
    p = write(tmp_path, {"amp": {"enabled": True, "opt_level": "O1"}})
    with pytest.raises(DSConfigError, match=r"cfg\.json.*'amp'.*fp16"):
        read_ds_config(p)


def test_unknown_top_level_key_names_file_and_key(tmp_path):
    p = write(tmp_path, {"zero_optimisation": {"stage": 2}})
    with pytest.raises(DSConfigError, match=r"cfg\.json.*zero_optimisation"):
        read_ds_config(p)


def test_unknown_nested_key_goes_through_deepspeed_and_names_file(tmp_path):
    p = write(tmp_path, {"zero_optimization": {"stage": 2, "stag": 1}})
    ds = read_ds_config(p)
    resolve_batch_sizes(ds, 2, None, 1)
    with pytest.raises(DSConfigError, match=r"(?s)cfg\.json.*stag"):
        validate_with_deepspeed(ds)


def test_bad_json_names_line(tmp_path):
    p = write(tmp_path, '{\n  "fp16": {"enabled": true},\n  oops\n}')
    with pytest.raises(DSConfigError, match=r"cfg\.json:3:3: not valid JSON"):
        read_ds_config(p)


@pytest.mark.parametrize(
    "content,message",
    [
        (b"\xff\xfe{}", r"cfg\.json: not a text file \(byte 0 is not UTF-8\); give a DeepSpeed config"),
        (b"[1, 2]", r"cfg\.json: expected a JSON object, got a list; give a DeepSpeed config"),
        (b"  \n", r"cfg\.json is empty; give a DeepSpeed config"),
        (None, r"cfg\.json is a directory; give a DeepSpeed config"),
    ],
    ids=["binary", "list", "empty", "directory"],
)
def test_unreadable_config_is_one_ds_config_error_naming_the_file(tmp_path, content, message):
    """The shared JSON reader (common.inputs) raises DSConfigError here, so the trainer prints one line."""
    p = tmp_path / "cfg.json"
    p.mkdir() if content is None else p.write_bytes(content)
    with pytest.raises(DSConfigError, match=message):
        read_ds_config(p)


def test_fp16_and_bf16_together_refused(tmp_path):
    p = write(tmp_path, {"fp16": {"enabled": True}, "bf16": {"enabled": True}})
    with pytest.raises(DSConfigError, match="both enabled"):
        read_ds_config(p)


def test_batch_sizes_derived_and_conflicts_named(tmp_path):
    ds = read_ds_config(write(tmp_path, {}))
    assert resolve_batch_sizes(ds, 4, 64, 2) == (4, 8, 64)
    assert ds.config["gradient_accumulation_steps"] == 8 and ds.config["train_batch_size"] == 64
    ds = read_ds_config(write(tmp_path, {"train_micro_batch_size_per_gpu": 8}))
    with pytest.raises(DSConfigError, match="--micro-batch-size"):
        resolve_batch_sizes(ds, 4, 64, 2)
    ds = read_ds_config(write(tmp_path, {}))
    with pytest.raises(DSConfigError, match="not a multiple"):
        resolve_batch_sizes(ds, 4, 63, 2)
    ds = read_ds_config(write(tmp_path, {"gradient_accumulation_steps": 3}))
    with pytest.raises(DSConfigError, match="gradient_accumulation_steps=3"):
        resolve_batch_sizes(ds, 4, 64, 2)
    ds = read_ds_config(write(tmp_path, {"gradient_clipping": 0.5}))
    with pytest.raises(DSConfigError, match="--clip-grad"):
        apply_clip_grad(ds, 1.0)


def test_lamb_refused_under_zero(tmp_path):
    ds = read_ds_config(REPO / "ds_configs" / "zero2_fp16.json")
    with pytest.raises(DSConfigError, match="ZeRO stage 2"):
        configure_optimizer(ds, OptimConfig(optimizer="lamb"))


def test_scheduler_block_refused(tmp_path):
    ds = read_ds_config(write(tmp_path, {"scheduler": {"type": "WarmupLR"}}))
    with pytest.raises(DSConfigError, match="scheduler"):
        configure_optimizer(ds, OptimConfig())


class _FakeAccelerator:
    def __init__(self, fp16: bool, bf16: bool = True) -> None:
        self.fp16, self.bf16 = fp16, bf16

    def is_fp16_supported(self) -> bool:
        return self.fp16

    def is_bf16_supported(self) -> bool:
        return self.bf16

    def device_name(self) -> str:
        return "cpu"


def _cpu_without(monkeypatch, fp16: bool, bf16: bool = True) -> None:
    import deepspeed.accelerator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(deepspeed.accelerator, "get_accelerator", lambda: _FakeAccelerator(fp16, bf16))


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_fp16_on_a_cpu_without_it_is_one_line_naming_file_reason_and_replacements(monkeypatch, stage):
    _cpu_without(monkeypatch, fp16=False)
    path = REPO / "ds_configs" / f"zero{stage}_fp16.json"
    with pytest.raises(DSConfigError) as e:
        check_precision_supported(read_ds_config(path))
    msg = str(e.value)
    assert "\n" not in msg
    assert str(path) in msg and "AVX512-FP16 or AMX" in msg
    assert f"zero{stage}_bf16.json or " in msg and f"zero{stage}_fp32.json" in msg


def test_fp16_refusal_of_an_unshipped_config_points_to_the_shipped_ones(monkeypatch, tmp_path):
    _cpu_without(monkeypatch, fp16=False)
    with pytest.raises(DSConfigError, match=r"my\.json enables fp16.*a _bf16 or _fp32 config from ds_configs/"):
        check_precision_supported(read_ds_config(write(tmp_path, {"fp16": {"enabled": True}}, "my.json")))


@pytest.mark.parametrize("prec", ["fp32", "bf16", "fp16"])
def test_supported_precisions_pass(monkeypatch, prec):
    _cpu_without(monkeypatch, fp16=True)
    check_precision_supported(read_ds_config(REPO / "ds_configs" / f"zero2_{prec}.json"))


def test_bf16_on_a_gpu_without_bf16_hardware_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-32GB")
    path = REPO / "ds_configs" / "zero1_bf16.json"
    with pytest.raises(DSConfigError) as e:
        check_precision_supported(read_ds_config(path))
    assert "V100" in str(e.value) and "7.0" in str(e.value) and "zero1_fp16.json or " in str(e.value)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    check_precision_supported(read_ds_config(path))
    check_precision_supported(read_ds_config(REPO / "ds_configs" / "zero1_fp16.json"))


def _fake_cuda(monkeypatch, torch_cuda: str = "12.6") -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)


def test_default_optimizer_is_torch_adamw_fused_on_cuda_with_no_build(monkeypatch):
    """No FusedAdam JIT build: DeepSpeed's `torch_adam` path hands the remaining params to torch.optim.AdamW."""
    ds = read_ds_config(REPO / "ds_configs" / "zero1_bf16.json")
    configure_optimizer(ds, OptimConfig(lr=3e-4, weight_decay=0.01))
    assert ds.config["optimizer"]["params"]["torch_adam"] is True and "fused" not in ds.config["optimizer"]["params"]
    _fake_cuda(monkeypatch)
    ds = read_ds_config(REPO / "ds_configs" / "zero1_bf16.json")
    configure_optimizer(ds, OptimConfig(lr=3e-4, weight_decay=0.01))
    opt = ds.config["optimizer"]
    assert opt["type"] == "AdamW" and opt["params"]["torch_adam"] is True and opt["params"]["fused"] is True
    rest = {k: v for k, v in opt["params"].items() if k != "torch_adam"}
    built = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **rest)  # what DeepSpeed constructs
    assert built.defaults["fused"] is True and built.defaults["lr"] == 3e-4


def test_fused_adam_without_nvcc_is_refused_before_the_run(monkeypatch):
    import torch.utils.cpp_extension

    _fake_cuda(monkeypatch)
    monkeypatch.setattr(torch.utils.cpp_extension, "CUDA_HOME", None)
    ds = read_ds_config(REPO / "ds_configs" / "zero1_fp16.json")
    with pytest.raises(
        DSConfigError,
        match=r"--optimizer fused_adam: .*fused_adam op is not prebuilt.*nvcc.*"
        r"--optimizer adamw",
    ):
        configure_optimizer(ds, OptimConfig(optimizer="fused_adam"))


def test_fused_adam_with_a_mismatched_nvcc_is_refused(monkeypatch, tmp_path):
    import torch.utils.cpp_extension

    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 11.8, V11.8.89'\n")
    nvcc.chmod(0o755)
    _fake_cuda(monkeypatch, torch_cuda="13.0")
    monkeypatch.setattr(torch.utils.cpp_extension, "CUDA_HOME", str(tmp_path / "cuda"))
    ds = read_ds_config(REPO / "ds_configs" / "zero0_fp16.json")
    with pytest.raises(DSConfigError, match=r"does not match torch.*11\.8.*13\.0"):
        configure_optimizer(ds, OptimConfig(optimizer="lamb"))
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.48'\n")
    configure_optimizer(ds, OptimConfig(optimizer="lamb"))
    assert ds.config["optimizer"]["type"] == "Lamb"


def test_fused_optimizers_need_cuda():
    ds = read_ds_config(REPO / "ds_configs" / "zero0_fp32.json")
    with pytest.raises(DSConfigError, match="needs CUDA.*--optimizer adamw"):
        configure_optimizer(ds, OptimConfig(optimizer="fused_adam"))


def test_no_weight_decay_on_biases_norms_dam_logits_and_diet_tables():
    from model.bert import BertForPreTraining
    from model.config import ModelConfig
    from pretrain.parallelize import no_weight_decay_names, param_groups

    for position in ({"type": "diet_abs", "rank": 8}, {"type": "diet_rel", "max_distance": 8}):
        cfg = ModelConfig.preset(
            "tiny",
            vocab_size=50,
            position=position,
            segment="per_head",
            attention={"kernel": "dense", "token_mask": {"pattern": "dam", "seq_len": 32}},
        )
        model = BertForPreTraining(cfg)
        skip = no_weight_decay_names(model)
        assert {"bert.dam.alpha", "bert.positional_attention.segment"} <= skip
        assert ("bert.positional_attention.abs_pos" in skip) == (position["type"] == "diet_abs")
        assert ("bert.positional_attention.rel" in skip) == (position["type"] == "diet_rel")
        assert "bert.positional_attention.abs_uq" not in skip  # projections are matrices like Q/K: decayed
        assert "bert.embeddings.word_embeddings.weight" not in skip and "cls.bias" in skip
        decay, no_decay = param_groups(model, 0.01)
        names = {id(p): n for n, p in model.named_parameters()}
        assert {names[id(p)] for p in no_decay["params"]} == skip
        assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
        assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_zero3_with_compile_refused_naming_the_file():
    from pretrain.ds_config import check_compile_supported

    zero3 = read_ds_config(str(REPO / "ds_configs" / "zero3_bf16.json"))
    with pytest.raises(DSConfigError, match=r"zero3_bf16\.json: ZeRO stage 3 with --compile is not supported"):
        check_compile_supported(zero3, True)
    check_compile_supported(zero3, False)
    check_compile_supported(read_ds_config(str(REPO / "ds_configs" / "zero2_bf16.json")), True)
