"""Building the tokenizer, ModelConfig, model and datasets from the run config: what the trainer needs from model/
and data_pipeline/ to start a run (checkpointing, the ds_config reader and the trainer import further pieces)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pretrain.args import ArgsError, DataArgs, ModelArgs, RunConfig


def build_tokenizer(data: DataArgs):
    from data_pipeline.tokenization import build_tokenizer as _build

    return _build(data.tokenizer_type, vocab_file=data.vocab_file, tokenizer_model=data.tokenizer_model)


def build_model_config(
    margs: ModelArgs, data: DataArgs, vocab_size: int, sparse_attention: dict[str, Any] | None, ds_path: str
):
    """ModelConfig from --model-config or the preset, then flags; vocab from the tokenizer; NSP head from the mode.

    The ds_config's legacy `sparse_attention` block becomes attention.sparsity (a conflict with a flag is an error).
    """
    from model.config import ModelConfig

    if margs.model_config:
        try:
            with open(margs.model_config) as f:
                base = ModelConfig.from_dict(json.load(f))
        except (OSError, ValueError, TypeError) as e:
            raise ArgsError(f"--model-config {margs.model_config}: {e}") from e
        cfg = dataclasses.replace(base, **margs.overrides)
    else:
        cfg = ModelConfig.preset(margs.model_preset, **margs.overrides)
    attention = dict(margs.attention)
    if sparse_attention is not None:
        if "sparsity" in attention:
            raise ArgsError(
                f"sparsity given twice: the 'sparse_attention' block of {ds_path} and a command-line "
                "flag (--sparsity-config / --blockbert-blocks); keep one"
            )
        attention["sparsity"] = sparse_attention
    try:  # the merged settings are validated again here (e.g. a kernel that cannot run with the dropout)
        cfg = _recipe_flags(cfg, margs, attention, data.seq_length)
        if attention:
            cfg = dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, **attention))
        cfg = dataclasses.replace(
            cfg,
            vocab_size=vocab_size,  # the real size: the model pads its tables (pad_vocab_multiple)
            nsp_head=data.sample_mode == "nsp",
        )
    except ValueError as e:
        raise ArgsError(f"model settings: {e}") from e
    if cfg.max_position_embeddings < data.seq_length:
        raise ArgsError(
            f"--seq-length {data.seq_length} exceeds the model's max_position_embeddings "
            f"{cfg.max_position_embeddings}; raise --max-position-embeddings"
        )
    return cfg


def _recipe_flags(cfg, margs: ModelArgs, attention: dict[str, Any], seq_length: int):
    """The recipe shorthands (--token-mask, --diet-*, --sliding-window/--global-every), written by the builders of
    model/presets.py into ``cfg`` (position) and ``attention`` (the attention fields to replace)."""
    from model import presets

    if margs.token_mask:
        params = {"path": margs.token_mask_path} if margs.token_mask_path else {}
        attention["token_mask"] = presets.sparsebert(margs.token_mask, seq_length, **params)
    if margs.diet_size is not None or margs.diet_sharing is not None:
        kind = {v[0]: k for k, v in presets.DIET_KINDS.items()}.get(cfg.position.type)
        if kind is None:
            raise ArgsError(
                f"--diet-size / --diet-sharing set a DIET position, but --model-preset {margs.model_preset}'s position "
                f"is {cfg.position.type!r}: use a DIET preset ({', '.join(n for n in presets.PRESETS if 'diet' in n)})"
            )
        size = getattr(cfg.position, presets.DIET_KINDS[kind][1]) if margs.diet_size is None else margs.diet_size
        sharing = margs.diet_sharing or cfg.position.sharing
        cfg = dataclasses.replace(cfg, position=presets.diet(kind, size, sharing))
    current = cfg.attention
    if margs.sliding_window is not None or margs.global_every is not None:
        window = ((current.local or {}).get("token_mask") or {}).get("window")
        if current.global_every is None or window is None:
            raise ArgsError(
                "--sliding-window / --global-every change a ModernBERT cadence, but the model has none: use a "
                "modernbert-* preset"
            )
        built = presets.modernbert(margs.sliding_window or window, margs.global_every or current.global_every)
        attention["global_every"] = built["global_every"]
        attention["local"] = {"sparsity": None, **built["local"]}  # the local layers: exactly the window
    if "sparsity" in attention and (attention.get("global_every") or current.global_every):
        local = dict(attention.get("local") or current.local or {})
        local.setdefault("sparsity", None)  # a layout given on the command line goes on the global layers only
        attention["local"] = local
    return cfg


def build_model(model_config):
    from model.bert import BertForPreTraining

    return BertForPreTraining(model_config)


_ALL_TRAIN = "1,0,0"  # a split that gives every document of a shard to its first dataset


def data_config(run: RunConfig, valid: bool = False):
    """The loader's settings for training, or (``valid``) for validation: ``run.data`` (a DataConfig, seed --seed),
    with the --valid-data-path shards used whole (split 1,0,0; the training shards then train whole too) and the
    validation samples and masks drawn with --valid-seed."""
    d = run.data
    changes: dict = {}
    if d.valid_data_path:
        changes["split"] = _ALL_TRAIN
        if valid:
            changes["data_path"] = list(d.valid_data_path)
    if valid and d.valid_seed is not None:
        changes["seed"] = d.valid_seed
    return dataclasses.replace(d, **changes) if changes else d


def build_datasets(run: RunConfig, tokenizer, train_samples: int, train_iters: int, global_batch: int):
    """(train, valid, test) sized like Megatron: enough samples for every iteration and every evaluation.

    ``train_samples`` is the end position of the run in the training stream (consumed samples at a resume plus the
    samples of the remaining steps; train_iters x global batch for a straight run)."""
    from data_pipeline.datasets import build_datasets as _build

    loop, d = run.loop, run.data
    evals = (train_iters // loop.eval_interval + 1) if loop.eval_interval else 0
    num = (train_samples, evals * loop.eval_iters * global_batch, loop.eval_iters * global_batch)
    if not d.valid_data_path and d.valid_seed in (None, run.loop.seed):
        return _build(data_config(run), tokenizer, num_samples=num)
    train, valid, test = _build(data_config(run), tokenizer, num_samples=num)
    if d.valid_data_path:  # held-out shards, whole: the first (all-document) dataset of a 1,0,0 split
        valid = _build(data_config(run, valid=True), tokenizer, num_samples=(num[1], 0, 0))[0]
    else:  # the same valid split, drawn with --valid-seed
        valid = _build(data_config(run, valid=True), tokenizer, num_samples=num)[1]
    return train, valid, test


def build_dataloader(
    run: RunConfig,
    dataset,
    tokenizer,
    micro_batch: int,
    dp_rank: int,
    dp_world: int,
    consumed_samples: int,
    num_workers: int,
    valid: bool = False,
):
    """``valid``: masks drawn with the validation seed (--valid-seed), as the validation dataset was built."""
    from data_pipeline.batching import build_dataloader as _build

    return _build(
        dataset,
        tokenizer,
        data_config(run, valid),
        micro_batch_size=micro_batch,
        dp_rank=dp_rank,
        dp_world_size=dp_world,
        consumed_samples=consumed_samples,
        num_workers=num_workers,
    )
