"""pretrain/checkpoint_reader.py: a checkpoint is read from its files alone. The ZeRO-0 fp16/bf16 masters are named
without building the model (the trainer's own param groups are the reference), and the Hugging Face export path
imports neither pretrain.parallelize nor anything that builds an engine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import ModelConfig
from pretrain.checkpoint_reader import _zero0_fp32_masters
from pretrain.parallelize import param_groups

_SMALL = dict(vocab_size=97, hidden_size=32, num_layers=2, num_attention_heads=4, intermediate_size=64)

# families whose no-decay group holds more than the 1-D parameters (DIET tables, DAM's alpha, per-head segments)
CONFIGS = {
    "dense": dict(_SMALL),
    "diet_abs_head": dict(_SMALL, position={"type": "diet_abs", "rank": 8, "sharing": "head"}),
    "diet_rel_segments": dict(_SMALL, segment="per_head", position={"type": "diet_rel", "max_distance": 8}),
    "dam": dict(_SMALL, attention={"kernel": "dense", "token_mask": {"pattern": "dam", "seq_len": 32}}),
    "no_nsp_preln": dict(_SMALL, nsp_head=False, pre_layer_norm=True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("half", [torch.float16, torch.bfloat16])
def test_zero0_masters_named_like_the_trainers_param_groups(name, half):
    """Masters = the trainer's param groups (param_groups: decayed, not decayed) perturbed below half precision, the
    module = their half weights, as DeepSpeed's ZeRO-0 fp16/bf16 optimizer saves them: every master gets its name."""
    torch.manual_seed(0)
    model = BertForPreTraining(ModelConfig(**CONFIGS[name]))
    names = {id(p): n for n, p in model.named_parameters()}
    groups, want = [], {}
    for g in param_groups(model, 0.01):
        masters = []
        for p in g["params"]:
            m = (p.detach() + torch.randn_like(p) * 1e-4).float()  # fp32 detail the half copy cannot hold
            masters.append(m)
            want[names[id(p)]] = m
        groups.append(masters)
    module = {k: want[k].to(half) for k in model.state_dict()}  # DeepSpeed's half weights: the masters rounded
    got = _zero0_fp32_masters(module, groups)
    assert got is not None and list(got) == list(module)
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert sum(not torch.equal(got[k], module[k].float()) for k in got) > len(got) // 2


def test_zero0_masters_refused_when_they_do_not_fit():
    torch.manual_seed(0)
    model = BertForPreTraining(ModelConfig(**_SMALL))
    groups = [[p.detach().float().clone() for p in g["params"]] for g in param_groups(model, 0.01)]
    module = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    groups[0][0] += 1.0  # no longer rounds to its module weight
    assert _zero0_fp32_masters(module, groups) is None
    assert _zero0_fp32_masters(module, [groups[1]]) is None  # a group missing: counts differ


def test_zero0_masters_ambiguous_split_is_refused():
    """Two same-shaped weights with equal half values, one decayed and one not, in either order: the names cannot
    be told apart, so no masters rather than possibly swapped ones."""
    a = torch.ones(2, 2)
    module = {"x": a.half(), "y": a.half()}
    assert _zero0_fp32_masters(module, [[a + 1e-5], [a - 1e-5]]) is None
    assert _zero0_fp32_masters(module, [[a + 1e-5, a - 1e-5], []]) is not None  # one group: order decides


def test_export_imports_no_parallelize_and_builds_no_model(tmp_path):
    """A ZeRO-0 fp16 checkpoint exported in a fresh interpreter: pretrain.parallelize, the trainer and its builders
    stay out of sys.modules (the reader's function-level imports ran too), and the only model constructed is the
    weightless skeleton on the meta device that checks the weights' names and shapes."""
    code = f"""
import json, sys, torch
from pathlib import Path
import tools.convert_checkpoint  # the CLI and everything it imports at the top
from tools.hf_export import export
from model.config import ModelConfig
from model.bert import BertForPreTraining
from pretrain.checkpoint_reader import COMMIT_MARKER, LATEST, file_records
from safetensors.torch import load_file

root = Path({str(tmp_path)!r}) / "ckpt"
tag = "iter_0000001"
(root / tag).mkdir(parents=True)
torch.manual_seed(0)
cfg = ModelConfig(**{json.dumps(_SMALL)})
model = BertForPreTraining(cfg)
sd = {{k: v + 1e-4 * torch.randn_like(v) for k, v in model.state_dict().items()}}  # fp32 masters
torch.save({{"module": {{k: v.half() for k, v in sd.items()}}, "model_config": cfg.to_dict(), "iteration": 1,
            "layout_state": model.layout_state(), "world_size": 1, "args": {{}},
            "optimizer": {{"fp32_groups": [[v for k, v in sd.items() if v.ndim > 1],
                                          [v for k, v in sd.items() if v.ndim <= 1]]}}}},
           root / tag / "mp_rank_00_model_states.pt")
(root / tag / COMMIT_MARKER).write_text(json.dumps({{"world_size": 1, "files": file_records(root / tag)}}))
(root / LATEST).write_text(tag)
del model
devices = []
init = BertForPreTraining.__init__
def spy(self, *a, **k):
    devices.append(torch.empty(0).device.type)
    init(self, *a, **k)
BertForPreTraining.__init__ = spy
info = export.ds_to_hf(str(root), str(root.parent / "hf"), tokenizer=False)
got = load_file(str(root.parent / "hf" / "model.safetensors"))
assert info["architecture"] == "BertForMaskedLM"
assert torch.equal(got["bert.embeddings.word_embeddings.weight"], sd["bert.embeddings.word_embeddings.weight"])
bad = sorted(m for m in sys.modules if m in ("pretrain.parallelize", "pretrain.trainer", "pretrain.builders"))
print(json.dumps({{"bad": bad, "devices": devices}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"bad": [], "devices": ["meta"]}
