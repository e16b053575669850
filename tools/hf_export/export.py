"""DeepSpeed checkpoint -> Hugging Face directory (``python -m tools.convert_checkpoint --load ... --to-hf ...``).

The checkpoint is read from its files alone (pretrain/checkpoint_reader.py: DeepSpeed's zero_to_fp32 for ZeRO
shards, no engine, no pretrain.parallelize). Models stock BERT can express become ``BertForMaskedLM``
(stock_bert.py), ModernBERT-style ones ``ModernBertForMaskedLM`` (stock_modernbert.py), the others carry our own
model code (remote_code.py). The output is written to a temporary sibling and renamed at the end.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError, write_errors
from common.outputs import OutputError, atomic_dir, check_dir_writable, check_fresh, check_not_input
from model.config import ModelConfig
from pretrain.checkpoint_reader import (
    COMMIT_MARKER,
    LATEST,
    CheckpointError,
    check_integrity,
    committed_tags,
    load_fp32_weights,
    model_state_file,
    read_client_state,
)
from tools.hf_export import remote_code
from tools.hf_export.model_card import model_card
from tools.hf_export.stock_bert import STOCK_FIELDS, stock_export, to_hf
from tools.hf_export.stock_modernbert import to_hf_modernbert


class ConversionError(UserError, RuntimeError):
    """Bad input: the message names the file, tag or setting at fault and what to do."""


# ----------------------------------------------------------------------------------------------- reading DeepSpeed
def resolve_tag(load_dir: str | Path, tag: str | None) -> str:
    """The tag to convert: ``tag`` if given (must exist and be committed), else the one in ``latest``."""
    root = Path(load_dir)
    if not root.is_dir():
        raise ConversionError(f"--load {root}: no such directory")
    done = [t for _, t in committed_tags(root)]
    if tag is None:
        latest = root / LATEST
        if not latest.is_file():
            hint = f"complete tags there: {done}; pass one with --tag" if done else "it holds no complete checkpoint"
            raise ConversionError(f"--load {root}: no '{LATEST}' file, so no tag to convert ({hint})")
        tag = latest.read_text().strip()
        what = f"'{LATEST}' names tag {tag!r}"
    else:
        what = f"--tag {tag!r}"
    tag_dir = root / tag
    if not tag_dir.is_dir():
        raise ConversionError(f"--load {root}: {what} but {tag_dir} does not exist (complete tags: {done})")
    if not (tag_dir / COMMIT_MARKER).is_file():
        raise ConversionError(
            f"{tag_dir}: no {COMMIT_MARKER} marker, the save did not complete (complete tags: {done})"
        )
    return tag


def check_rank_files(load_dir: str | Path, tag: str, client: dict[str, Any]) -> None:
    """Every data-parallel rank's ZeRO shard must be present (DeepSpeed's own error does not say which is missing)."""
    tag_dir = Path(load_dir, tag)
    world = client["dp_world_size"]
    stage = client["zero_stage"]
    marker = json.loads((tag_dir / COMMIT_MARKER).read_text())
    world = int(marker.get("world_size", world))
    if stage == 0:
        model_state_file(load_dir, tag)
        return
    prefix = "bf16_" if any(tag_dir.glob("bf16_zero_pp_rank_*")) else ""
    needed = [f"{prefix}zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(world)]
    if stage == 3:
        needed += [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(world)]
    missing = [n for n in needed if not (tag_dir / n).is_file()]
    if missing:
        raise ConversionError(
            f"{tag_dir}: ZeRO stage {stage} checkpoint of {world} ranks is missing rank file(s) "
            f"{missing}; copy them from the machines that trained it"
        )


# ----------------------------------------------------------------------------------------------- writing HF
def _save_tokenizer(out: Path, args: dict[str, Any], overrides: argparse.Namespace, max_len: int) -> list[str]:
    from data_pipeline.tokenization import build_tokenizer

    data = dict((args or {}).get("data") or {})
    for k in ("tokenizer_type", "vocab_file", "tokenizer_model"):
        if getattr(overrides, k, None):
            data[k] = getattr(overrides, k)
    ttype = data.get("tokenizer_type")
    if not ttype:
        raise ConversionError(
            "the checkpoint does not record its tokenizer; pass --tokenizer-type and "
            "--vocab-file/--tokenizer-model, or --no-tokenizer"
        )
    try:
        tok = build_tokenizer(ttype, vocab_file=data.get("vocab_file"), tokenizer_model=data.get("tokenizer_model"))
    except Exception as e:  # the tokenizer module raises TokenizerError with the path at fault
        raise ConversionError(
            f"tokenizer recorded in the checkpoint cannot be built ({e}); pass --vocab-file or "
            "--tokenizer-model pointing at the files, or --no-tokenizer"
        ) from e
    if hasattr(tok, "hf"):
        tok.hf.model_max_length = max_len
    files = list(tok.save(out))
    if data.get("vocab_file") and ttype.startswith("BertWordPiece"):
        shutil.copyfile(data["vocab_file"], out / "vocab.txt")
        files.append("vocab.txt")
    specials = {
        "cls_token": tok.id_to_token(tok.cls_id),
        "sep_token": tok.id_to_token(tok.sep_id),
        "pad_token": tok.id_to_token(tok.pad_id),
        "mask_token": tok.id_to_token(tok.mask_id),
        "unk_token": tok.id_to_token(tok.unk_id),
    }
    if ttype == "SentencePieceTokenizer":
        from tools.hf_export.spm_tokenizer import save_spm_as_hf, spm_model_type

        kind = spm_model_type(data["tokenizer_model"])
        if kind == "unigram":
            files += save_spm_as_hf(data["tokenizer_model"], out, specials, max_len)
        else:
            print(
                f"[convert] warning: SentencePiece {kind} model exported as spm.model only; Hugging Face's "
                "converter handles unigram models (see docs/conversion.md)",
                file=sys.stderr,
            )
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
    return [Path(f).name for f in files] + ["special_tokens_map.json"]


def check_output(out: str | Path, flag: str, overwrite: bool, inputs: list[tuple[str, Any]]) -> None:
    """The output guard (common/outputs.py), before any work: ``out`` is no input nor a directory above one, is
    not a file, and is new or empty unless ``--overwrite``."""
    try:
        check_not_input(out, flag, [(f, p) for f, p in inputs if p])
        if Path(out).exists() and not Path(out).is_dir():
            raise ConversionError(f"{flag} {out} is a file; give a directory path (a new or empty directory)")
        check_fresh([out], flag, overwrite)
        check_dir_writable(out, flag, create=False)
    except OutputError as e:  # one error type for callers of ds_to_hf / hf_to_ds
        raise ConversionError(str(e)) from None


def write_hf(
    state_dict: dict[str, torch.Tensor],
    config: ModelConfig,
    layout_state: dict | None,
    out_dir: Path,
    remote: str = "auto",
    token_masks: dict[str, torch.Tensor] | None = None,
) -> dict[str, Any]:
    """Write config.json + model.safetensors (+ code, + mask files) into ``out_dir``; returns {"remote_code",
    "reason", "architecture"}. ``token_masks`` are the masks the model applies
    (:func:`remote_code.token_mask_state`); None = build them from ``config`` (a ``pattern: file`` mask is then read
    from its path)."""
    from safetensors.torch import save_file

    stock, reason = stock_export(config)
    use_remote = remote == "always" or stock is None
    if remote == "never" and stock is None:
        raise ConversionError(
            f"--remote-code never: stock BERT cannot express this model and neither can stock ModernBERT ({reason})"
        )
    if use_remote:
        if token_masks is None:
            needs = any(config.attention.token_mask_for_layer(i) is not None for i in range(config.num_layers))
            token_masks = remote_code.config_token_masks(config) if needs else {}
        remote_code.copy_model_code(out_dir)
        tensors = remote_code.to_remote_state_dict(state_dict, layout_state, token_masks)
        hf_config = {
            "model_type": remote_code.MODEL_TYPE,
            "architectures": ["SparseBertForMaskedLM"],
            "auto_map": dict(remote_code.AUTO_MAP),
            "sparse_bert": remote_code.export_model_config(config, token_masks, out_dir),
            "token_mask_lengths": {k: int(v.shape[-1]) for k, v in sorted(token_masks.items())},
        }
    elif stock == "modernbert":
        tensors, hf_config = to_hf_modernbert(state_dict, config)  # (decoder.weight tied: not stored)
    else:
        tensors, hf_config = to_hf(state_dict, config)
        tensors = dict(tensors)
        tensors.pop("cls.predictions.decoder.weight", None)  # tied to the word embeddings (tie_word_embeddings)
    tensors = {k: v.contiguous().clone() for k, v in tensors.items()}  # safetensors refuses shared storage
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
    return {
        "remote_code": use_remote,
        "reason": reason or ("--remote-code always" if use_remote else None),
        "architecture": hf_config["architectures"][0],
    }


def ds_to_hf(
    load_dir: str,
    out_dir: str,
    tag: str | None = None,
    remote: str = "auto",
    tokenizer: bool = True,
    tokenizer_overrides: argparse.Namespace | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Consolidate ``load_dir/tag`` and write a Hugging Face directory at ``out_dir``."""
    tag = resolve_tag(load_dir, tag)
    try:  # the weights exported are the ones saved: every file against the commit marker's size and CRC-32
        if not check_integrity(load_dir, tag):
            print(
                f"[convert] {Path(load_dir, tag)}: its commit marker records no checksums (an older checkpoint); "
                "exporting it unverified",
                file=sys.stderr,
            )
    except CheckpointError as e:
        raise ConversionError(f"{e}; refusing to export it") from e
    client = read_client_state(load_dir, tag)
    targs, over = client.get("args") or {}, tokenizer_overrides or argparse.Namespace()
    tok_files = [
        (f"--{k.replace('_', '-')}", getattr(over, k, None) or targs.get(k)) for k in ("vocab_file", "tokenizer_model")
    ]
    check_output(out_dir, "--to-hf", overwrite, [("--load", load_dir), *tok_files])
    check_rank_files(load_dir, tag, client)
    try:
        config = ModelConfig.from_dict(client["model_config"])
    except (ValueError, TypeError) as e:
        raise ConversionError(f"{load_dir}/{tag}: the stored model config is not valid for this code: {e}") from e
    state_dict = load_fp32_weights(load_dir, tag)  # from the files alone: no model is built for the export
    problems = remote_code.weight_problems(config, state_dict)
    if problems:
        raise ConversionError(
            f"{load_dir}/{tag}: weights do not match the stored model config: {'; '.join(problems[:6])}"
        )
    layouts = client.get("layout_state")
    if layouts is None and any(
        config.attention.for_layer(i, config.num_attention_heads)[1] for i in range(config.num_layers)
    ):
        raise ConversionError(
            f"{model_state_file(load_dir, tag)}: no 'layout_state' saved with a block-sparse model; the checkpoint "
            "was not written by pretrain/train.py (its random layouts cannot be recovered)"
        )
    out = Path(out_dir)
    with write_errors(f"--to-hf {out}", out), atomic_dir(out) as tmp:
        info = write_hf(state_dict, config, layouts, tmp, remote, remote_code.config_token_masks(config))
        files = []
        if tokenizer:
            files = _save_tokenizer(
                tmp,
                client.get("args") or {},
                tokenizer_overrides or argparse.Namespace(),
                config.max_position_embeddings,
            )
        d = config.to_dict()
        extra = {k: v for k, v in d.items() if k not in STOCK_FIELDS}
        (tmp / "README.md").write_text(model_card(d, client, f"{load_dir}/{tag}", info["remote_code"], extra))
    return {**info, "tag": tag, "tokenizer_files": files, "out": str(out)}
