"""The list of runs (config x seed) a command line asks for, and what each run is."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from benchmarks.pretrain_compare.presets import Preset, model_config_dict


@dataclasses.dataclass
class RunSpec:
    """One training run of the comparison: a config and a seed, with the exact trainer flags."""

    name: str
    config: str
    seed: int
    train_args: list[str]
    model_config: dict[str, Any]


def run_specs(ns: argparse.Namespace, preset: Preset) -> list[RunSpec]:
    """Every (config, seed) run, in the order they train: all configs at the first seed, then the extra seeds."""
    common = [
        "--deepspeed_config",
        ns.ds_config or preset.ds_config,
        "--seq-length",
        str(preset.seq_length),
        "--micro-batch-size",
        str(preset.micro_batch_size),
        "--train-iters",
        str(ns.train_iters or preset.train_iters),
        "--lr",
        str(ns.lr or preset.lr),
        "--min-lr",
        "0",
        "--lr-warmup-fraction",
        str(ns.warmup_fraction),
        "--lr-decay-style",
        "linear",
        "--weight-decay",
        "0.01",
        "--adam-beta1",
        "0.9",
        "--adam-beta2",
        "0.999",
        "--adam-eps",
        "1e-8",
        "--clip-grad",
        "1.0",
        "--sample-mode",
        "doc-sentences",
        "--tokenizer-type",
        ns.tokenizer_type,
        "--vocab-file",
        ns.vocab_file,
        "--data-path",
        *ns.data_path,
        "--eval-interval",
        str(ns.eval_interval or preset.eval_interval),
        "--eval-iters",
        str(ns.eval_iters or preset.eval_iters),
        "--log-interval",
        str(ns.log_interval or preset.log_interval),
        "--valid-seed",
        str(ns.valid_seed),
        "--num-workers",
        str(ns.num_workers),
    ]
    gbs = ns.global_batch_size or preset.global_batch_size
    if gbs:
        common += ["--global-batch-size", str(gbs)]
    common += ["--valid-data-path", *ns.valid_data_path] if ns.valid_data_path else ["--split", ns.split]
    specs = []
    seeds = list(ns.seeds)
    for k, seed in enumerate(seeds):
        for config in ns.configs:
            if k > 0 and config not in ns.seeded_configs:
                continue
            specs.append(
                RunSpec(
                    name=f"{config}_s{seed}",
                    config=config,
                    seed=seed,
                    train_args=common + ["--seed", str(seed)] + list(ns.train_arg),
                    model_config=model_config_dict(config, preset),
                )
            )
    return specs
