"""Parameter counts of a model config, by part; ``--table6`` lays our DIET variants next to DIET's Table 6.

    .venv/bin/python -m tools.model_stats --model-preset bert-base --position '{"type": "diet_abs", "rank": 128}'
    .venv/bin/python -m tools.model_stats --model-preset bert-base --position '{"type": "diet_rel"}' --segment per_head
    .venv/bin/python -m tools.model_stats --model-config my_model.json
    .venv/bin/python -m tools.model_stats --table6            # BERT-base vs DIET-REL/ABS (shared or not), JSON

Models are built on the ``meta`` device: no memory is allocated, any size is instant.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from common.error_exit import run_entry
from common.errors import UserError
from common.inputs import read_json_object
from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.positions import SEGMENT_TYPES

TABLE6 = {  # DIET paper, Table 6, English column (millions of parameters)
    "bert": 110.1,
    "shaw_rel": 112.9,
    "diet_rel": 109.9,
    "diet_rel_share": 109.7,
    "diet_abs_128": 128.6,
    "diet_abs_128_share": 111.3,
}
TABLE6_CONFIGS = {
    "bert": {},
    # K = 511 (no clipping at N = 512): the reading that reproduces the paper's REL counts; our default K is 128
    "diet_rel": {"position": {"type": "diet_rel", "max_distance": 511}},
    "diet_rel_share": {"position": {"type": "diet_rel", "max_distance": 511, "sharing": "layer"}},
    "diet_abs_128": {"position": {"type": "diet_abs", "rank": 128}},
    "diet_abs_128_share": {"position": {"type": "diet_abs", "rank": 128, "sharing": "layer"}},
}


def count(cfg: ModelConfig) -> dict[str, int]:
    """Parameters by part (the tied MLM decoder counted once, with the word embeddings)."""
    with torch.device("meta"):
        model = BertForPreTraining(cfg)
    parts: dict[str, int] = {}
    for name, p in model.named_parameters():
        if name.startswith("bert.embeddings."):
            key = "embeddings"
        elif name.startswith("bert.positional_attention."):
            key = "positional_attention"
        elif name.startswith("bert.dam."):
            key = "dam_mask"
        elif name.startswith("bert.encoder."):
            key = "encoder"
        else:
            key = "heads"
        parts[key] = parts.get(key, 0) + p.numel()
    parts["total"] = sum(parts.values())
    return parts


def table6(preset: str = "bert-base", nsp_head: bool = True) -> dict[str, dict]:
    """Our counts for Table 6's rows (BERT-base with the NSP head, as the paper's 110.1M counts the pooler)."""
    out = {}
    for name, over in TABLE6_CONFIGS.items():
        c = count(ModelConfig.preset(preset, nsp_head=nsp_head, **over))
        out[name] = {
            "ours_M": round(c["total"] / 1e6, 2),
            "paper_M": TABLE6[name],
            "positional_attention": c.get("positional_attention", 0),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.model_stats", _main, argv)


def _main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tools.model_stats", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model-preset", dest="preset", default="bert-base", help="a model/presets.py recipe")
    src.add_argument("--model-config", type=Path, help="a ModelConfig JSON file")
    p.add_argument("--position", help='position block as JSON, e.g. \'{"type": "diet_abs", "rank": 128}\'')
    p.add_argument("--segment", choices=list(SEGMENT_TYPES))
    p.add_argument("--nsp-head", action="store_true", help="count the pooler + NSP classifier too")
    p.add_argument("--table6", action="store_true", help="our counts for DIET Table 6's rows, as JSON")
    args = p.parse_args(argv)
    if args.table6:
        print(json.dumps(table6(args.preset or "bert-base"), indent=1))
        return 0
    over = {}
    if args.position:
        try:
            over["position"] = json.loads(args.position)
        except json.JSONDecodeError as e:
            raise UserError(f"--position is not valid JSON ({e}): {args.position!r}") from None
        if not isinstance(over["position"], dict):
            raise UserError(f'--position must be a JSON object like {{"type": "diet_abs"}}, got {args.position!r}')
    if args.segment:
        over["segment"] = args.segment
    if args.nsp_head:
        over["nsp_head"] = True
    try:
        if args.model_config:
            d = read_json_object(args.model_config, "--model-config", "a ModelConfig JSON file")
            d.update(over)
            cfg = ModelConfig.from_dict(d)
        else:
            cfg = ModelConfig.preset(args.preset, **over)
    except (ValueError, TypeError) as e:
        where = f"--model-config {args.model_config}" if args.model_config else f"--model-preset {args.preset}"
        raise UserError(f"{where}: {e}") from None
    c = count(cfg)
    print(
        json.dumps(
            {
                "config": args.preset if not args.model_config else str(args.model_config),
                "position": cfg.to_dict()["position"],
                "segment": cfg.segment,
                "parameters": c,
                "total_M": round(c["total"] / 1e6, 3),
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
