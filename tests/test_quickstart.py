"""The quickstart's last step (tools.fill_mask) against the model computed by hand; the script's own wiring."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
WORDS = ["the", "river", "ran", "high", "and", "brown", "it", "was", "miles", "to", "town", "."]


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    out = tmp_path_factory.mktemp("hf")
    vocab = out / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tok = BertTokenizerFast(vocab=str(vocab), do_lower_case=True)  # transformers 5 ignores vocab_file=
    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=32,
        )
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)
    assert len(tok) == 5 + len(WORDS)  # the vocabulary really loaded (else --expect would pass trivially)
    return out


def test_fill_mask_matches_the_model_softmax(tiny_hf: Path) -> None:
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from tools.fill_mask import fill_mask

    sentence = "it was 12 [MASK] to town."
    (preds,) = fill_mask(str(tiny_hf), [sentence], top_k=3)
    tok = AutoTokenizer.from_pretrained(tiny_hf)
    model = AutoModelForMaskedLM.from_pretrained(tiny_hf).eval()
    enc = tok(sentence, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits[0, enc.input_ids[0].tolist().index(tok.mask_token_id)]
    probs, ids = logits.softmax(-1).topk(3)
    assert [t for t, _ in preds] == [tok.decode([i]) for i in ids.tolist()]
    assert [p for _, p in preds] == pytest.approx(probs.tolist(), abs=1e-5)


def test_fill_mask_cli_expect_and_errors(tiny_hf: Path, capsys) -> None:
    from tools.fill_mask import main

    (preds,) = __import__("tools.fill_mask", fromlist=["x"]).fill_mask(str(tiny_hf), ["the river [MASK] high."], 2)
    top = preds[0][0]
    assert main(["--model", str(tiny_hf), "--top-k", "2", "--expect", top, "the river [MASK] high."]) == 0
    missing = next(w for w in WORDS if w not in [t for t, _ in preds])
    assert main(["--model", str(tiny_hf), "--top-k", "2", "--expect", missing, "the river [MASK] high."]) == 1
    assert (
        main(["--model", str(tiny_hf), "--top-k", "2", "--no-fail", "--expect", missing, "the river [MASK] high."]) == 0
    )
    with pytest.raises(SystemExit):
        main(["--model", str(tiny_hf), "no mask here"])
    assert "exactly one [MASK]" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", str(tiny_hf / "nope"), "a [MASK]."])
    assert "no config.json" in capsys.readouterr().err


def test_quickstart_script_steps_use_real_entry_points() -> None:
    """Every `python -m` module and repo path the quickstart runs exists (running it all is the main job, not a
    test)."""
    text = (REPO / "run_scripts" / "quickstart.sh").read_text()
    modules = re.findall(r"\$PY -m ([\w.]+)", text)
    assert {
        "data_pipeline.train_tokenizer",
        "data_pipeline.preprocess",
        "tools.convert_checkpoint",
        "tools.fill_mask",
    } <= set(modules)
    for mod in modules:
        assert (REPO / (mod.replace(".", "/") + ".py")).exists(), mod
    for path in re.findall(r"(?:pretrain|ds_configs|run_scripts)/[\w./-]+\.(?:py|json|sh)", text):
        assert (REPO / path).exists(), path
