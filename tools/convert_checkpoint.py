"""DeepSpeed ZeRO checkpoint -> Hugging Face directory, and Hugging Face BERT -> warm-start checkpoint.

    python -m tools.convert_checkpoint --load CKPT_DIR [--tag iter_0001000] --to-hf OUT_DIR
    python -m tools.convert_checkpoint --from-hf HF_DIR --to-ds OUT_DIR [--max-position-embeddings 1024]
                                       [--sparsity '{"mode": "blockbert", "num_blocks": 2, ...}']

ZeRO 1/2/3 shards of any number of ranks (fp32, fp16, bf16) are consolidated to fp32 by DeepSpeed's own
zero_to_fp32; ZeRO-0 fp16/bf16 checkpoints give the optimizer's fp32 master weights. Models that stock BERT can
express (decided by tools.hf_export.stock_bert.stock_export) become a plain ``BertForMaskedLM`` directory,
ModernBERT-style models (rotary, GeGLU, full or exact-window layers) a plain ``ModernBertForMaskedLM`` one; the
others carry our own model code and load with ``trust_remote_code=True``. ``--from-hf`` reads BERT, ModernBERT
and our custom-code exports. Output directories are written to a temporary sibling and renamed at the end, so a
failed conversion leaves nothing half-written. This module is the command line only; the export lives in
tools/hf_export/ (export.py: to Hugging Face, warm_start.py: from it, stock_bert.py / stock_modernbert.py: the
name maps, remote_code.py: our model code).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from common.error_exit import run_entry
from tools.hf_export.export import ConversionError, ds_to_hf
from tools.hf_export.warm_start import hf_to_ds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m tools.convert_checkpoint",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--load", help="DeepSpeed checkpoint directory written by pretrain/train.py (has 'latest')")
    p.add_argument("--tag", help="checkpoint tag to convert (default: the one in 'latest')")
    p.add_argument("--to-hf", help="output Hugging Face directory")
    p.add_argument(
        "--remote-code",
        choices=("auto", "always", "never"),
        default="auto",
        help="auto: stock BertForMaskedLM when it expresses the model exactly, else our code",
    )
    p.add_argument("--no-tokenizer", action="store_true", help="do not write tokenizer files")
    p.add_argument("--tokenizer-type", help="override the tokenizer recorded in the checkpoint")
    p.add_argument("--vocab-file", help="override the WordPiece vocab path recorded in the checkpoint")
    p.add_argument("--tokenizer-model", help="override the SentencePiece/HF tokenizer path recorded in the checkpoint")
    p.add_argument("--from-hf", help="Hugging Face BERT directory (BertForMaskedLM / BertForPreTraining or our export)")
    p.add_argument(
        "--to-ds",
        help="output warm-start checkpoint directory (use with pretrain/train.py --load "
        "DIR --finetune --model-config DIR/model_config.json)",
    )
    p.add_argument("--max-position-embeddings", type=int, help="grow the position table to N (rows copied cyclically)")
    p.add_argument("--sparsity", help="JSON sparse_attention block for the new model, or 'dense' (default: keep)")
    p.add_argument("--attention-kernel", help="kernel for the new model (dense | block_gather | flex | auto)")
    p.add_argument("--drop-nsp-head", action="store_true", help="drop the pooler/NSP head (RoBERTa-1seq training)")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.convert_checkpoint", _main, argv)


def _main(argv: list[str]) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if bool(a.load) == bool(a.from_hf):
        p.error("give exactly one of --load (with --to-hf) or --from-hf (with --to-ds)")
    if a.load:
        if not a.to_hf:
            p.error("--load needs --to-hf OUT_DIR")
        info = ds_to_hf(a.load, a.to_hf, a.tag, a.remote_code, not a.no_tokenizer, a, a.overwrite)
        kind = f"custom code ({info['reason']})" if info["remote_code"] else f"stock {info['architecture']}"
        print(
            f"[convert] {a.load}/{info['tag']} -> {info['out']} as {kind}; tokenizer files: "
            f"{info['tokenizer_files'] or 'none'}"
        )
    else:
        if not a.to_ds:
            p.error("--from-hf needs --to-ds OUT_DIR")
        sparsity: Any = "keep"
        if a.sparsity:
            try:
                sparsity = None if a.sparsity == "dense" else json.loads(a.sparsity)
            except json.JSONDecodeError as e:
                raise ConversionError(
                    f"--sparsity {a.sparsity!r}: not valid JSON ({e.msg}); give a "
                    'sparse_attention block like \'{"mode": "fixed", "block": 16}\' '
                    "or 'dense'"
                ) from e
        info = hf_to_ds(
            a.from_hf,
            a.to_ds,
            a.max_position_embeddings,
            sparsity,
            a.attention_kernel,
            a.drop_nsp_head,
            a.overwrite,
        )
        for line in info["extended"]:
            print(f"[convert] extended {line}")
        print(
            f"[convert] {a.from_hf} -> {info['out']}/{info['tag']}; train from it with: deepspeed "
            f"pretrain/train.py --load {info['out']} --finetune --model-config "
            f"{info['out']}/model_config.json ..."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
