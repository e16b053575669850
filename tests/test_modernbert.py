"""The ModernBERT recipe's model parts (issue 27): the presets' sizes and layer cadence, GeGLU, pre-LN without biases,
the cadence config (global every k-th layer, any layout standing in for the local or the global one) and its
checks, and every CPU kernel computing the same model output as the dense reference (window layers included)."""

from __future__ import annotations

import json

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.presets import PRESETS
from tests.registry_cases import OTHER_KERNELS, REFERENCE


def _tiny(**overrides) -> ModelConfig:
    return ModelConfig.preset("modernbert-tiny", vocab_size=97, **overrides)


def _inputs(B: int = 2, N: int = 70, vocab: int = 97):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (B, N), generator=g)
    am = torch.ones(B, N, dtype=torch.long)
    am[1, 45:] = 0
    ids[1, 45:] = 0
    return ids, am


def test_modernbert_base_sizes_and_cadence():
    c = ModelConfig.preset("modernbert-base")
    assert (c.hidden_size, c.num_layers, c.num_attention_heads, c.intermediate_size) == (768, 22, 12, 1152)
    assert c.ffn_type == "glu" and c.hidden_act == "gelu" and c.pre_layer_norm and not c.first_attn_norm
    assert not c.linear_bias and not c.norm_bias and c.type_vocab_size == 0 and c.layer_norm_eps == 1e-5
    assert (c.position.type, c.position.rope_theta, c.position.rope_theta_local) == ("rotary", 160000.0, 10000.0)
    glob = [i for i in range(c.num_layers) if c.attention.is_global(i)]
    assert glob == [i for i in range(22) if i % 3 == 0]
    for i in range(c.num_layers):
        tm = c.attention.token_mask_for_layer(i)
        assert c.attention.for_layer(i, 12)[1] is None
        assert (tm is None) == (i % 3 == 0), i
        if tm is not None:
            assert tm.pattern == "sliding_window" and tm.params.window == 128
    assert "modernbert-tiny" in PRESETS
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):  # transformers' default ModernBertConfig is ModernBERT-base (vocabulary 50368)
        m = BertForPreTraining(ModelConfig.preset("modernbert-base", vocab_size=50368))
        hf = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig())
    assert sum(p.numel() for p in m.parameters()) == sum(p.numel() for p in hf.parameters())


def test_structure_glu_no_biases_first_norm():
    m = BertForPreTraining(_tiny())
    names = set(m.state_dict())
    assert not any(n.endswith(".bias") for n in names if n != "cls.bias"), sorted(n for n in names if "bias" in n)
    assert "bert.encoder.layers.0.attn_layer_norm.weight" not in names
    assert "bert.encoder.layers.1.attn_layer_norm.weight" in names
    assert "bert.encoder.final_layer_norm.weight" in names
    assert not any("position_embeddings" in n or "token_type" in n for n in names)
    layer = m.bert.encoder.layers[1]
    assert layer.ffn_in.weight.shape == (2 * 96, 64) and layer.ffn_out.weight.shape == (64, 96)
    x = torch.randn(2, 5, 64)
    a, g = layer.ffn_in(x).chunk(2, -1)
    torch.testing.assert_close(layer.ffn(x), layer.ffn_out(torch.nn.functional.gelu(a) * g))
    # the BERT defaults are unchanged: biases everywhere, standard feed-forward
    b = BertForPreTraining(ModelConfig.preset("tiny"))
    assert "bert.encoder.layers.0.ffn_in.bias" in b.state_dict() and b.bert.encoder.layers[0].ffn_in.out_features == 128


def test_config_roundtrip_and_checks():
    c = _tiny()
    assert ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    local = {"token_mask": {"pattern": "sliding_window", "window": 16}}
    with pytest.raises(ValueError, match="needs attention.local"):
        _tiny(attention={"global_every": 3})
    with pytest.raises(ValueError, match="only with attention.global_every"):
        _tiny(attention={"local": local})
    with pytest.raises(ValueError, match="either attention.per_layer or attention.global_every"):
        _tiny(attention={"global_every": 2, "local": local, "per_layer": [{}] * 4})
    with pytest.raises(ValueError, match="positive integer"):
        _tiny(attention={"global_every": 0, "local": local})
    with pytest.raises(ValueError, match="attention.local"):
        _tiny(attention={"global_every": 2, "local": {"sparsity": {"mode": "nope"}}})
    with pytest.raises(ValueError, match="'file' mask"):
        _tiny(attention={"global_every": 2, "local": {"token_mask": {"pattern": "file", "path": "m.pt"}}})
    with pytest.raises(ValueError, match="cannot be combined"):
        _tiny(attention={"global_every": 2, "local": local, "token_mask": {"pattern": "dam"}})
    with pytest.raises(ValueError, match="ffn_type"):
        _tiny(ffn_type="swiglu")
    with pytest.raises(ValueError, match="needs pre_layer_norm"):
        _tiny(pre_layer_norm=False)
    with pytest.raises(ValueError, match="window must be >= 0"):
        _tiny(attention={"global_every": 2, "local": {"token_mask": {"pattern": "sliding_window", "window": -1}}})
    with pytest.raises(ValueError, match="even head size"):
        _tiny(head_size=15)


def test_any_layout_stands_in_for_local_or_global():
    """BlockBERT on the global layers, a block 'local' layout on the local ones; per-layer rotary bases."""
    c = _tiny(
        attention={
            "kernel": "block_gather",
            "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
            "global_every": 3,
            "local": {"sparsity": {"mode": "local", "num_sliding_window_blocks": 3, "attention": "bidirectional"}},
        }
    )
    modes = [type(c.attention.for_layer(i, 4)[1]).__name__ for i in range(4)]
    assert modes == [
        "BlockBERTSparsityConfig",
        "LocalSlidingWindowSparsityConfig",
        "LocalSlidingWindowSparsityConfig",
        "BlockBERTSparsityConfig",
    ]
    m = BertForPreTraining(c).eval()
    assert [layer.attention.rope_theta for layer in m.bert.encoder.layers] == [160000.0, 10000.0, 10000.0, 160000.0]
    ids, am = _inputs()
    with torch.no_grad():
        assert torch.isfinite(m(ids, am).logits).all()


@pytest.mark.parametrize("kernel", OTHER_KERNELS)
def test_every_kernel_matches_dense_on_the_model(kernel):
    """The whole tiny model (exact windows on the local layers, padding) with each kernel vs the dense reference."""
    torch.manual_seed(0)
    ref_model = BertForPreTraining(_tiny(attention={**PRESETS["modernbert-tiny"]["attention"], "kernel": REFERENCE}))
    other = BertForPreTraining(_tiny(attention={**PRESETS["modernbert-tiny"]["attention"], "kernel": kernel}))
    other.load_state_dict(ref_model.state_dict())
    ids, am = _inputs()
    with torch.no_grad():
        want = ref_model.eval()(ids, am).logits
        got = other.eval()(ids, am).logits
    valid = am.bool()
    torch.testing.assert_close(got[valid], want[valid], atol=1e-4, rtol=1e-4)


# -- export to stock transformers.ModernBertForMaskedLM -----------------------------------------------------------
EXPORTS = {  # name -> overrides of modernbert-tiny; each must export to stock ModernBERT
    "preset": {},
    "odd_window_every2_biases_tanh": dict(
        linear_bias=True,
        norm_bias=True,
        hidden_act="gelu_tanh",
        position={"type": "rotary", "rope_theta": 5000.0, "rope_theta_local": 300.0},
        attention={"global_every": 2, "local": {"token_mask": {"pattern": "sliding_window", "window": 17}}},
    ),
    "all_global": dict(attention={"kernel": "block_gather"}),
}


def _random_model(config: ModelConfig, seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    m = BertForPreTraining(config).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # non-trivial norms and biases, so a wrong mapping cannot hide behind init constants
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return m


def _export(m: BertForPreTraining, out, remote: str = "auto") -> dict:
    from tools.hf_export import remote_code
    from tools.hf_export.export import write_hf

    out.mkdir(parents=True)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    return write_hf(sd, m.config, m.layout_state(), out, remote, remote_code.token_mask_state(m))


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_export_to_stock_modernbert_logits_match(name, tmp_path):
    """Ours (dense reference kernel) vs the exported stock model (eager and SDPA attention) on a padded batch."""
    transformers = pytest.importorskip("transformers")
    from tools.hf_export.stock_bert import stock_export

    cfg = _tiny(**EXPORTS[name])
    assert stock_export(cfg) == ("modernbert", None)
    m = _random_model(cfg)
    info = _export(m, tmp_path / "hf")
    assert info == {"remote_code": False, "reason": None, "architecture": "ModernBertForMaskedLM"}
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]  # no code
    ids, am = _inputs(N=80)
    with torch.no_grad():
        want = m(ids, am).logits
    valid = am.bool()
    for impl in ("eager", "sdpa"):
        hf, loading = transformers.AutoModelForMaskedLM.from_pretrained(
            tmp_path / "hf", attn_implementation=impl, output_loading_info=True
        )
        assert type(hf) is transformers.ModernBertForMaskedLM
        assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
        with torch.no_grad():
            got = hf.eval()(input_ids=ids, attention_mask=am).logits
        torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=1e-5, msg=lambda s: f"{impl}: {s}")


def test_window_matters_and_roundtrips_through_from_hf(tmp_path):
    """The window really acts (a wider one changes the logits), and --from-hf restores our model exactly: from our
    export (full config kept) and from a plain ModernBERT directory (no ``sparse_bert`` entry)."""
    transformers = pytest.importorskip("transformers")
    from tools.hf_export.warm_start import read_hf

    m = _random_model(_tiny())
    _export(m, tmp_path / "ours")
    ids, am = _inputs(N=80)
    valid = am.bool()
    with torch.no_grad():
        want = m(ids, am).logits
    wide = BertForPreTraining(
        _tiny(attention={"global_every": 3, "local": {"token_mask": {"pattern": "sliding_window", "window": 64}}})
    ).eval()
    wide.load_state_dict(m.state_dict())
    with torch.no_grad():
        assert (wide(ids, am).logits[valid] - want[valid]).abs().max() > 1e-3
    sd, cfg, layouts = read_hf(tmp_path / "ours")
    assert cfg == m.config and layouts is None
    assert sd.keys() == m.state_dict().keys() and all(torch.equal(sd[k], v) for k, v in m.state_dict().items())
    # a plain ModernBERT directory, as transformers writes it
    hf = transformers.AutoModelForMaskedLM.from_pretrained(tmp_path / "ours")
    hf.config.sparse_bert = None
    hf.save_pretrained(tmp_path / "plain")
    sd2, cfg2, _ = read_hf(tmp_path / "plain")
    assert cfg2.attention.global_every == 3 and cfg2.attention.token_mask_for_layer(1).params.window == 32
    back = BertForPreTraining(cfg2).eval()
    back.load_state_dict(sd2)
    with torch.no_grad():
        torch.testing.assert_close(back(ids, am).logits[valid], want[valid], atol=1e-5, rtol=1e-5)


REMOTE = {  # combinations stock ModernBERT cannot express: the reason names what is missing
    "blockbert_global": (
        dict(
            attention={
                "kernel": "block_gather",
                "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
                "global_every": 3,
                "local": {"token_mask": {"pattern": "sliding_window", "window": 32}, "sparsity": None},
            }
        ),
        "global layer with layout 'blockbert'",
    ),
    "block_local_layout": (
        dict(
            attention={
                "global_every": 3,
                "local": {"sparsity": {"mode": "local", "num_sliding_window_blocks": 3, "attention": "bidirectional"}},
            }
        ),
        "block layout 'local'",
    ),
    "diet_rel": (dict(position={"type": "diet_rel", "max_distance": 8}), "rotary positions"),
    "segments": (dict(type_vocab_size=2), "segment"),
    "first_attn_norm": (dict(first_attn_norm=True), "layer 0"),
    "standard_ffn": (dict(ffn_type="standard"), "GLU"),
    "two_windows": (
        dict(attention={"per_layer": [{}, {"token_mask": {"pattern": "sliding_window", "window": 8}}, {}, {}]}),
        "global layer with token mask 'sliding_window'",
    ),
}


@pytest.mark.parametrize("name", sorted(REMOTE))
def test_inexpressible_combinations_keep_remote_code(name, tmp_path):
    from tools.hf_export.stock_bert import stock_export

    overrides, why = REMOTE[name]
    cfg = _tiny(**overrides)
    stock, reason = stock_export(cfg)
    assert stock is None and why in reason, reason
    info = _export(_random_model(cfg), tmp_path / "hf")
    assert info["remote_code"] and info["reason"] == reason
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "sparsebert"
