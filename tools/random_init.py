"""The same model, untrained: a Hugging Face directory with an export's config, tokenizer and code, and fresh
weights drawn by the architecture's own initialisation (``from_config``). The baseline that shows what pretraining
bought: fine-tune both at the same budget and compare.

    python -m tools.random_init --model out/quickstart/hf --output-dir out/quickstart/hf_random_init

Works for our custom-code exports (``auto_map`` in config.json; the code files travel with the copy) and for stock
transformers models (``architectures`` names a transformers class).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from common.cli import HelpFormatter, add_flags
from common.error_exit import run_entry
from common.errors import UserError, write_errors
from common.outputs import atomic_dir, check_fresh, check_not_input

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".msgpack", ".h5", ".ckpt")
"""Files not copied (the source's weights, and their shard indexes below)."""
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
AUTO_CLASSES = (
    "AutoModelForMaskedLM",
    "AutoModelForPreTraining",
    "AutoModelForSequenceClassification",
    "AutoModelForQuestionAnswering",
    "AutoModelForMultipleChoice",
    "AutoModelForTokenClassification",
    "AutoModel",
)
"""Auto classes searched for the export's architecture, most likely first."""

CARD = """# Random initialisation of `{source}`

Same config, tokenizer and code as `{source}`; the weights are fresh, drawn by the architecture's own
initialisation (`{auto}.from_config`, torch seed {seed}) by `python -m tools.random_init`. It was never trained:
fine-tune it beside `{source}` at the same budget to see what pretraining bought.
"""


@dataclass
class RandomInitConfig:
    """Which export to copy untrained, and where."""

    model: str
    """Hugging Face directory (tools.convert_checkpoint --to-hf, or any transformers model with config.json)."""
    output_dir: str
    """The untrained copy: config, tokenizer, code files, fresh weights."""
    seed: int = 0
    """torch seed of the fresh weights."""
    overwrite: bool = False
    """Replace output_dir if it exists."""


def _auto_class(config: Any, remote: bool) -> str:
    """The Auto class whose mapping gives the export's architecture (config.architectures[0])."""
    import transformers

    archs = getattr(config, "architectures", None) or []
    if remote:
        auto_map = getattr(config, "auto_map", {}) or {}
        for name in AUTO_CLASSES:
            if name in auto_map and (not archs or auto_map[name].split(".")[-1] == archs[0]):
                return name
        return next(n for n in AUTO_CLASSES if n in auto_map)
    for name in AUTO_CLASSES:
        try:
            cls = getattr(transformers, name)._model_mapping[type(config)]
        except KeyError:
            continue
        if not archs or getattr(cls, "__name__", "") == archs[0]:
            return name
    return "AutoModel"


def random_init(model: str | Path, output_dir: str | Path, seed: int = 0, overwrite: bool = False) -> str:
    """Write the untrained copy of ``model`` to ``output_dir`` (in one rename); returns the Auto class used."""
    import torch
    import transformers
    from transformers import AutoConfig

    src, out = Path(model), Path(output_dir)
    cfg_file = src / "config.json"
    if not cfg_file.is_file():
        raise UserError(f"--model {src}: no config.json there; export one with tools.convert_checkpoint --to-hf")
    check_not_input(out, "--output-dir", [("--model", src)])
    check_fresh([out], "--output-dir", overwrite)
    remote = "auto_map" in json.loads(cfg_file.read_text())
    config = AutoConfig.from_pretrained(src, trust_remote_code=remote)
    auto = _auto_class(config, remote)
    torch.manual_seed(seed)
    net = getattr(transformers, auto).from_config(config, trust_remote_code=remote)
    with write_errors(f"--output-dir {out}", out.parent), atomic_dir(out) as tmp:
        for f in sorted(src.iterdir()):  # code files, tokenizer files, anything else the export carries
            if f.is_file() and not f.name.endswith(WEIGHT_SUFFIXES) and f.name not in (*WEIGHT_INDEXES, "README.md"):
                shutil.copy2(f, tmp / f.name)
        net.save_pretrained(tmp)
        shutil.copy2(cfg_file, tmp / "config.json")  # the source's own bytes: same config, not a re-serialisation
        (tmp / "README.md").write_text(CARD.format(source=src, auto=auto, seed=seed))
    return auto


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`RandomInitConfig` field."""
    p = argparse.ArgumentParser(prog="python -m tools.random_init", description=__doc__, formatter_class=HelpFormatter)
    add_flags(p, RandomInitConfig)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2."""
    return run_entry("tools.random_init", _main, argv)


def _main(argv: Sequence[str]) -> int:
    cfg = RandomInitConfig(**vars(build_parser().parse_args(argv)))
    auto = random_init(cfg.model, cfg.output_dir, cfg.seed, cfg.overwrite)
    print(f"[random_init] {cfg.output_dir}: {cfg.model}'s config, tokenizer and code, fresh weights ({auto}, seed "
          f"{cfg.seed})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
