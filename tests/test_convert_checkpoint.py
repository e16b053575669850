"""DeepSpeed ZeRO-3 checkpoint of 2 ranks (made by the real trainer) -> Hugging Face; bad inputs; the reverse warm
start from a Hugging Face BERT into the trainer (BlockBERT from dense BERT, longer N)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import ModelConfig
from pretrain import checkpoint_reader
from tests import train_utils as tu
from tools import convert_checkpoint as cc
from tools.hf_export import export, remote_code, warm_start

BLOCKBERT = {
    "kernel": "block_gather",
    "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
}


@pytest.fixture(scope="module")
def zero3_ckpt(tmp_path_factory) -> Path:
    """2 CPU ranks (gloo), ZeRO-3 fp32, a BlockBERT tiny model, 2 iterations, saved at the end. Started by torchrun:
    the `deepspeed` launcher adds two Python processes that import DeepSpeed before the ranks start (~30 s of this
    fixture's ~90 s on the loaded 2-core box); the `deepspeed` launch path has its canaries elsewhere
    (tests/test_train_resume.py, tests/test_faults.py)."""
    tmp = tmp_path_factory.mktemp("zero3")
    tu.prepare(tmp, attention=BLOCKBERT)
    args = tu.train_args(tmp, "zero3_fp32.json", 2, "--save", str(tmp / "ckpt"), "--save-interval", "2")
    r = tu.launch("torchrun", args, nprocs=2, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:]
    files = {p.name for p in (tmp / "ckpt" / "iter_0000002").iterdir()}
    assert {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= files
    return tmp


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src / "ckpt", dst)
    return dst


@pytest.mark.multirank
def test_zero3_two_ranks_to_hf(zero3_ckpt, tmp_path):
    out = tmp_path / "hf"
    assert cc.main(["--load", str(zero3_ckpt / "ckpt"), "--to-hf", str(out)]) == 0
    names = {p.name for p in out.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "README.md",
        "vocab.txt",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "modeling_sparsebert.py",
    } <= names
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".hf.")]  # no temporary leftovers

    # consolidated fp32 weights: every parameter of the model, full shapes, trained (not all equal to init)
    sd, cfg, layouts = warm_start.read_hf(out)
    model = BertForPreTraining(cfg)
    model.load_state_dict(sd, strict=True)
    assert all(v.dtype == torch.float32 and torch.isfinite(v).all() for v in sd.values())
    assert cfg.attention.sparsity["mode"] == "blockbert"
    assert json.loads((out / "config.json").read_text())["auto_map"]["AutoModelForMaskedLM"].endswith("ForMaskedLM")

    # DeepSpeed's zero_to_fp32 run directly agrees tensor for tensor
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    ref = get_fp32_state_dict_from_zero_checkpoint(str(zero3_ckpt / "ckpt"), tag="iter_0000002")
    assert set(ref) == set(sd)
    for k in ref:
        assert torch.equal(ref[k].float(), sd[k]), k

    # and back: HF -> warm-start checkpoint keeps every tensor and the trained layouts (ours -> HF -> ours)
    info = warm_start.hf_to_ds(str(out), str(tmp_path / "back"))
    back = torch.load(tmp_path / "back" / info["tag"] / "mp_rank_00_model_states.pt", weights_only=False)
    assert set(back["module"]) == set(ref)
    assert all(torch.equal(back["module"][k], ref[k].float()) for k in ref)
    client = checkpoint_reader.read_client_state(str(zero3_ckpt / "ckpt"), "iter_0000002")
    assert back["model_config"] == client["model_config"]
    for layer, lay in client["layout_state"].items():
        assert (lay is None and back["layout_state"][layer] is None) or torch.equal(back["layout_state"][layer], lay)

    card = (out / "README.md").read_text()
    for expected in ("ZeRO stage 3", "iterations: 2", "blockbert", "layers 2, hidden 64", "doc-sentences"):
        assert expected in card, expected

    # the exported tokenizer encodes like the training tokenizer
    from transformers import AutoTokenizer

    from data_pipeline.tokenization import build_tokenizer

    ours = build_tokenizer("BertWordPieceLowerCase", vocab_file=str(zero3_ckpt / "vocab.txt"))
    hf_tok = AutoTokenizer.from_pretrained(out, trust_remote_code=True)  # transformers 5 reads config.json too
    text = "w1 w17 w3 W99 unknownword"
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == ours.encode(text)
    assert hf_tok.mask_token_id == ours.mask_id and hf_tok.pad_token_id == ours.pad_id


@pytest.mark.multirank  # its fixture launches 2 ranks (the floor pass leaves it out)
def test_bad_checkpoint_dirs(zero3_ckpt, tmp_path):
    good = zero3_ckpt / "ckpt"
    out = tmp_path / "out"

    no_latest = _copy(zero3_ckpt, tmp_path / "no_latest")
    (no_latest / "latest").unlink()
    with pytest.raises(export.ConversionError, match=r"no 'latest' file.*iter_0000002.*--tag"):
        export.ds_to_hf(str(no_latest), str(out))

    with pytest.raises(export.ConversionError, match=r"--tag 'iter_0000099'.*does not exist"):
        export.ds_to_hf(str(good), str(out), tag="iter_0000099")

    missing = _copy(zero3_ckpt, tmp_path / "missing_rank")
    (missing / "iter_0000002" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    # the commit marker's file list catches it first (pretrain/checkpoint.py verify), naming the file
    with pytest.raises(
        export.ConversionError, match=r"does not verify.*zero_pp_rank_1_mp_rank_00_optim_states\.pt: missing; refusing"
    ):
        export.ds_to_hf(str(missing), str(out))

    uncommitted = _copy(zero3_ckpt, tmp_path / "uncommitted")
    (uncommitted / "iter_0000002" / "commit.json").unlink()
    with pytest.raises(export.ConversionError, match="no commit.json marker"):
        export.ds_to_hf(str(uncommitted), str(out))

    with pytest.raises(export.ConversionError, match="no such directory"):
        export.ds_to_hf(str(tmp_path / "nowhere"), str(out))
    assert not out.exists()  # nothing half-written

    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("x")
    with pytest.raises(export.ConversionError, match="already exist.*--overwrite"):
        export.ds_to_hf(str(good), str(busy), tokenizer=False)
    with pytest.raises(export.ConversionError, match="is the input --load"):  # it deleted every checkpoint (issue 34)
        export.ds_to_hf(str(good), str(good), tokenizer=False, overwrite=True)
    assert (good / "latest").is_file()


def test_cli_reports_errors_without_traceback(tmp_path, capsys):
    assert cc.main(["--load", str(tmp_path), "--to-hf", str(tmp_path / "o")]) == 2
    assert "error:" in capsys.readouterr().err


@pytest.mark.multirank
def test_warm_start_blockbert_from_dense_hf_bert(tmp_path):
    """A stock HF BertForMaskedLM (N=64) -> BlockBERT checkpoint with N=128 -> the trainer runs from it."""
    from transformers import BertConfig, BertForMaskedLM

    tu.prepare(tmp_path)
    torch.manual_seed(0)
    hf = BertForMaskedLM(
        BertConfig(
            vocab_size=tu.VOCAB_SIZE,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=64,
        )
    )
    hf.save_pretrained(tmp_path / "hf_dense")
    shutil.copyfile(tmp_path / "vocab.txt", tmp_path / "hf_dense" / "vocab.txt")
    out = tmp_path / "warm"
    assert (
        cc.main(
            [
                "--from-hf",
                str(tmp_path / "hf_dense"),
                "--to-ds",
                str(out),
                "--max-position-embeddings",
                "128",
                "--sparsity",
                json.dumps(BLOCKBERT["sparsity"]),
                "--attention-kernel",
                "block_gather",
            ]
        )
        == 0
    )

    state = torch.load(out / "iter_0000000" / "mp_rank_00_model_states.pt", weights_only=False)
    cfg = ModelConfig.from_dict(state["model_config"])
    assert cfg.max_position_embeddings == 128 and cfg.attention.sparsity["mode"] == "blockbert"
    pos_old = hf.state_dict()["bert.embeddings.position_embeddings.weight"]
    pos_new = state["module"]["bert.embeddings.position_embeddings.weight"]
    assert torch.equal(pos_new[:64], pos_old) and torch.equal(pos_new[64:], pos_old)  # rows copied cyclically
    q = hf.state_dict()["bert.encoder.layer.1.attention.self.query.weight"]
    assert torch.equal(state["module"]["bert.encoder.layers.1.attention.qkv.weight"][:64], q)
    assert (out / "tokenizer" / "vocab.txt").is_file()

    args = tu.train_args(tmp_path, "zero1_fp32.json", 1, "--load", str(out), "--finetune", seq=128)
    args[args.index("--model-config") + 1] = str(out / "model_config.json")
    r = tu.launch("python", args, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "--finetune: loaded weights" in r.stdout


@pytest.mark.parametrize(
    "ds_config",
    [
        pytest.param(
            "zero0_fp16", marks=pytest.mark.skipif(tu.cpu_fp16_missing() is not None, reason=str(tu.cpu_fp16_missing()))
        ),
        "zero0_fp16_any_cpu",
        "zero1_bf16",
    ],
)
def test_half_precision_runs_export_fp32_masters(tmp_path, ds_config):
    """fp16 ZeRO-0 keeps masters in the optimizer state, bf16 ZeRO-1 in `bf16_zero_pp_rank_*` shards: the export
    must carry those fp32 masters (which round exactly to the half-precision module weights), not the half weights.
    `_any_cpu`: the fp16 run with DeepSpeed's CPU fp16 policy lifted in the launched script, so the export of fp16
    masters is checked on CPUs without AVX512-FP16/AMX too."""
    tu.prepare(tmp_path)
    lifted = ds_config.endswith("_any_cpu")
    ds_config = ds_config.removesuffix("_any_cpu")
    # 2 iterations: with Megatron's counting a 1-iteration run's only step has the decayed LR (0) and moves nothing
    args = tu.train_args(tmp_path, f"{ds_config}.json", 2, "--save", str(tmp_path / "ckpt"), "--save-interval", "1")
    if lifted:
        r = tu.launch("torchrun", args, nprocs=1, timeout=240, entry=tu.fp16_policy_entry(tmp_path, supported=True))
    else:
        r = tu.launch("python", args, timeout=240)
    assert r.returncode == 0, r.stdout[-4000:]
    out = tmp_path / "hf"
    export.ds_to_hf(str(tmp_path / "ckpt"), str(out), tokenizer=False)
    sd, _, _ = warm_start.read_hf(out)
    module = _module_states(tmp_path / "ckpt")["module"]  # the checkpoint the export read: `latest`
    assert set(sd) == set(module)
    half = next(iter(module.values())).dtype
    assert half in (torch.float16, torch.bfloat16)
    assert all(sd[k].dtype == torch.float32 and torch.equal(sd[k].to(half), module[k]) for k in module)
    assert sum(not torch.equal(sd[k], module[k].float()) for k in module) > len(module) // 2


def _module_states(ck: Path) -> dict:
    tag = (ck / "latest").read_text().strip()
    return torch.load(ck / tag / "mp_rank_00_model_states.pt", weights_only=False)


def test_issue5_models_from_the_trainer_convert_both_ways(tmp_path):
    """A DAM search with DIET-REL and per-head segments, then stage 2 on its exported mask ('file') with DIET-ABS,
    both trained by the real trainer: --to-hf carries the learned alpha / the mask file (relative path, not the
    training machine's), the card names the settings, and --from-hf --to-ds gives every tensor back bit-exact."""
    tu.prepare(tmp_path, max_position_embeddings=64)
    base = json.loads((tmp_path / "model.json").read_text())
    stage1 = {
        **base,
        "segment": "per_head",
        "position": {"type": "diet_rel", "max_distance": 8, "sharing": "layer"},
        "attention": {"kernel": "dense", "token_mask": {"pattern": "dam", "seq_len": 64}},
    }
    (tmp_path / "model.json").write_text(json.dumps(stage1))
    r = tu.launch("python", tu.train_args(tmp_path, "zero2_fp32.json", 2, "--save", str(tmp_path / "ck1")))
    assert r.returncode == 0, r.stdout[-3000:]
    learned = tmp_path / "ck1" / "learned_masks.pt"
    assert learned.is_file()

    hf1 = tmp_path / "hf1"
    assert cc.main(["--load", str(tmp_path / "ck1"), "--to-hf", str(hf1)]) == 0
    from safetensors.torch import load_file

    exported = load_file(str(hf1 / "model.safetensors"))
    module = _module_states(tmp_path / "ck1")["module"]
    assert torch.equal(exported["sparsebert.bert.dam.alpha"], module["bert.dam.alpha"])  # the learned alpha
    assert not torch.equal(module["bert.dam.alpha"], torch.full_like(module["bert.dam.alpha"], 3.0))  # trained
    assert torch.equal(exported["sparsebert.bert.positional_attention.rel"], module["bert.positional_attention.rel"])
    card = (hf1 / "README.md").read_text()
    for expected in ("DIET-REL", "per-head segment", "DAM mask search"):
        assert expected in card, expected

    # stage 2: the exported DAM mask as a fixed 'file' mask, DIET-ABS, block_gather kernel
    stage2 = {
        **base,
        "position": {"type": "diet_abs", "rank": 16, "sharing": "head"},
        "attention": {"kernel": "block_gather", "token_mask": {"pattern": "file", "path": str(learned), "seq_len": 64}},
    }
    (tmp_path / "model.json").write_text(json.dumps(stage2))
    r = tu.launch("python", tu.train_args(tmp_path, "zero1_fp32.json", 1, "--save", str(tmp_path / "ck2")))
    assert r.returncode == 0, r.stdout[-3000:]
    hf2 = tmp_path / "hf2"
    assert cc.main(["--load", str(tmp_path / "ck2"), "--to-hf", str(hf2)]) == 0
    cfg2 = json.loads((hf2 / "config.json").read_text())
    assert cfg2["sparse_bert"]["attention"]["token_mask"]["path"] == "token_masks.pt"
    assert str(learned) not in (hf2 / "config.json").read_text() + (hf2 / "README.md").read_text()
    assert "SparseBERT token mask" in (hf2 / "README.md").read_text() and "DIET-ABS" in (hf2 / "README.md").read_text()
    from model.attention.sparsebert import load_mask

    for i in range(2):
        assert torch.equal(load_mask(str(hf2 / "token_masks.pt"), i, 4), load_mask(str(learned), i, 4))
    learned.rename(tmp_path / "moved.pt")  # the training machine's file is gone: the export must not need it
    (hf2 / "token_masks.pt").unlink()  # nor its own copy (save_pretrained drops it): the stored buffers suffice

    for ck, hf in ((tmp_path / "ck1", hf1), (tmp_path / "ck2", hf2)):
        out = tmp_path / f"back_{hf.name}"
        assert cc.main(["--from-hf", str(hf), "--to-ds", str(out)]) == 0
        src, back = _module_states(ck), _module_states(out)
        assert set(back["module"]) == set(src["module"])
        assert all(torch.equal(back["module"][k], src["module"][k].float()) for k in src["module"]), ck
        assert back["layout_state"].keys() == src["layout_state"].keys()
        for k, lay in src["layout_state"].items():
            assert (lay is None and back["layout_state"][k] is None) or torch.equal(back["layout_state"][k], lay)
        tm = back["model_config"]["attention"]["token_mask"]
        if tm["pattern"] == "file":  # the mask was copied next to the new checkpoint
            assert Path(tm["path"]) == (out / "token_masks.pt").resolve() and Path(tm["path"]).is_file()
            model = BertForPreTraining(ModelConfig.from_dict(back["model_config"]))
            model.load_state_dict(back["module"])
            masks = remote_code.token_mask_state(model)
            assert all(torch.equal(masks[f"layer{i}"], load_mask(str(tmp_path / "moved.pt"), i, 4)) for i in range(2))

    # warm start with a longer N: DIET-ABS positions grow cyclically like BERT's position table
    out = tmp_path / "long"
    assert cc.main(["--from-hf", str(hf2), "--to-ds", str(out), "--max-position-embeddings", "128"]) == 0
    pos_old = _module_states(tmp_path / "ck2")["module"]["bert.positional_attention.abs_pos"]
    pos_new = _module_states(out)["module"]["bert.positional_attention.abs_pos"]
    assert pos_new.shape[1] == 128 and torch.equal(pos_new[:, :64], pos_old) and torch.equal(pos_new[:, 64:], pos_old)


def test_from_hf_refuses_a_stored_mask_our_code_would_draw_differently(tmp_path):
    """A random token mask in the export that the config no longer reproduces is not silently replaced."""
    from safetensors.torch import load_file, save_file

    cfg = ModelConfig.preset(
        "tiny",
        vocab_size=64,
        max_position_embeddings=32,
        attention={"kernel": "dense", "token_mask": {"pattern": "bigbird"}},
    )
    hf = tmp_path / "hf"
    hf.mkdir()
    model = BertForPreTraining(cfg)
    export.write_hf(model.state_dict(), cfg, model.layout_state(), hf)
    sd = load_file(str(hf / "model.safetensors"))
    key = "sparsebert.token_masks.layer1"
    sd[key] = sd[key].flip(-1).contiguous()
    save_file(sd, str(hf / "model.safetensors"))
    with pytest.raises(export.ConversionError, match="layer1's token mask built from the config differs"):
        warm_start.hf_to_ds(str(hf), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
