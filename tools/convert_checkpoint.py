"""DeepSpeed ZeRO checkpoint -> Hugging Face directory, and Hugging Face BERT -> warm-start checkpoint.

    python -m tools.convert_checkpoint --load CKPT_DIR [--tag iter_0001000] --to-hf OUT_DIR
    python -m tools.convert_checkpoint --from-hf HF_DIR --to-ds OUT_DIR [--max-position-embeddings 1024]
                                       [--sparsity '{"mode": "blockbert", "num_blocks": 2, ...}']

ZeRO 1/2/3 shards of any number of ranks (fp32, fp16, bf16) are consolidated to fp32 by DeepSpeed's own
zero_to_fp32; ZeRO-0 fp16/bf16 checkpoints give the optimizer's fp32 master weights. Models that stock BERT can
express (decided by model.hf_adapter.stock_export) become a plain ``BertForMaskedLM`` directory (names
mapped by model/hf_adapter.py), ModernBERT-style models (rotary, GeGLU, full or exact-window layers) a plain
``ModernBertForMaskedLM`` one (model/hf_modernbert.py); the others carry our own model code (tools/hf_export) and
load with ``trust_remote_code=True``. ``--from-hf`` reads BERT, ModernBERT and our custom-code exports. Output
directories are written to a temporary sibling and renamed at the end, so a failed conversion leaves nothing
half-written.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from common.errors import UserError, run_entry, write_errors
from common.outputs import OutputError, atomic_dir, check_dir_writable, check_fresh, check_not_input
from model.bert import BertForPreTraining
from model.config import ModelConfig
from model.hf_adapter import STOCK_ARCHITECTURES, STOCK_FIELDS, from_hf, stock_export, to_hf
from model.hf_modernbert import from_hf_modernbert, to_hf_modernbert
from pretrain.checkpoint import (
    COMMIT_MARKER,
    LATEST,
    CheckpointError,
    check_integrity,
    committed_tags,
    extend_position_embeddings,
    file_records,
    load_fp32_weights,
    model_state_file,
    read_client_state,
)
from tools.hf_export import remote_code
from tools.hf_export.model_card import model_card


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


def _check_output(out: str | Path, flag: str, overwrite: bool, inputs: list[tuple[str, Any]]) -> None:
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
            token_masks = remote_code.token_mask_state(BertForPreTraining(config)) if needs else {}
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
    _check_output(out_dir, "--to-hf", overwrite, [("--load", load_dir), *tok_files])
    check_rank_files(load_dir, tag, client)
    try:
        config = ModelConfig.from_dict(client["model_config"])
    except (ValueError, TypeError) as e:
        raise ConversionError(f"{load_dir}/{tag}: the stored model config is not valid for this code: {e}") from e
    state_dict = load_fp32_weights(load_dir, tag)
    model = BertForPreTraining(config)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    if missing or unexpected:
        raise ConversionError(
            f"{load_dir}/{tag}: weights do not match the stored model config: missing "
            f"{missing[:5]}, unexpected {unexpected[:5]}"
        )
    if client.get("layout_state") is not None:
        model.load_layout_state(client["layout_state"])
    out = Path(out_dir)
    with write_errors(f"--to-hf {out}", out), atomic_dir(out) as tmp:
        info = write_hf(state_dict, config, model.layout_state(), tmp, remote, remote_code.token_mask_state(model))
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


# ----------------------------------------------------------------------------------------------- reading HF
def _read_hf_weights(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if (hf_dir / "model.safetensors").is_file():
        return load_file(str(hf_dir / "model.safetensors"))
    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        out = {}
        for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
            out.update(load_file(str(hf_dir / shard)))
        return out
    if (hf_dir / "pytorch_model.bin").is_file():
        return torch.load(hf_dir / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ConversionError(
        f"--from-hf {hf_dir}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin there"
    )


def _legacy_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original TF-converted BERT checkpoints call LayerNorm parameters gamma/beta."""
    return {
        k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
        for k, v in sd.items()
    }


def read_hf(hf_dir: str | Path) -> tuple[dict[str, torch.Tensor], ModelConfig, dict | None]:
    """A Hugging Face BERT (or one of our custom-code exports) -> (our state dict, ModelConfig, layout state).

    A ``pattern: file`` token mask of an export comes back pointing (absolutely) at the mask file inside
    ``hf_dir``; the stored masks themselves are returned by :func:`read_hf_token_masks`."""
    hf_dir = Path(hf_dir)
    cfg_file = hf_dir / "config.json"
    if not cfg_file.is_file():
        raise ConversionError(f"--from-hf {hf_dir}: no config.json; not a Hugging Face model directory")
    cfg = json.loads(cfg_file.read_text())
    mtype = cfg.get("model_type")
    sd = _read_hf_weights(hf_dir)
    if mtype == remote_code.MODEL_TYPE:
        try:
            ours, layouts, _ = remote_code.from_remote_state_dict(sd)
            config = ModelConfig.from_dict(remote_code.resolve_mask_paths(cfg["sparse_bert"], hf_dir))
        except (remote_code.ExportError, KeyError, ValueError, TypeError) as e:
            raise ConversionError(f"--from-hf {hf_dir}: {e}") from e
        return ours, config, layouts or None
    if mtype == "modernbert":
        try:
            ours, config = from_hf_modernbert(sd, cfg)
        except (KeyError, ValueError, TypeError) as e:
            raise ConversionError(f"--from-hf {hf_dir}: {e}") from e
        return ours, config, None
    if mtype != "bert":
        raise ConversionError(
            f"--from-hf {hf_dir}: config.json has model_type {mtype!r}; only {sorted(STOCK_ARCHITECTURES)} (and our "
            f"'{remote_code.MODEL_TYPE}' exports) can be converted"
        )
    sd = _legacy_names(sd)
    if not any(k.startswith("bert.") for k in sd):
        raise ConversionError(
            f"--from-hf {hf_dir}: weights have no 'bert.' prefix (a bare BertModel without the "
            "MLM head); export it with BertForMaskedLM or BertForPreTraining"
        )
    if "cls.seq_relationship.weight" not in sd:  # MLM-only models may still carry an unused pooler
        sd = {k: v for k, v in sd.items() if not k.startswith("bert.pooler.")}
    if "cls.predictions.decoder.weight" not in sd and "bert.embeddings.word_embeddings.weight" in sd:
        sd["cls.predictions.decoder.weight"] = sd["bert.embeddings.word_embeddings.weight"]
    try:
        ours, config = from_hf(sd, cfg)
    except (KeyError, ValueError) as e:
        raise ConversionError(f"--from-hf {hf_dir}: {e}") from e
    return ours, config, None


def read_hf_token_masks(hf_dir: str | Path) -> dict[str, torch.Tensor]:
    """The SparseBERT token masks stored in a custom-code export (``{"layer{i}": bool [H, n, n]}``; empty for
    stock BERT)."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    if cfg.get("model_type") != remote_code.MODEL_TYPE:
        return {}
    return remote_code.from_remote_state_dict(_read_hf_weights(Path(hf_dir)))[2]


def _check_token_masks(model: BertForPreTraining, stored: dict[str, torch.Tensor], hf_dir: str) -> None:
    """The masks our code builds from the config must be the ones the export stored (a random pattern drawn
    differently, e.g. by another torch version, would silently change the model)."""
    built = remote_code.token_mask_state(model)
    for layer, m in stored.items():
        b = built.get(layer)
        if b is not None and b.shape == m.shape and not torch.equal(b, m):
            raise ConversionError(
                f"--from-hf {hf_dir}: {layer}'s token mask built from the config differs from "
                "the one stored in the export; save the stored masks with "
                "model.attention.sparsebert.save_masks and use attention.token_mask "
                "{'pattern': 'file', 'path': ...}"
            )


def _ds_checkpoint(
    out: Path, state_dict: dict[str, torch.Tensor], config: ModelConfig, layouts: dict, source: str
) -> str:
    """The layout pretrain/checkpoint.py reads with ``--load OUT --finetune``: weights only, no optimizer."""
    from pretrain.checkpoint import tag_for

    tag = tag_for(0)
    (out / tag).mkdir(parents=True)
    torch.save(
        {
            "module": state_dict,
            "iteration": 0,
            "consumed_train_samples": 0,
            "model_config": config.to_dict(),
            "args": {},
            "layout_state": layouts,
            "world_size": 1,
            "warm_start_from": source,
        },
        out / tag / "mp_rank_00_model_states.pt",
    )
    marker = {"iteration": 0, "world_size": 1, "tag": tag, "files": file_records(out / tag)}
    (out / tag / COMMIT_MARKER).write_text(json.dumps(marker))
    (out / LATEST).write_text(tag)
    (out / "model_config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
    return tag


def hf_to_ds(
    hf_dir: str,
    out_dir: str,
    max_position_embeddings: int | None = None,
    sparsity: Any = "keep",
    kernel: str | None = None,
    drop_nsp_head: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Warm-start checkpoint from a Hugging Face BERT, optionally longer (positions copied cyclically) and with a
    different attention (e.g. BlockBERT from dense BERT). ``sparsity="keep"`` keeps the source's attention."""
    _check_output(out_dir, "--to-ds", overwrite, [("--from-hf", hf_dir)])
    sd, config, layouts = read_hf(hf_dir)
    d = config.to_dict()
    att = dict(d["attention"])
    if sparsity != "keep":
        att.update(sparsity=sparsity, per_layer=None)
        layouts = None  # a new layout family: draw it for the new model
    if kernel:
        att["kernel"] = kernel
    d["attention"] = att
    if max_position_embeddings and max_position_embeddings != d["max_position_embeddings"]:
        layouts = None  # layouts are drawn for the maximum length: a longer model gets its own
        d["max_position_embeddings"] = max_position_embeddings
    if drop_nsp_head:
        d["nsp_head"] = False
        sd = {k: v for k, v in sd.items() if not k.startswith(("cls.pooler.", "cls.seq_relationship."))}
    stored = read_hf_token_masks(hf_dir)
    out = Path(out_dir)
    with write_errors(f"--to-ds {out}", out), atomic_dir(out) as tmp:
        build_d, save_d = _write_mask_files(d, stored, tmp, out)
        try:
            target = ModelConfig.from_dict(build_d)
        except (ValueError, TypeError) as e:
            raise ConversionError(f"target model config is invalid: {e}") from e
        model = BertForPreTraining(target)
        try:
            extended = extend_position_embeddings(sd, model) + _extend_diet_positions(sd, model)
        except CheckpointError as e:
            raise ConversionError(f"--max-position-embeddings {max_position_embeddings}: {e}") from e
        try:
            model.load_state_dict(sd, strict=True)
        except RuntimeError as e:
            raise ConversionError(f"--from-hf {hf_dir}: weights do not fit the target model: {e}") from e
        if layouts:
            full = {f"layer{i}": layouts.get(f"layer{i}") for i in range(target.num_layers)}
            model.load_layout_state(full)
        _check_token_masks(model, stored, str(hf_dir))
        tag = _ds_checkpoint(
            tmp,
            {k: v.clone() for k, v in model.state_dict().items()},
            ModelConfig.from_dict(save_d),
            model.layout_state(),
            str(hf_dir),
        )
        for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "spm.model"):
            if (Path(hf_dir) / name).is_file():
                (tmp / "tokenizer").mkdir(exist_ok=True)
                shutil.copyfile(Path(hf_dir) / name, tmp / "tokenizer" / name)
    return {"tag": tag, "extended": extended, "out": str(out), "config": target}


def _extend_diet_positions(sd: dict[str, torch.Tensor], model: BertForPreTraining) -> list[str]:
    """DIET-ABS keeps its learned positions in ``bert.positional_attention.abs_pos`` ``[S, N, d_p]``: grow N by
    repeating the trained rows, as for BERT's position embeddings (DIET-REL's clipped table needs nothing)."""
    name = "bert.positional_attention.abs_pos"
    target = model.state_dict().get(name)
    if name not in sd or target is None or sd[name].shape[1] == target.shape[1]:
        return []
    have, want = sd[name].shape[1], target.shape[1]
    if want < have:
        raise CheckpointError(
            f"{name}: checkpoint has {have} positions, the new model only {want}; shrinking "
            "position embeddings is not supported"
        )
    sd[name] = sd[name].repeat(1, -(-want // have), 1)[:, :want].clone()
    return [f"{name}: {have} -> {want}"]


def _write_mask_files(d: dict[str, Any], stored: dict[str, torch.Tensor], tmp: Path, out: Path) -> tuple[dict, dict]:
    """Write every ``pattern: file`` mask into the new checkpoint dir from the masks stored in the export (the
    export's own mask file may be gone, e.g. after ``save_pretrained``), so the warm start does not depend on the
    Hugging Face directory. Returns (config dict pointing at ``tmp`` to build now, config dict pointing at the
    final ``out`` to save)."""
    from model.attention.sparsebert import save_masks

    build, save = json.loads(json.dumps(d)), json.loads(json.dumps(d))
    per = d["attention"].get("per_layer")
    n_layers = d["num_layers"]
    entries = [(None, [i for i in range(n_layers) if per is None or "token_mask" not in per[i]])]
    entries += [(i, [i]) for i in range(len(per or []))]
    for k, users in entries:
        src = d["attention"] if k is None else per[k]
        tm = src.get("token_mask")
        if tm is None or tm.get("pattern") != "file":
            continue
        name = remote_code.MASK_FILE if k is None else f"token_masks_layer{k}.pt"
        masks = {f"layer{i}": stored[f"layer{i}"] for i in users if f"layer{i}" in stored}
        if len(masks) == len(users) and masks:
            save_masks(str(tmp / name), masks)
        elif Path(tm["path"]).is_file():
            shutil.copyfile(tm["path"], tmp / name)
        else:
            raise ConversionError(
                f"token mask file {tm['path']} is missing and the export stores no mask for layers {users}"
            )
        for dd, path in ((build, tmp / name), (save, out.resolve() / name)):
            target = dd["attention"] if k is None else dd["attention"]["per_layer"][k]
            target["token_mask"] = {**tm, "path": str(path)}
    return build, save


# ----------------------------------------------------------------------------------------------- CLI
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
    """The command line; bad input is one line and exit 2 (common.errors.run_entry)."""
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
