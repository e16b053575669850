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
        "tools.quickstart_summary",
    } <= set(modules)
    for mod in modules:
        assert (REPO / (mod.replace(".", "/") + ".py")).exists(), mod
    for path in re.findall(r"(?:pretrain|ds_configs|run_scripts)/[\w./-]+\.(?:py|json|sh)", text):
        assert (REPO / path).exists(), path


def test_mlm_scores_against_hand_computed_values() -> None:
    """tools.mlm_scores: the model's loss is torch's cross-entropy, top-k as torch.topk; the unigram baseline's
    numbers worked out by hand."""
    import math

    import numpy as np

    from tools.mlm_scores import model_scores, unigram_distribution, unigram_scores

    logits = np.array(
        [[0, math.log(3), 0, -9, -9, -9], [math.log(2), 0, math.log(2), -9, -9, -9], [5, 4, 3, 2, 1, 0]],
        dtype=np.float32,
    )
    labels = np.array([1, 1, 5])
    got = model_scores(logits, labels)
    # row 1: p(label) = 3 / (5 + 3e^-9) (top-1 hit); row 2: 1 / (5 + ...) (third: top-5 hit); row 3: ranked sixth
    z = 3 * math.exp(-9)
    row3 = -(0 - math.log(sum(math.exp(x) for x in range(6))))
    expected = (-math.log(3 / (5 + z)) - math.log(1 / (5 + z)) + row3) / 3
    assert got["loss"] == pytest.approx(expected, rel=1e-6)
    ref = torch.nn.functional.cross_entropy(torch.from_numpy(logits).double(), torch.from_numpy(labels))
    assert got["loss"] == pytest.approx(float(ref), rel=1e-6) and got["perplexity"] == pytest.approx(math.exp(expected))
    top5 = torch.from_numpy(logits).topk(5).indices
    assert got["top1_accuracy"] == pytest.approx(1 / 3) and got["top5_accuracy"] == pytest.approx(2 / 3)
    assert got["top5_accuracy"] == pytest.approx(
        float((top5 == torch.from_numpy(labels)[:, None]).any(1).double().mean())
    )

    # tokens [0, 0, 1] over a vocabulary of 3, add-one: counts 3, 2, 1 of 6; a second array [2] weighted 1:1
    p = unigram_distribution([np.array([0, 0, 1])], [1.0], 3)
    assert p.tolist() == pytest.approx([1 / 2, 1 / 3, 1 / 6])
    blended = unigram_distribution([np.array([0, 0, 1]), np.array([2])], [1.0, 1.0], 3)
    assert blended.tolist() == pytest.approx([(1 / 2 + 1 / 4) / 2, (1 / 3 + 1 / 4) / 2, (1 / 6 + 1 / 2) / 2])
    u = unigram_scores(p, np.array([0, 2, 0, 1]))
    assert u["loss"] == pytest.approx(-(2 * math.log(1 / 2) + math.log(1 / 6) + math.log(1 / 3)) / 4)
    assert (u["top1_accuracy"], u["top5_accuracy"], u["tokens"]) == (0.5, 1.0, 4)


def _tiny_shard(tmp_path: Path, docs: list[list[str]], vocab: list[str]) -> str:
    from data_pipeline.indexed import IndexedDatasetBuilder

    prefix = str(tmp_path / "shard_text_sentence")
    b = IndexedDatasetBuilder(prefix)
    for doc in docs:
        b.add_document([[vocab.index(w) for w in sentence.split()] for sentence in doc])
    b.finalize()
    return prefix


def test_quickstart_summary_scores_the_held_out_documents(tiny_hf: Path, tmp_path: Path, capsys) -> None:
    """The summary's model loss is the HF model's own MLM loss on the same masked held-out windows; the unigram
    baseline counts the training documents only; the last screen shows both and what a real run needs."""
    import numpy as np

    from common.errors import UserError
    from tools import quickstart_summary as qs

    vocab = (tiny_hf / "vocab.txt").read_text().split()
    train = [["the river ran high and brown .", "it was miles to town ."]] * 9
    held_out = [["town town town was high .", "the river was brown and high ."]]
    prefix = _tiny_shard(tmp_path, train + held_out, vocab)
    # split 9,1,0 of 10 documents: documents 0-8 train, 9 is held out
    result = qs.summarize(str(tiny_hf), prefix, split="9,1,0", seq_length=8, mask_prob=0.5, max_tokens=5, seed=3)
    w = result["windows"]
    assert result["validation_documents"] == 1 and len(w.labels_M) == 5
    assert w.input_ids_BN.shape[1] == 8 and (w.input_ids_BN[:, 0] == vocab.index("[CLS]")).all()
    held_ids = [vocab.index(t) for s in held_out[0] for t in s.split()]
    assert set(w.labels_M.tolist()) <= set(held_ids)

    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(tiny_hf).eval()
    labels_BN = np.full(w.input_ids_BN.shape, -100)
    labels_BN[w.positions[:, 0], w.positions[:, 1]] = w.labels_M
    with torch.no_grad():
        ref = model(
            input_ids=torch.from_numpy(w.input_ids_BN),
            attention_mask=torch.from_numpy(w.attention_mask_BN),
            labels=torch.from_numpy(labels_BN),
        ).loss
    assert result["model"]["loss"] == pytest.approx(float(ref), rel=1e-5)
    # unigram top-1: the most frequent training token is "." (2 per document) -- never "town" of the held-out text
    train_ids = [vocab.index(t) for s in train[0] for t in s.split()]
    most = max(set(train_ids), key=lambda t: (train_ids.count(t), -t))
    assert result["unigram"]["top1_accuracy"] == pytest.approx(float(np.mean(w.labels_M == most)))

    assert qs.main(["--model", str(tiny_hf), "--data-path", prefix, "--split", "9,1,0", "--seq-length", "8"]) == 0
    out = capsys.readouterr().out
    assert (
        "this model" in out
        and "unigram baseline" in out
        and "Example 1 (_ = other masked tokens): ..." in out
        and qs.REAL_RUN in out
    )
    with pytest.raises(UserError, match=r"--split 1,0,0: no validation documents among the 10"):
        qs.summarize(str(tiny_hf), prefix, split="1,0,0")


def test_quickstart_ends_with_the_pretraining_comparison() -> None:
    text = (REPO / "run_scripts" / "quickstart.sh").read_text()
    modules = re.findall(r"\$PY -m ([\w.]+)", text)
    assert modules[-2:] == ["tools.evaluate.probe_data", "tools.probe_compare"]
    assert 'step "9/9' in text and "/8 " not in text


@pytest.mark.parametrize(
    "custom_code",
    [pytest.param(True, marks=pytest.mark.extended, id="blockbert-custom-code"), pytest.param(False, id="stock-bert")],
)
def test_random_init_same_architecture_fresh_weights(tmp_path: Path, custom_code: bool) -> None:
    """tools.random_init: config.json byte-identical, the same parameter names and shapes, every weight matrix
    redrawn, and the copy loads through the Auto classes (with its code for custom-code exports)."""
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    from tools.random_init import random_init

    src = tmp_path / "src"
    if custom_code:
        from model.bert import BertForPreTraining
        from model.config import ModelConfig
        from tools.hf_export import remote_code
        from tools.hf_export.export import write_hf

        cfg = ModelConfig.preset("blockbert-base-n2", vocab_size=97, hidden_size=48, num_layers=2,
                                 num_attention_heads=12, intermediate_size=32, max_position_embeddings=64)  # fmt: skip
        torch.manual_seed(0)
        m = BertForPreTraining(cfg).eval()
        src.mkdir()
        write_hf({k: v.clone() for k, v in m.state_dict().items()}, m.config, m.layout_state(), src, "always",
                 remote_code.token_mask_state(m))  # fmt: skip
    else:
        from transformers import BertConfig, BertForMaskedLM

        BertForMaskedLM(BertConfig(vocab_size=97, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=32, max_position_embeddings=64)).save_pretrained(src)  # fmt: skip
    out = tmp_path / "rnd"
    assert random_init(src, out, seed=3) == "AutoModelForMaskedLM"
    assert (out / "config.json").read_bytes() == (src / "config.json").read_bytes()
    a = AutoModelForMaskedLM.from_pretrained(src, trust_remote_code=custom_code).state_dict()
    b = AutoModelForMaskedLM.from_pretrained(out, trust_remote_code=custom_code).state_dict()
    assert {k: v.shape for k, v in a.items()} == {k: v.shape for k, v in b.items()}
    matrices = [k for k, v in a.items() if v.dim() == 2]
    assert matrices and all(not torch.equal(a[k], b[k]) for k in matrices)
    assert type(AutoModelForSequenceClassification.from_pretrained(out, num_labels=2, trust_remote_code=custom_code))
    from common.errors import UserError

    with pytest.raises(UserError, match="already exist"):
        random_init(src, out)


def test_probe_compare_verdict_needs_the_gap_beyond_both_spreads() -> None:
    from tools.probe_compare import verdict

    v = verdict([80.0, 70.0, 75.0], [50.0, 52.0, 49.0])
    assert (v["pretrained_median"], v["random_median"], v["gap"]) == (75.0, 50.0, 25.0)
    assert v["pretrained_spread"] == 10.0 and v["random_spread"] == 3.0 and v["helped"]
    assert not verdict([80.0, 50.0, 60.0], [50.0, 52.0, 49.0])["helped"]  # gap 10 < spread 30
    assert not verdict([60.0, 60.0, 60.0], [45.0, 70.0, 50.0])["helped"]  # gap 10 < random's spread 25


def test_probe_compare_takes_its_budget_from_the_quickstart_protocol() -> None:
    """One home for the calibrated numbers: tools/evaluate/protocols.py's `quickstart` entry; flags override it."""
    from tools.evaluate.protocols import PROTOCOLS
    from tools.probe_compare import CompareConfig, settings

    cfg = CompareConfig(model="m", data_dir="d")
    for task in cfg.tasks:
        s, p = settings(cfg, task), PROTOCOLS["quickstart"].settings[task]
        (point,) = p.grid()
        assert (s["lr"], s["batch_size"], s["epochs"], s["seeds"]) == (point.lr, point.batch_size, point.epochs,
                                                                      list(p.seeds))  # fmt: skip
    s = settings(CompareConfig(model="m", data_dir="d", lr=5e-4, seeds=[4, 5]), "probe_pair")
    assert s["lr"] == 5e-4 and s["seeds"] == [4, 5]
    with pytest.raises(ValueError, match="--seeds"):
        CompareConfig(model="m", data_dir="d", seeds=[1])
    with pytest.raises(ValueError, match="--protocol"):
        CompareConfig(model="m", data_dir="d", protocol="nope")


def test_probe_compare_same_runs_in_one_process_or_two(tmp_path: Path) -> None:
    """--workers 2 (spawned processes) gives the accuracies and last training losses --workers 1 gives, run for run:
    every fine-tuning is seeded and single-threaded, so where it runs changes nothing. A tiny stock BERT on the
    probe_single of 12 small documents (a model this small stays near chance: the losses tell the runs apart)."""
    from transformers import BertConfig, BertForMaskedLM, BertTokenizerFast

    from tests.test_probe_data import WORDS as PROBE_WORDS
    from tests.test_probe_data import _corpus, _make
    from tools.probe_compare import CompareConfig, compare, report

    _make(tmp_path, corpus=_corpus(tmp_path, docs=12))
    model = tmp_path / "hf"
    model.mkdir()
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", *"the of stood near and old".split(), *PROBE_WORDS]
    (model / "vocab.txt").write_text("\n".join(words) + "\n")
    tok = BertTokenizerFast(vocab=str(model / "vocab.txt"), do_lower_case=True)
    torch.manual_seed(1)  # not tools.random_init's seed 0, which would draw this very model as the twin
    BertForMaskedLM(BertConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=32, max_position_embeddings=64)).save_pretrained(model)  # fmt: skip
    tok.save_pretrained(model)
    got = {}
    for workers in (1, 2):
        cfg = CompareConfig(model=str(model), data_dir=str(tmp_path / "probe"), tasks=["probe_single"], seeds=[1, 2],
                            epochs=1, workers=workers)  # fmt: skip
        got[workers] = compare(cfg)
        assert got[workers]["workers"] == workers
    assert got[1]["runs"] == got[2]["runs"]
    assert got[1]["last_train_losses"] == got[2]["last_train_losses"]  # bit for bit
    losses = got[1]["last_train_losses"]["probe_single"]
    assert len(losses["pretrained"]) == len(losses["random-init"]) == 2
    assert len(set(losses["pretrained"] + losses["random-init"])) == 4  # four different runs, really trained
    assert "4 fine-tunings" in report(got[2]) and "(2 processes)" in report(got[2])
