"""What the quickstart's model learned, measured on held-out text through the Hugging Face export alone.

Masks a few hundred tokens of the shard's validation documents (the trainer's ``--split``; whole documents the model
never trained on), scores the exported model's predictions for them (loss, perplexity, top-1/top-5 accuracy) and the
unigram baseline's on the same tokens (the training documents' token frequencies: a model that learned only those
scores this), and shows the first masked positions with the model's top 5 as an illustration, not picked.

    python -m tools.quickstart_summary --model out/quickstart/hf --data-path out/quickstart/data/sample_text_sentence
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from common.error_exit import run_entry
from common.errors import UserError
from data_pipeline.data_config import split_document_ranges
from data_pipeline.indexed import IndexedDataset
from tools.mlm_scores import model_scores, unigram_distribution, unigram_scores

REAL_RUN = (
    "This was a tiny model on a small sample. A real one needs Books/Wikipedia shards, a BERT-base-sized model and "
    "GPU nodes: see README.md, section Pretraining (the deepspeed command, run_scripts/pretrain_blockbert.sh)."
)


@dataclass
class MaskedWindows:
    """Held-out token windows with some positions masked: the model's inputs and the tokens it must recover."""

    input_ids_BN: np.ndarray
    attention_mask_BN: np.ndarray
    positions: np.ndarray  # (row, column) of each masked token, [M, 2]
    labels_M: np.ndarray


def document_tokens(ds: IndexedDataset, first: int, last: int) -> np.ndarray:
    """The tokens of documents ``[first, last)`` of a shard, as stored (one contiguous slice of the .bin)."""
    s0, s1 = int(ds.document_indices[first]), int(ds.document_indices[last])
    if s0 == s1:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([ds[i] for i in range(s0, s1)]).astype(np.int64)


def mask_held_out(
    docs: Sequence[np.ndarray], special: dict[str, int], seq_length: int, mask_prob: float, max_tokens: int, seed: int
) -> MaskedWindows:
    """Each document cut into ``[CLS] ... [SEP]`` windows of ``seq_length``; every real token masked with
    probability ``mask_prob`` (all of them as [MASK]: an evaluation, not BERT's 80/10/10), until ``max_tokens``."""
    rng = np.random.default_rng(seed)
    rows, positions, labels = [], [], []
    body = seq_length - 2
    for doc in docs:
        for start in range(0, len(doc), body):
            if len(labels) >= max_tokens:
                break
            piece = doc[start : start + body]
            picked = np.flatnonzero(rng.random(len(piece)) < mask_prob)[: max_tokens - len(labels)]
            row = np.full(seq_length, special["pad"], dtype=np.int64)
            row[0], row[1 : len(piece) + 1], row[len(piece) + 1] = special["cls"], piece, special["sep"]
            row[picked + 1] = special["mask"]
            positions += [(len(rows), p + 1) for p in picked]
            labels += piece[picked].tolist()
            rows.append(row)
    ids = np.stack(rows) if rows else np.zeros((0, seq_length), dtype=np.int64)
    return MaskedWindows(
        ids, (ids != special["pad"]).astype(np.int64), np.array(positions).reshape(-1, 2), np.array(labels)
    )


def masked_logits(model_dir: str, windows: MaskedWindows, batch_size: int = 16) -> np.ndarray:
    """The exported model's logits at the masked positions, [M, V] (transformers alone, on the CPU, fp32)."""
    import torch
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(model_dir, trust_remote_code=True).eval()
    out = []
    with torch.no_grad():
        for b0 in range(0, len(windows.input_ids_BN), batch_size):
            ids = torch.from_numpy(windows.input_ids_BN[b0 : b0 + batch_size])
            mask = torch.from_numpy(windows.attention_mask_BN[b0 : b0 + batch_size])
            logits_BNV = model(input_ids=ids, attention_mask=mask).logits.float()
            here = windows.positions[(windows.positions[:, 0] >= b0) & (windows.positions[:, 0] < b0 + len(ids))]
            out.append(logits_BNV[here[:, 0] - b0, here[:, 1]].numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.vocab_size), dtype=np.float32)


def summarize(
    model_dir: str,
    data_path: str,
    split: str = "949,50,1",
    seq_length: int = 128,
    mask_prob: float = 0.15,
    max_tokens: int = 400,
    seed: int = 1234,
) -> dict[str, Any]:
    """The model's and the unigram baseline's scores on the same held-out masked tokens, and the model's logits."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)  # the export's own code, as fill_mask
    ds = IndexedDataset(data_path)
    (t0, t1), (v0, v1), _ = split_document_ranges(ds.num_documents, split)
    if v1 == v0:
        raise UserError(
            f"--split {split}: no validation documents among the {ds.num_documents} of {data_path}; give a split "
            "with a validation share, e.g. 949,50,1"
        )
    special = {"pad": tok.pad_token_id, "cls": tok.cls_token_id, "sep": tok.sep_token_id, "mask": tok.mask_token_id}
    held_out = [document_tokens(ds, d, d + 1) for d in range(v0, v1)]
    windows = mask_held_out(held_out, special, seq_length, mask_prob, max_tokens, seed)
    if not len(windows.labels_M):
        raise UserError(f"--data-path {data_path}: the validation documents hold no tokens to mask")
    logits_MV = masked_logits(model_dir, windows)
    p_V = unigram_distribution([document_tokens(ds, t0, t1)], [1.0], logits_MV.shape[1])
    return {
        "validation_documents": v1 - v0,
        "model": model_scores(logits_MV, windows.labels_M),
        "unigram": unigram_scores(p_V, windows.labels_M),
        "windows": windows,
        "logits": logits_MV,
        "tokenizer": tok,
    }


def report(result: dict[str, Any], examples: int = 2, context: int = 8) -> str:
    """The quickstart's last screen: the table, the first ``examples`` masked tokens with the model's top 5, and
    what a real run needs."""
    m, u, tok = result["model"], result["unigram"], result["tokenizer"]
    lines = [
        f"Held-out text: {m['tokens']} masked tokens of {result['validation_documents']} validation documents "
        "(never trained on).",
        f"  {'':<18} {'loss':>6} {'perplexity':>11} {'top-1':>7} {'top-5':>7}",
    ]
    for name, s in (("this model", m), ("unigram baseline", u)):
        lines.append(
            f"  {name:<18} {s['loss']:>6.2f} {s['perplexity']:>11.1f} {s['top1_accuracy']:>7.1%} "
            f"{s['top5_accuracy']:>7.1%}"
        )
    if m["loss"] < u["loss"]:
        lines.append("Its loss is below the unigram baseline's (a model that knows only how often each token occurs in")
        lines.append("the training documents): it learned something from the context.")
    else:
        lines.append("Its loss is NOT below the unigram baseline's (a model that knows only how often each token")
        lines.append("occurs in the training documents): train longer (ITERS) or see docs/troubleshooting.md.")
    w = result["windows"]
    for i in range(min(examples, len(w.labels_M))):
        row, col = w.positions[i]
        ids = w.input_ids_BN[row]
        # the other masked tokens of the window show as "_": the model saw them masked too
        left = tok.decode(ids[max(1, col - context) : col].tolist()).replace(tok.mask_token, "_")
        right = tok.decode(ids[col + 1 : col + 1 + context].tolist()).replace(tok.mask_token, "_")
        right = right.replace(tok.sep_token, "").strip()
        top5 = [tok.decode([t]) for t in np.argsort(-result["logits"][i], kind="stable")[:5]]
        lines.append(f"Example {i + 1} (_ = other masked tokens): ... {left} [MASK] {right} ...")
        lines.append(f"  held-out word: {tok.decode([int(w.labels_M[i])])!r}; model's top 5: {', '.join(top5)}")
    lines.append(REAL_RUN)
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.quickstart_summary", _main, argv)


def _main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tools.quickstart_summary", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="Hugging Face directory written by tools.convert_checkpoint --to-hf")
    p.add_argument("--data-path", required=True, help="the shard prefix the model trained on (one shard)")
    p.add_argument("--split", default="949,50,1", help="the trainer's --split: its validation documents are held out")
    p.add_argument("--seq-length", type=int, default=128, help="window length, as trained")
    p.add_argument("--mask-prob", type=float, default=0.15, help="share of held-out tokens masked")
    p.add_argument("--max-tokens", type=int, default=400, help="masked tokens scored at most")
    p.add_argument("--seed", type=int, default=1234, help="seed of the masked positions")
    p.add_argument("--examples", type=int, default=2, help="masked positions shown with the model's top 5")
    p.add_argument("--json", action="store_true", help="print the scores as one JSON object instead")
    args = p.parse_args(argv)
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        p.error(f"--model {args.model}: no config.json there; export one with tools.convert_checkpoint --to-hf")
    if not 0 < args.mask_prob <= 1 or args.max_tokens < 1 or args.seq_length < 3:
        p.error("--mask-prob must be in (0, 1], --max-tokens at least 1 and --seq-length at least 3")
    import transformers

    transformers.utils.logging.disable_progress_bar()  # its 'Loading weights' bar would sit in the quickstart's table
    result = summarize(
        args.model, args.data_path, args.split, args.seq_length, args.mask_prob, args.max_tokens, args.seed
    )
    if args.json:
        print(json.dumps({k: result[k] for k in ("validation_documents", "model", "unigram")}))
    else:
        print(report(result, args.examples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
