"""The held-out batches every run is evaluated on, the unigram baseline, and re-evaluating a checkpoint."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

from benchmarks.pretrain_compare.presets import CompareError
from benchmarks.pretrain_compare.specs import RunSpec


def _run_config(spec: RunSpec, run_dir: Path):
    from pretrain.args import parse_args

    return parse_args(spec.train_args + ["--model-config", str(run_dir / "model.json")])


def valid_batches(spec: RunSpec, run_dir: Path, world_size: int):
    """The validation batches the trainer's evaluate() sees, per rank in rank order (built by the trainer's own
    builders with this run's flags)."""
    from pretrain import builders
    from pretrain.args import train_iterations
    from pretrain.ds_config import read_ds_config, resolve_batch_sizes

    run = _run_config(spec, run_dir)
    tok = builders.build_tokenizer(run.data)
    micro, _, gbs = resolve_batch_sizes(
        read_ds_config(run.system.deepspeed_config), run.loop.micro_batch_size, run.loop.global_batch_size, world_size
    )
    iters = train_iterations(run.loop, gbs)
    _, valid, _ = builders.build_datasets(run, tok, iters * gbs, iters, gbs)
    if valid is None:
        raise CompareError(f"{spec.name}: no validation data")
    out = []
    for rank in range(world_size):
        it = iter(builders.build_dataloader(run, valid, tok, micro, rank, world_size, 0, 0, valid=True))
        for _ in range(run.loop.eval_iters):
            try:
                out.append(next(it))
            except StopIteration:
                break
    return run, tok, out


def valid_fingerprint(spec: RunSpec, run_dir: Path, world_size: int) -> str:
    """sha256 of the held-out batches (token ids and MLM labels): equal for every run means every config and seed
    was evaluated on the same documents, samples and masks."""
    _, _, batches = valid_batches(spec, run_dir, world_size)
    h = hashlib.sha256()
    for b in batches:
        h.update(b["input_ids"].numpy().tobytes())
        h.update(b["labels"].numpy().tobytes())
    return h.hexdigest()[:16]


def unigram_baseline(spec: RunSpec, run_dir: Path, world_size: int) -> dict[str, float]:
    """The validation MLM loss, perplexity and accuracy of a model that knows only token frequencies: the training
    shards' unigram distribution (add-one smoothed, blended with the --data-path weights as in training) scored on
    the masked tokens of the same held-out batches. A run at this level has learned nothing from the context."""
    import numpy as np

    from data_pipeline.data_config import parse_data_path
    from data_pipeline.indexed import IndexedDataset
    from tools.mlm_scores import unigram_distribution, unigram_scores

    run, tok, batches = valid_batches(spec, run_dir, world_size)
    blend = parse_data_path(run.data.data_path)
    weights = [1.0 if w is None else float(w) for w, _ in blend]
    p = unigram_distribution([IndexedDataset(prefix).tokens for _, prefix in blend], weights, tok.vocab_size)
    labels = np.concatenate([b["labels"].numpy().ravel() for b in batches])
    scores = unigram_scores(p, labels[labels != -100])
    return {k: scores[k] for k in ("loss", "perplexity")} | {
        "mlm_accuracy": scores["top1_accuracy"],
        "tokens": scores["tokens"],
    }


def evaluate_checkpoint(spec: RunSpec, run_dir: Path, world_size: int) -> dict[str, float]:
    """Re-evaluate a run's newest checkpoint in this process (fp32 weights via pretrain.checkpoint, the trainer's
    validation batches): a check that the trainer's logged validation is reproducible from the checkpoint."""
    import torch

    from pretrain import builders, checkpoint
    from pretrain.ds_config import read_ds_config

    run, tok, batches = valid_batches(spec, run_dir, world_size)
    ckpt = run_dir / "ckpt"
    tag = checkpoint.find_resume_tag(ckpt)
    if tag is None:
        raise CompareError(f"{spec.name}: no complete checkpoint in {ckpt}")
    client = checkpoint.read_client_state(ckpt, tag)
    ds = read_ds_config(run.system.deepspeed_config)  # a legacy sparse_attention block belongs to the model
    cfg = builders.build_model_config(run.model, run.data, tok.vocab_size, ds.sparse_attention, ds.path)
    model = builders.build_model(cfg)
    model.load_state_dict(checkpoint.load_fp32_weights(ckpt, tag), strict=True)
    if client.get("layout_state") is not None:
        model.load_layout_state(client["layout_state"])
    model.eval()
    loss_sum = correct = count = 0.0
    with torch.no_grad():
        for b in batches:
            keys = ["input_ids", "attention_mask", "token_type_ids", "labels"]
            if bool(b["attention_mask"].all()):  # as Trainer._to_device: no padding, no mask
                keys.remove("attention_mask")
            out = model(**{k: b[k] for k in keys})
            loss_sum += float(out.mlm_loss.double() * out.mlm_count)
            correct += float(out.mlm_correct)
            count += float(out.mlm_count)
    loss = loss_sum / max(count, 1.0)
    return {
        "iteration": int(client["iteration"]),
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "mlm_accuracy": correct / max(count, 1.0),
    }
