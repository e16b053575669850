"""Hugging Face export: stock BERT and custom-code directories reproduce our logits (fp32, <= 1e-4), round trips keep
every tensor, and the custom code loads in a process that cannot import our package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.presets import MODERNBERT_LAYERS
from tools.hf_export import remote_code
from tools.hf_export.export import ConversionError, write_hf
from tools.hf_export.stock_bert import stock_bert_reason, stock_export
from tools.hf_export.warm_start import hf_to_ds, read_hf, read_hf_token_masks

TOL = 1e-4
_SMALL = dict(
    vocab_size=97,
    hidden_size=32,
    num_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    hidden_dropout=0.0,
    attention_dropout=0.0,
)

# name -> ModelConfig kwargs; every family the exporter must carry through our own code
CUSTOM = {
    "dense_remote": dict(_SMALL),
    "fixed": dict(
        _SMALL,
        attention={
            "kernel": "dense",
            "sparsity": {"mode": "fixed", "block": 16, "num_local_blocks": 2, "num_global_blocks": 1},
        },
    ),
    "blockbert": dict(
        _SMALL,
        attention={
            "kernel": "block_gather",
            "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
        },
    ),
    "bigbird_random": dict(
        _SMALL,
        attention={
            "kernel": "dense",
            "sparsity": {
                "mode": "bigbird",
                "block": 16,
                "num_random_blocks": 1,
                "num_sliding_window_blocks": 1,
                "num_global_blocks": 1,
                "seed": 3,
            },
        },
    ),
    "no_segments_relu": dict(_SMALL, type_vocab_size=0, hidden_act="relu"),
    "free_head_preln_mixed": dict(
        _SMALL,
        head_size=12,
        pre_layer_norm=True,
        attention={
            "kernel": "dense",
            "per_layer": [
                {"sparsity": None},
                {"sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "2:2", "block": 16}},
            ],
        },
    ),
    # DIET positional attention (every sharing mode), per-head segments, SparseBERT token masks, DAM
    **{
        f"diet_abs_{sh}": dict(_SMALL, position={"type": "diet_abs", "rank": 8, "sharing": sh})
        for sh in ("none", "layer", "head")
    },
    "diet_rel": dict(_SMALL, position={"type": "diet_rel", "max_distance": 8}),
    "segment_per_head": dict(_SMALL, segment="per_head"),
    "diet_rel_seg_blockbert": dict(
        _SMALL,
        segment="per_head",
        position={"type": "diet_rel", "max_distance": 6, "sharing": "layer"},
        attention={
            "kernel": "block_gather",
            "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
        },
    ),
    **{
        f"mask_{p}": dict(_SMALL, attention={"kernel": "dense", "token_mask": {"pattern": p}})
        for p in ("no_diagonal", "strided", "fixed", "longformer", "logsparse", "bigbird", "star")
    },
    "mask_bigbird_redrawn": dict(
        _SMALL, attention={"kernel": "dense", "token_mask": {"pattern": "bigbird", "seq_len": 48}}
    ),
    "mask_longformer_blockbert": dict(
        _SMALL,
        attention={
            "kernel": "block_gather",
            "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "2:2", "block": 16},
            "token_mask": {"pattern": "longformer", "seed": 4},
        },
    ),
    "mask_file": dict(
        _SMALL,
        attention={
            "kernel": "block_gather",
            "token_mask": {"pattern": "file", "path": "<set by the fixture>", "seq_len": 48, "block": 8},
        },
    ),
    "mask_file_per_layer": dict(
        _SMALL,
        attention={
            "kernel": "dense",
            "per_layer": [
                {"token_mask": {"pattern": "file", "path": "<set by the fixture>", "drop_diagonal": True}},
                {"token_mask": {"pattern": "star"}},
            ],
        },
    ),
    "modernbert_blockbert_global": dict(  # rotary, GeGLU, no biases, exact windows; BlockBERT on the global layers
        _SMALL,
        **MODERNBERT_LAYERS,
        position={"type": "rotary", "rope_theta": 1000.0, "rope_theta_local": 100.0},
        attention={
            "kernel": "block_gather",
            "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
            "global_every": 2,
            "local": {"sparsity": None, "token_mask": {"pattern": "sliding_window", "window": 9}},
        },
    ),
    "dam": dict(
        _SMALL,
        attention={"kernel": "dense", "token_mask": {"pattern": "dam", "seq_len": 48, "dam": {"structured": False}}},
    ),
    "dam_structured_per_layer": dict(
        _SMALL,
        attention={
            "kernel": "dense",
            "token_mask": {"pattern": "dam", "dam": {"structured": True, "share_layers": False}},
        },
    ),
}
ISSUE5 = [k for k in CUSTOM if k.startswith(("diet", "segment", "mask", "dam"))]


def _preset(name: str) -> ModelConfig:
    """A preset shrunk to test size, keeping its head count (head assignments depend on it) and its attention."""
    from model.presets import PRESETS

    heads = PRESETS[name].get("num_attention_heads", 12)
    return ModelConfig.preset(
        name,
        vocab_size=97,
        hidden_size=4 * heads,
        num_layers=2,
        num_attention_heads=heads,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )


def _all_presets() -> list[str]:
    from model.presets import PRESETS

    return sorted(PRESETS)


def _config(kw: dict) -> ModelConfig:
    return ModelConfig.from_dict(json.loads(json.dumps(kw)))


def _model(config: ModelConfig, seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    m = BertForPreTraining(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial LayerNorm/bias values so a wrong mapping cannot hide behind init constants
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return m


def _batch(vocab: int, B: int = 3, N: int = 40):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, vocab, (B, N), generator=g)
    mask = torch.ones(B, N, dtype=torch.long)
    mask[1, 29:] = 0
    mask[2, 9:] = 0
    ids[mask == 0] = 0
    tt = torch.zeros(B, N, dtype=torch.long)
    tt[:, 20:] = 1
    return ids, mask, tt


def _export(model: BertForPreTraining, out: Path, remote: str) -> dict:
    out.mkdir(parents=True)
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    return write_hf(sd, model.config, model.layout_state(), out, remote, remote_code.token_mask_state(model))


def _with_mask_file(kw: dict, path: Path, seed: int) -> dict:
    """Write a random mask file (as DAM's export would) and point every ``pattern: file`` of ``kw`` at it."""
    from model.attention.sparsebert import save_masks

    kw = json.loads(json.dumps(kw))
    g = torch.Generator().manual_seed(seed)
    heads, n = kw["num_attention_heads"], (kw["attention"].get("token_mask") or {}).get("seq_len") or 64
    save_masks(str(path), {f"layer{i}": torch.rand(heads, n, n, generator=g) < 0.4 for i in range(kw["num_layers"])})
    for e in [kw["attention"], *(kw["attention"].get("per_layer") or [])]:
        if (e.get("token_mask") or {}).get("pattern") == "file":
            e["token_mask"]["path"] = str(path)
    return kw


def _redraw_token_masks(model: BertForPreTraining, seed: int) -> None:
    """Give every masked layer a token mask the config would not draw (as if torch's RNG had changed), so the
    export is only right if it carries the stored mask."""
    import torch.nn.functional as F

    from model.attention.sparsebert import block_layout_from_mask

    g = torch.Generator().manual_seed(seed)
    for layer in model.bert.encoder.layers:
        core = layer.attention.core
        n, tm = core.max_seq_length, core.fixed_token_mask
        new = (torch.rand(tm.shape[0], n, n, generator=g) < 0.3) | torch.eye(n, dtype=torch.bool)
        p = tm.shape[-1] - n
        core.fixed_token_mask = F.pad(new, (0, p, 0, p), value=False)
        core.load_layout_state(block_layout_from_mask(core.fixed_token_mask, core.sparsity_config.block))


def _dam_alpha(model: BertForPreTraining, seed: int) -> None:
    """A 'learned' DAM alpha of both signs (the init is a constant 3.0, where every gate is ~1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.bert.dam.alpha.copy_(torch.randn(model.bert.dam.alpha.shape, generator=g) * 3)


# ------------------------------------------------------------------------------------------------ flattening
def test_rewrite_imports_makes_model_imports_relative():
    src = "from model.attention.kernels import KERNELS\n    from model.config import (\n  A,\n)\nimport torch\n"
    out = remote_code.rewrite_imports(src)
    assert out == (
        "from .ours_attention_kernels import KERNELS\n    from .ours_config import (\n  A,\n)\nimport torch\n"
    )


def test_closure_covers_model_code_and_nothing_else():
    mods = remote_code.module_closure()
    assert {
        "model.bert",
        "model.config",
        "model.attention.module",
        "model.attention.kernels",
        "model.attention.layouts",
    } <= set(mods)
    # DeepSpeed's compatibility API is not run by the exported model: neither its modules (wherever they live:
    # model/attention/ or model/attention/deepspeed/) nor its classes travel with the export
    compat = {
        "sparse_self_attention",
        "bert_sparse_self_attention",
        "sparse_attention_utils",
        "matmul",
        "softmax",
        "sparsity_config",
        "block_sparse_ops",
    }
    assert not [m for m in mods if m.split(".")[-1] in compat or ".deepspeed" in m]


def test_export_code_leaves_out_what_the_model_never_runs(tmp_path):
    files = remote_code.copy_model_code(tmp_path)
    text = "\n".join((tmp_path / f).read_text() for f in files)
    for name in ("class SparseSelfAttention", "class BertSparseSelfAttention", "class MatMul", "class Softmax"):
        assert name not in text
    assert "class BlockSparseAttention" in text and "class BertModel" in text
    # what remains is still our code, statement for statement: the copied module is the source minus whole
    # top-level statements (here: model/bert.py, whose BertForPreTraining the HF wrappers do not use)
    bert = (tmp_path / "ours_bert.py").read_text()
    assert "class BertForPreTraining" not in bert and "# Left out (the exported model never uses them)" in bert
    kept = [line for line in bert.splitlines() if not line.startswith("#")]
    source = (remote_code.REPO / "model" / "bert.py").read_text().splitlines()
    it = iter(remote_code.rewrite_imports("\n".join(source)).splitlines())
    assert all(any(line == s for s in it) for line in kept)  # an ordered subsequence of the source


def _write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_export_plan_rules(tmp_path):
    """The pruning rules on a made-up package: a definition nothing kept uses goes, and with it an import only it
    used and the module behind that import; registrations by decorator and imports done for their effects stay; a
    re-export of a module without effects goes."""
    _write_tree(
        tmp_path,
        {
            "model/__init__.py": "",
            "model/registry.py": "REG = {}\n\n\ndef register(f):\n    REG[f.__name__] = f\n    return f\n",
            "model/compat.py": "class Compat:\n    pass\n",
            "model/plugin.py": "from model.registry import register\n\n\n@register\ndef plugin():\n    return 1\n",
            "model/plain.py": "def plain():\n    return 2\n",
            "model/core.py": (
                '"""doc"""\n'
                "from dataclasses import dataclass\n"
                "import json\n"
                "from model.compat import Compat\n"
                "from model.plugin import plugin  # noqa: F401  (imported for its registration)\n"
                "from model.plain import plain  # noqa: F401  (a re-export)\n"
                "from model.registry import REG\n"
                "_TABLE = {'a': 1}\n"
                "\n\n@dataclass\nclass Helper:\n    x: int = 0\n"
                "\n\nclass Used:\n    def f(self):\n        return REG, _helper(), getattr(self, 'Helper', None)\n"
                "\n\ndef _helper():\n    return _TABLE\n"
                "\n\nclass Old(Compat):\n    def g(self):\n        return json.dumps({})\n"
            ),
        },
    )
    template = tmp_path / "template"
    _write_tree(template, {"modeling.py": "from .ours_core import Used\n"})
    plan = remote_code.plan_export(template, root=tmp_path)
    assert sorted(plan) == ["model.core", "model.plugin", "model.registry"]
    text, dropped = remote_code.pruned_source("model.core", plan["model.core"], root=tmp_path)
    assert dropped == ["json", "Compat", "plain", "Old"]
    for kept in ("class Used", "def _helper", "_TABLE =", "class Helper", "import plugin", "import REG", '"""doc"""'):
        assert kept in text
    template.joinpath("modeling.py").write_text("from .ours_core import Used, Old\n")
    assert sorted(remote_code.plan_export(template, root=tmp_path)) == [
        "model.compat",
        "model.core",
        "model.plugin",
        "model.registry",
    ]
    template.joinpath("modeling.py").write_text("from .ours_nothing import X\n")
    with pytest.raises(remote_code.ExportError, match="ours_nothing.*none of our modules"):
        remote_code.plan_export(template, root=tmp_path)


@pytest.mark.parametrize("name", [*CUSTOM, *(f"preset:{p}" for p in _all_presets())])
def test_export_reads_masks_and_checks_weights_without_a_model(name, tmp_path):
    """A checkpoint's export builds no model: the token masks come from the config (= those a built model applies,
    random patterns included) and the weights are checked against a meta-device skeleton (= a built model's names
    and shapes); a renamed or resized weight is named."""
    if name.startswith("preset:"):
        cfg = _preset(name.removeprefix("preset:"))
    else:
        kw = CUSTOM[name]
        cfg = _config(_with_mask_file(kw, tmp_path / "m.pt", seed=1) if name.startswith("mask_file") else kw)
    model = BertForPreTraining(cfg)
    want, got = remote_code.token_mask_state(model), remote_code.config_token_masks(cfg)
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
    sd = model.state_dict()
    assert remote_code.weight_problems(cfg, sd) == []
    first, last = next(iter(sd)), list(sd)[-1]
    bad = {**{k: v for k, v in sd.items() if k != first}, "bert.renamed": sd[first], last: sd[last][..., :1]}
    problems = remote_code.weight_problems(cfg, bad)
    assert f"missing {first}" in problems and "unexpected bert.renamed" in problems
    assert any(p.startswith(f"{last}: shape") for p in problems)


def test_exported_code_imports_only_torch_transformers_stdlib(tmp_path):
    files = remote_code.copy_model_code(tmp_path)
    assert "modeling_sparsebert.py" in files and "configuration_sparsebert.py" in files
    bad = tmp_path / "ours_bad.py"
    bad.write_text("import numpy as np\n")
    with pytest.raises(remote_code.ExportError, match="numpy"):
        remote_code._check_external_imports(bad)


def test_stock_bert_decision():
    assert stock_bert_reason(_config(_SMALL)) is None
    for name in ("fixed", "blockbert", "free_head_preln_mixed", "no_segments_relu"):
        cfg = _config(CUSTOM[name])
        assert stock_bert_reason(cfg) is not None, name


# ------------------------------------------------------------------------------------------------ stock BERT
def test_dense_export_is_stock_bert_with_logit_parity_and_exact_round_trip(tmp_path):
    from transformers import AutoModelForMaskedLM

    cfg = _config(_SMALL)
    ours = _model(cfg)
    info = _export(ours, tmp_path / "hf", "auto")
    assert not info["remote_code"]
    hf_cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_cfg["model_type"] == "bert" and "auto_map" not in hf_cfg
    assert not list((tmp_path / "hf").glob("*.py"))
    hf = AutoModelForMaskedLM.from_pretrained(tmp_path / "hf").eval()
    ids, mask, tt = _batch(cfg.vocab_size)
    with torch.no_grad():
        want = ours(ids, attention_mask=mask, token_type_ids=tt).logits
        got = hf(input_ids=ids, attention_mask=mask, token_type_ids=tt).logits
    assert (got - want).abs().max().item() <= TOL
    sd, back, layouts = read_hf(tmp_path / "hf")
    assert back.to_dict() == cfg.to_dict() and layouts is None
    ref = ours.state_dict()
    assert set(sd) == set(ref)
    for k in ref:
        assert torch.equal(sd[k], ref[k]), k


def test_custom_code_token_and_choice_heads_match_transformers_bert(tmp_path):
    """A dense model exported both ways: the custom code's AutoModelForTokenClassification and
    AutoModelForMultipleChoice (trust_remote_code) give transformers' BertForTokenClassification /
    BertForMultipleChoice logits when those carry the same head weights (fp32, <= 1e-4)."""
    from transformers import (
        AutoModelForMultipleChoice,
        AutoModelForTokenClassification,
        BertForMultipleChoice,
        BertForTokenClassification,
    )

    cfg = _config(_SMALL)
    ours = _model(cfg)
    assert _export(ours, tmp_path / "remote", "always")["remote_code"]
    assert not _export(ours, tmp_path / "stock", "never")["remote_code"]
    ids, mask, tt = _batch(cfg.vocab_size)
    inp = {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}

    tok_ours = AutoModelForTokenClassification.from_pretrained(
        tmp_path / "remote", num_labels=5, trust_remote_code=True
    )
    assert type(tok_ours).__name__ == "SparseBertForTokenClassification"
    tok_ref = BertForTokenClassification.from_pretrained(tmp_path / "stock", num_labels=5)
    tok_ref.classifier.load_state_dict(tok_ours.classifier.state_dict())
    with torch.no_grad():
        a, b = tok_ours.eval()(**inp).logits, tok_ref.eval()(**inp).logits
    assert a.shape == (3, 40, 5) and (a - b).abs().max().item() <= TOL

    two = {k: torch.stack([v, v.flip(0), v.roll(1, 0)], 1) for k, v in inp.items()}  # [3, 3 choices, 40]
    mc_ours = AutoModelForMultipleChoice.from_pretrained(tmp_path / "remote", trust_remote_code=True)
    assert type(mc_ours).__name__ == "SparseBertForMultipleChoice"
    mc_ref = BertForMultipleChoice.from_pretrained(tmp_path / "stock")
    mc_ref.bert.pooler.dense.load_state_dict(mc_ours.pooler.state_dict())
    mc_ref.classifier.load_state_dict(mc_ours.classifier.state_dict())
    labels = torch.tensor([0, 2, 1])
    with torch.no_grad():
        a, b = mc_ours.eval()(**two, labels=labels), mc_ref.eval()(**two, labels=labels)
    assert a.logits.shape == (3, 3) and (a.logits - b.logits).abs().max().item() <= TOL
    assert abs(a.loss.item() - b.loss.item()) <= TOL
    assert a.logits.std().item() > 1e-3  # the choices really differ: the parity is not between constants


def test_model_card_names_every_head_of_the_auto_map_and_blockbert_padding():
    from tools.hf_export.model_card import model_card

    for name, blockbert in (("blockbert", True), ("fixed", False)):
        card = model_card(_config(CUSTOM[name]).to_dict(), {}, "ck/iter_1", True, {})
        heads = [k for k in remote_code.AUTO_MAP if k not in ("AutoConfig", "AutoModelForPreTraining")]
        assert all(f"`{k}`" in card or f"{k}.from_pretrained" in card for k in heads), card
        assert ("pad fine-tuning inputs to" in card and "64 tokens" in card) is blockbert, name


def test_never_remote_refuses_sparse(tmp_path):
    cfg = _config(CUSTOM["blockbert"])
    with pytest.raises(ConversionError, match="stock BERT cannot express"):
        _export(_model(cfg), tmp_path / "x", "never")


def test_non_bert_hf_dir_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    from safetensors.torch import save_file

    save_file({"wte.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ConversionError, match="model_type 'gpt2'"):
        read_hf(tmp_path)
    with pytest.raises(ConversionError, match="no config.json"):
        read_hf(tmp_path / "nope")


# ------------------------------------------------------------------------------------------------ custom code
_LOADER = textwrap.dedent("""
    import importlib.util, json, sys
    from pathlib import Path
    import torch
    assert importlib.util.find_spec("model") is None, "our package is importable: the test would prove nothing"
    from transformers import (AutoModel, AutoModelForMaskedLM, AutoModelForMultipleChoice,
                              AutoModelForQuestionAnswering, AutoModelForSequenceClassification,
                              AutoModelForTokenClassification)
    AUTO = {"mlm": AutoModelForMaskedLM, "base": AutoModel, "cls": AutoModelForSequenceClassification,
            "qa": AutoModelForQuestionAnswering, "tok": AutoModelForTokenClassification,
            "mc": AutoModelForMultipleChoice}
    root, names, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    first = None  # (directory, its code, its auto_map): the first custom-code export, loaded through the Auto classes
    shared = {}  # the classes the Auto classes gave for it

    def code(d):
        return {p.name: p.read_bytes() for p in Path(d).glob("*.py")}

    def loader(d):  # kind -> its from_pretrained for export d
        # mode 'auto': every export through the Auto classes (HF copies each directory's code and executes it under
        # a module name of its own, ~2 s a directory); 'shared': the first custom-code export through the Auto
        # classes, the others through the classes those gave, once their code is the same bytes and their auto_map
        # the same map (so those are the classes the Auto classes would load for them)
        global first
        cfg = json.loads(Path(d, "config.json").read_text())
        if "auto_map" in cfg and first is not None and mode == "shared":
            assert code(d) == first[1], f"{d}: exported code differs from {first[0]}'s"
            assert cfg["auto_map"] == first[2], f"{d}: auto_map differs from {first[0]}'s"
            return {k: shared[k].from_pretrained for k in AUTO}
        if "auto_map" in cfg and first is None:
            first = (d, code(d), cfg["auto_map"])

        def auto(kind):
            def load(path, **kw):
                m = AUTO[kind].from_pretrained(path, trust_remote_code=True, **kw)
                if first is not None and path == first[0]:
                    shared[kind] = type(m)
                return m
            return load
        return {k: auto(k) for k in AUTO}

    for name in names:
        d = f"{root}/{name}"
        inp = torch.load(f"{root}/{name}_inputs.pt")
        load = loader(d)
        m = load["mlm"](d).eval()
        out = {}
        with torch.no_grad():
            out["logits"] = m(**inp).logits
        if name.startswith("preset_"):
            torch.save(out, f"{root}/{name}_got.pt")
            continue
        with torch.no_grad():
            out["hidden"] = load["base"](d).eval()(**inp).last_hidden_state
            sc = load["cls"](d, num_labels=3).eval()
            out["cls_shape"] = list(sc(**inp).logits.shape)
            qa = load["qa"](d).eval()
            out["qa_shape"] = list(qa(**inp).start_logits.shape)
            out["tok_shape"] = list(load["tok"](d, num_labels=5).eval()(**inp).logits.shape)
            two = {k: torch.stack([v, v.flip(0)], 1) for k, v in inp.items()}  # [3, 2 choices, 40]
            out["mc_shape"] = list(load["mc"](d).eval()(**two).logits.shape)
        if name.startswith("mask_file"):  # re-saved by HF (as fine-tuning does): no mask file, same model
            m.save_pretrained(f"{root}/{name}_resaved")
            again = loader(f"{root}/{name}_resaved")["mlm"](f"{root}/{name}_resaved").eval()
            with torch.no_grad():
                out["resaved_logits"] = again(**inp).logits
        out["layouts"] = {k: v for k, v in m.state_dict().items() if "sparse_layouts" in k}
        out["token_masks"] = {k: v for k, v in m.state_dict().items() if "token_masks" in k}
        out["module_file"] = sys.modules[type(m).__module__].__file__
        torch.save(out, f"{root}/{name}_got.pt")
""")


@pytest.fixture(
    scope="module",
    params=[
        "shared",
        # ~90 s on the 2-core box: every export's code executed by HF under its own module name; the default tier
        # loads one that way and the others (the same code, checked byte for byte) through its classes
        pytest.param("auto", marks=pytest.mark.extended),
    ],
)
def custom_exports(request, tmp_path_factory):
    """Every custom family and every preset exported, then loaded in a process that cannot import our package.
    The exported code is the same for every model (only config.json and the weights differ): ``shared`` loads the
    first custom-code export through the Auto classes and the others through the classes that gave, ``auto`` each
    through the Auto classes."""
    root = tmp_path_factory.mktemp("exports")
    models = {}
    masks_dir = root / "training_machine"  # removed after export: the export must not need it
    masks_dir.mkdir()
    for name, kw in CUSTOM.items():
        if name.startswith("mask_file"):
            kw = _with_mask_file(kw, masks_dir / f"{name}.pt", seed=len(models))
        cfg = _config(kw)
        m = _model(cfg, seed=len(models))
        if name == "mask_bigbird_redrawn":
            _redraw_token_masks(m, seed=7)
        if name.startswith("dam"):
            _dam_alpha(m, seed=len(models))
        if name == "bigbird_random":  # the trained layout differs from what the config would draw: must be stored
            other = BertForPreTraining(
                _config(
                    {**kw, "attention": {**kw["attention"], "sparsity": {**kw["attention"]["sparsity"], "seed": 11}}}
                )
            )
            assert any(not torch.equal(a, b) for a, b in zip(m.layout_state().values(), other.layout_state().values()))
            m.load_layout_state(other.layout_state())
        info = _export(m, root / name, "always" if name == "dense_remote" else "auto")
        assert info["remote_code"]
        ids, mask, tt = _batch(cfg.vocab_size)
        torch.save({"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}, root / f"{name}_inputs.pt")
        models[name] = m
    import shutil

    shutil.rmtree(masks_dir)
    for preset in _all_presets():  # every named preset (DIET / SparseBERT presets join automatically)
        name = f"preset_{preset}"
        cfg = _preset(preset)
        m = _model(cfg, seed=len(models))
        _export(m, root / name, "auto")
        ids, mask, tt = _batch(cfg.vocab_size)
        torch.save({"input_ids": ids, "attention_mask": mask, "token_type_ids": tt}, root / f"{name}_inputs.pt")
        models[name] = m
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(root / "hf_modules"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-I", "-c", _LOADER, str(root), json.dumps(list(models)), request.param],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-4000:]
    return root, models


@pytest.mark.parametrize("name", list(CUSTOM))
def test_custom_code_logits_match_ours(custom_exports, name):
    root, models = custom_exports
    m = models[name]
    inp = torch.load(root / f"{name}_inputs.pt")
    got = torch.load(root / f"{name}_got.pt")
    with torch.no_grad():
        want = m(inp["input_ids"], attention_mask=inp["attention_mask"], token_type_ids=inp["token_type_ids"]).logits
        hidden = m.bert(inp["input_ids"], inp["attention_mask"], inp["token_type_ids"])
    assert (got["logits"] - want).abs().max().item() <= TOL
    assert (got["hidden"] - hidden).abs().max().item() <= TOL
    assert got["cls_shape"] == [3, 3] and got["qa_shape"] == [3, 40]
    assert got["tok_shape"] == [3, 40, 5] and got["mc_shape"] == [3, 2]
    assert "hf_modules" in got["module_file"]  # loaded from the export's own code, not from the repository
    for layer, lay in m.layout_state().items():
        key = f"sparsebert.{remote_code.LAYOUT_PREFIX}{layer}"
        if lay is None:
            assert key not in got["layouts"]
        else:
            assert torch.equal(got["layouts"][key], lay), layer
    masks = remote_code.token_mask_state(m)
    assert set(got["token_masks"]) == {f"sparsebert.{remote_code.TOKEN_MASK_PREFIX}{k}" for k in masks}
    for layer, tm in masks.items():
        assert torch.equal(got["token_masks"][f"sparsebert.{remote_code.TOKEN_MASK_PREFIX}{layer}"], tm), layer


def test_issue5_families_need_custom_code_and_masks_change_the_logits(custom_exports):
    """Each family goes through custom code, and each mask really acts (the same weights without the mask give
    other logits), so the parity above cannot pass with a mask the export dropped."""
    root, models = custom_exports
    for name in ISSUE5:
        m = models[name]
        assert stock_bert_reason(m.config) is not None, name
        if not name.startswith(("mask", "dam")):
            continue
        d = m.config.to_dict()
        d["attention"] = {"kernel": "dense"}
        plain = BertForPreTraining(ModelConfig.from_dict(d)).eval()
        plain.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("bert.dam.")})
        inp = torch.load(root / f"{name}_inputs.pt")
        with torch.no_grad():
            a = m(inp["input_ids"], attention_mask=inp["attention_mask"], token_type_ids=inp["token_type_ids"]).logits
            b = plain(
                inp["input_ids"], attention_mask=inp["attention_mask"], token_type_ids=inp["token_type_ids"]
            ).logits
        assert (a - b).abs().max().item() > 1e-3, name


def test_file_masks_travel_inside_the_export(custom_exports, tmp_path):
    root, models = custom_exports
    for name in ("mask_file", "mask_file_per_layer"):
        text = (root / name / "config.json").read_text()
        assert "training_machine" not in text and str(root) not in text  # no path of the training machine
        cfg = json.loads(text)["sparse_bert"]["attention"]
        paths = [
            e["token_mask"]["path"]
            for e in [cfg, *(cfg.get("per_layer") or [])]
            if (e.get("token_mask") or {}).get("pattern") == "file"
        ]
        assert paths and all(not Path(p).is_absolute() and (root / name / p).is_file() for p in paths)
        got = torch.load(root / f"{name}_got.pt")
        assert torch.equal(got["resaved_logits"], got["logits"])  # HF's save_pretrained keeps the stored masks
        assert not list((root / f"{name}_resaved").glob("token_masks*.pt"))
        info = hf_to_ds(str(root / f"{name}_resaved"), str(tmp_path / name))  # and so does the way back
        state = torch.load(tmp_path / name / info["tag"] / "mp_rank_00_model_states.pt", weights_only=False)
        back = BertForPreTraining(ModelConfig.from_dict(state["model_config"]))
        want, have = remote_code.token_mask_state(models[name]), remote_code.token_mask_state(back)
        assert want.keys() == have.keys() and all(torch.equal(want[k], have[k]) for k in want)


@pytest.mark.parametrize("preset", _all_presets())
def test_every_preset_exports_with_logit_parity(custom_exports, preset):
    root, models = custom_exports
    name = f"preset_{preset}"
    m = models[name]
    inp = torch.load(root / f"{name}_inputs.pt")
    with torch.no_grad():
        want = m(inp["input_ids"], attention_mask=inp["attention_mask"], token_type_ids=inp["token_type_ids"]).logits
    got = torch.load(root / f"{name}_got.pt")["logits"]
    assert (got - want).abs().max().item() <= TOL
    model_type = json.loads((root / name / "config.json").read_text())["model_type"]
    assert model_type == (stock_export(m.config)[0] or remote_code.MODEL_TYPE)


def _without_mask_paths(d: dict) -> dict:
    d = json.loads(json.dumps(d))
    for e in [d["attention"], *(d["attention"].get("per_layer") or [])]:
        if (e.get("token_mask") or {}).get("pattern") == "file":
            e["token_mask"].pop("path")
    return d


@pytest.mark.parametrize(
    "name",
    ["blockbert", "bigbird_random", "free_head_preln_mixed", *[n for n in ISSUE5 if n != "mask_bigbird_redrawn"]],
)
def test_custom_code_round_trip_keeps_every_tensor(custom_exports, name):
    """ours -> HF -> ours: every weight, layout and token mask equal; the rebuilt model gives the same logits."""
    root, models = custom_exports
    m = models[name]
    sd, cfg, layouts = read_hf(root / name)
    assert _without_mask_paths(cfg.to_dict()) == _without_mask_paths(m.config.to_dict())
    ref = m.state_dict()
    assert set(sd) == set(ref)
    for k in ref:
        assert torch.equal(sd[k], ref[k]), k
    for layer, lay in m.layout_state().items():
        if lay is not None:
            assert torch.equal(layouts[layer], lay)
    back = BertForPreTraining(cfg).eval()  # file masks now come from the export's own mask file
    back.load_state_dict(sd, strict=True)
    if layouts:
        back.load_layout_state({k: layouts.get(k) for k in m.layout_state()})
    want, got = remote_code.token_mask_state(m), remote_code.token_mask_state(back)
    assert set(want) == set(got) and all(torch.equal(want[k], got[k]) for k in want)
    assert {k: v for k, v in read_hf_token_masks(root / name).items()}.keys() == want.keys()
    inp = torch.load(root / f"{name}_inputs.pt")
    with torch.no_grad():
        a = m(inp["input_ids"], attention_mask=inp["attention_mask"], token_type_ids=inp["token_type_ids"]).logits
        b = back(inp["input_ids"], attention_mask=inp["attention_mask"], token_type_ids=inp["token_type_ids"]).logits
    assert torch.equal(a, b)


def test_sentencepiece_unigram_tokenizer_exports_with_identical_ids(tmp_path):
    """The trainer's SentencePiece tokenizer and the exported HF fast tokenizer give the same ids."""
    import argparse

    from transformers import AutoTokenizer

    from data_pipeline.tokenization import build_tokenizer
    from data_pipeline.train_tokenizer import TrainTokenizerConfig, train_sentencepiece
    from tools.hf_export.export import _save_tokenizer

    data = Path(__file__).resolve().parents[1] / "run_scripts" / "finetune_data"
    texts = [
        v
        for f in sorted(data.glob("*.jsonl"))
        for line in f.read_text().splitlines()
        for v in json.loads(line).values()
        if isinstance(v, str)
    ]
    cfg = TrainTokenizerConfig(input=[str(data)], output_dir=str(tmp_path), model_type="unigram", vocab_size=300)
    model, _ = train_sentencepiece(cfg, iter(texts), str(tmp_path))
    assert model == str(tmp_path / "spm.model")
    args = {"data": {"tokenizer_type": "SentencePieceTokenizer", "tokenizer_model": str(tmp_path / "spm.model")}}
    out = tmp_path / "hf"
    out.mkdir()
    files = _save_tokenizer(out, args, argparse.Namespace(), 64)
    assert "tokenizer.json" in files and "spm.model" in files
    ours = build_tokenizer("SentencePieceTokenizer", tokenizer_model=str(tmp_path / "spm.model"))
    hf = AutoTokenizer.from_pretrained(out)
    probe = texts + ["Café naïve — “quoted” 123,456.78  double  space", "UNSEEN Zebras ½"]
    assert hf(probe, add_special_tokens=False)["input_ids"] == ours.encode_batch(probe)
    pair = hf("a b", "c d")
    a, b = ours.encode("a b"), ours.encode("c d")
    assert pair["input_ids"] == [ours.cls_id, *a, ours.sep_id, *b, ours.sep_id]
    assert pair["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert (hf.mask_token_id, hf.pad_token_id) == (ours.mask_id, ours.pad_id)
