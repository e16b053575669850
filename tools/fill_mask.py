"""Fill a masked word with an exported Hugging Face directory, through transformers alone.

It shows that an export loads with stock `transformers` (our sparse attention code travels with the directory,
hence `trust_remote_code=True`) and what it predicts; tools.quickstart_summary scores held-out text instead.

    python -m tools.fill_mask --model out/quickstart/hf "Felix felt tired and calm, and said nothing for a long [MASK]."
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from common.error_exit import run_entry


def fill_mask(
    model_dir: str, sentences: Sequence[str], top_k: int = 5, device: str | None = None, precision: str = "auto"
) -> list[list[tuple[str, float]]]:
    """Top-k (token, probability) per sentence; each sentence must hold exactly one mask token.

    ``device``: default the GPU when there is one; ``precision`` auto = bf16 weights on GPUs with bf16 hardware,
    fp16 on older GPUs, fp32 on CPU (inference only: the weights are cast)."""
    import torch
    from transformers import pipeline  # heavy imports: keep --help fast

    from tools.device import resolve_device, resolve_precision

    dev = resolve_device(device)
    dtype = resolve_precision(precision, dev)
    fill = pipeline(
        "fill-mask",
        model=model_dir,
        trust_remote_code=True,
        device=dev,
        dtype=dtype if dtype is not None else torch.float32,
    )
    mask = fill.tokenizer.mask_token
    results = []
    for s in sentences:
        if s.count(mask) != 1:
            raise ValueError(f"sentence {s!r} must contain exactly one {mask} (the tokenizer's mask token)")
        results.append([(r["token_str"], float(r["score"])) for r in fill(s, top_k=top_k)])
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.fill_mask", _main, argv)


def _main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tools.fill_mask", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", required=True, help="Hugging Face directory written by tools.convert_checkpoint --to-hf")
    p.add_argument("--top-k", type=int, default=5, help="predictions to print per sentence")
    p.add_argument(
        "--expect",
        action="append",
        default=[],
        help="word that must be among the top-k of the matching sentence (one per sentence, in order; "
        "exit code 1 when one is missing)",
    )
    p.add_argument("--no-fail", action="store_true", help="report a missing --expect word but exit 0")
    p.add_argument("--json", action="store_true", help="print one JSON object per sentence instead of text")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: the GPU when there is one)")
    p.add_argument(
        "--precision",
        default="auto",
        choices=("auto", "fp32", "fp16", "bf16"),
        help="weights' dtype: auto = bf16 on Ampere+ GPUs, fp16 on older GPUs, fp32 on CPU",
    )
    p.add_argument("sentences", nargs="+", help="sentences with one [MASK] each")
    args = p.parse_intermixed_args(argv)  # lets --expect sit next to its sentence
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        p.error(
            f"--model {args.model}: no config.json there; export one with "
            f"`python -m tools.convert_checkpoint --load RUN/ckpt --to-hf {args.model}`"
        )
    if args.expect and len(args.expect) != len(args.sentences):
        p.error(f"--expect given {len(args.expect)} times for {len(args.sentences)} sentences; give one per sentence")
    try:
        results = fill_mask(args.model, args.sentences, args.top_k, args.device, args.precision)
    except ValueError as e:
        p.error(str(e))
    missing = 0
    for i, (s, preds) in enumerate(zip(args.sentences, results)):
        expected = args.expect[i] if args.expect else None
        hit = expected is None or expected in [t for t, _ in preds]
        missing += not hit
        if args.json:
            print(json.dumps({"sentence": s, "top_k": preds, "expected": expected, "hit": hit}))
        else:
            print(s)
            for rank, (tok, prob) in enumerate(preds, 1):
                mark = "  <- expected" if tok == expected else ""
                print(f"  {rank}. {tok:<15} {prob:.3f}{mark}")
            if not hit:
                print(f"  (expected {expected!r} not in the top {args.top_k})")
    if missing:
        print(f"{missing} of {len(results)} expected word(s) not in the top {args.top_k}")
    return 1 if missing and not args.no_fail else 0


if __name__ == "__main__":
    sys.exit(main())
