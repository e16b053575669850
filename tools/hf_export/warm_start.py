"""Hugging Face BERT / ModernBERT / our custom-code export -> warm-start checkpoint for the trainer
(``python -m tools.convert_checkpoint --from-hf ... --to-ds ...``), optionally longer or with another attention."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch

from common.errors import write_errors
from common.outputs import atomic_dir
from model.bert import BertForPreTraining
from model.config import ModelConfig
from pretrain.checkpoint import (
    COMMIT_MARKER,
    LATEST,
    CheckpointError,
    extend_position_embeddings,
    file_records,
    tag_for,
)
from tools.hf_export import remote_code
from tools.hf_export.export import ConversionError, check_output
from tools.hf_export.stock_bert import STOCK_ARCHITECTURES, from_hf
from tools.hf_export.stock_modernbert import from_hf_modernbert


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
    check_output(out_dir, "--to-ds", overwrite, [("--from-hf", hf_dir)])
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
