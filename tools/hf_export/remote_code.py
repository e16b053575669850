"""Copy OUR model code (model/*.py, model/attention/*.py) into an export directory as flat, relatively-imported
modules, plus the thin Hugging Face wrappers of ``remote_template/``.

Why copy instead of re-implementing: the exported model then runs the very code we trained with, so logits match
exactly and there is one source of truth. Hugging Face's dynamic-module loader follows ``from .x import y`` between
files of the same directory, so ``model/attention/kernels.py`` becomes ``ours_attention_kernels.py`` and
``from model.attention.kernels import KERNELS`` becomes ``from .ours_attention_kernels import KERNELS``.
Only the modules reachable from ``model/bert.py`` are copied (the transitive closure of its ``model.*`` imports).
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import sys
from pathlib import Path

import torch

from model.attention.band import dense_mask
from model.config import ModelConfig

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "model"
TEMPLATE_DIR = Path(__file__).resolve().parent / "remote_template"
ENTRY_MODULES = ("model.bert", "model.config")
MODEL_TYPE = "sparsebert"
"""``model_type`` of exported custom-code configs."""
BASE_PREFIX = "sparsebert"
"""``base_model_prefix`` of the exported classes: head models hold the encoder as ``self.sparsebert``."""
LAYOUT_PREFIX = "sparse_layouts."
"""Persistent buffers holding each sparse layer's master layout (random layouts must not be re-drawn)."""
TOKEN_MASK_PREFIX = "token_masks."
"""Persistent buffers holding each layer's SparseBERT token mask, bool ``[H, n, n]`` (random patterns and masks
from files travel inside the export; the exported code never re-draws or reads them)."""
MASK_FILE = "token_masks.pt"
"""A ``pattern: file`` mask is also written into the export under this name (``token_masks_layer{i}.pt`` for a
per-layer one) and the exported config points at it relatively, never at the training machine's path."""
AUTO_MAP = {
    "AutoConfig": "configuration_sparsebert.SparseBertConfig",
    "AutoModel": "modeling_sparsebert.SparseBertModel",
    "AutoModelForMaskedLM": "modeling_sparsebert.SparseBertForMaskedLM",
    "AutoModelForPreTraining": "modeling_sparsebert.SparseBertForMaskedLM",
    "AutoModelForSequenceClassification": "modeling_sparsebert.SparseBertForSequenceClassification",
    "AutoModelForQuestionAnswering": "modeling_sparsebert.SparseBertForQuestionAnswering",
}


class ExportError(RuntimeError):
    """The model code cannot be exported as self-contained remote code."""


EXPORTED_PACKAGES = ("model", "common")
"""Our packages whose modules travel with the export: the model and the base layer it imports (common/)."""


def flat_name(module: str) -> str:
    """``model.attention.kernels`` -> ``ours_attention_kernels``; ``common.strict`` -> ``ours_common_strict``."""
    parts = module.split(".")
    if parts[0] not in EXPORTED_PACKAGES or len(parts) < 2:
        raise ExportError(f"not a module of our model or common package: {module!r}")
    return "ours_" + "_".join(parts[1:] if parts[0] == "model" else parts)


def _module_file(module: str) -> Path:
    rel = Path(*module.split("."))
    for cand in (REPO / rel.with_suffix(".py"), REPO / rel / "__init__.py"):
        if cand.is_file():
            return cand
    raise ExportError(f"cannot find the source of {module!r} under {REPO}")


def _model_imports(path: Path) -> list[str]:
    """Every ``model.*`` / ``common.*`` module imported anywhere in ``path`` (top level or inside functions)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            root = node.module.split(".")[0]
            if node.module in EXPORTED_PACKAGES:
                raise ExportError(f"{path}: 'from {root} import ...' cannot be flattened; import from the submodule")
            if root in EXPORTED_PACKAGES:
                out.append(node.module)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in EXPORTED_PACKAGES:
                    raise ExportError(f"{path}: 'import {a.name}' cannot be flattened; use 'from {a.name} import ...'")
    return out


def module_closure(entries: tuple[str, ...] = ENTRY_MODULES) -> list[str]:
    """The ``model.*`` and ``common.*`` modules the entry modules need, sorted."""
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        todo.extend(_model_imports(_module_file(m)))
    return sorted(seen)


_FROM_RE = re.compile(r"^(\s*)from\s+((?:model|common)(?:\.\w+)+)\s+import\b", re.MULTILINE)


def rewrite_imports(source: str) -> str:
    """Absolute ``from model.x.y import`` -> relative ``from .ours_x_y import`` (``common.x`` -> ``.ours_common_x``;
    HF's loader follows these)."""
    return _FROM_RE.sub(lambda m: f"{m.group(1)}from .{flat_name(m.group(2))} import", source)


def _check_external_imports(path: Path) -> None:
    """Exported code may import only the standard library, torch and transformers."""
    allowed = {"torch", "transformers"} | set(sys.stdlib_module_names)
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        for n in names:
            if n.split(".")[0] not in allowed:
                raise ExportError(
                    f"{path.name} imports {n!r}; exported model code may depend only on torch, "
                    "transformers and the standard library"
                )


def copy_model_code(out_dir: str | Path) -> list[str]:
    """Write the flattened model modules and the HF wrappers into ``out_dir``; returns the file names written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for m in module_closure():
        src = _module_file(m)
        text = rewrite_imports(src.read_text())
        header = f"# Copied from {src.relative_to(REPO)} by tools/hf_export (imports made relative). Do not edit.\n"
        dst = out / f"{flat_name(m)}.py"
        dst.write_text(header + text)
        written.append(dst.name)
    for t in sorted(TEMPLATE_DIR.glob("*.py")):
        shutil.copyfile(t, out / t.name)
        written.append(t.name)
    for name in written:
        _check_external_imports(out / name)
        leftover = re.search(r"^\s*(from|import)\s+(model|common)\b", (out / name).read_text(), re.MULTILINE)
        if leftover:
            raise ExportError(f"{name}: an absolute import of our package survived flattening: {leftover.group(0)!r}")
    return written


# ----------------------------------------------------------------------------------------------- token masks
def token_mask_state(model) -> dict[str, torch.Tensor]:
    """``{"layer{i}": bool [H, n, n]}`` of every layer with a fixed SparseBERT token mask (the mask the attention
    really applies, cropped to its length n; layers without one and DAM's learned mask are left out)."""
    out = {}
    for i, layer in enumerate(model.bert.encoder.layers):
        core = layer.attention.core
        if core.fixed_token_mask is not None:
            n = core.max_seq_length
            out[f"layer{i}"] = dense_mask(core.fixed_token_mask)[:, :n, :n].detach().cpu().bool().clone()
    return out


def _uses_top_level_mask(config: ModelConfig, i: int) -> bool:
    per = config.attention.per_layer
    return per is None or "token_mask" not in per[i]


def export_model_config(config: ModelConfig, token_masks: dict[str, torch.Tensor], out_dir: str | Path) -> dict:
    """Our config dict for the export: every ``pattern: file`` token mask is written into ``out_dir`` (our
    ``save_masks`` format) and its path made relative to the export directory."""
    from model.attention.sparsebert import save_masks

    d = config.to_dict()
    att = d["attention"]
    top = att.get("token_mask")
    if top is not None and top.get("pattern") == "file":
        masks = {k: v for k, v in token_masks.items() if _uses_top_level_mask(config, int(k[len("layer") :]))}
        if masks:
            save_masks(str(Path(out_dir) / MASK_FILE), masks)
        att["token_mask"] = {**top, "path": MASK_FILE}
    for i, entry in enumerate(att.get("per_layer") or []):
        tm = entry.get("token_mask")
        if tm is not None and tm.get("pattern") == "file":
            name = f"token_masks_layer{i}.pt"
            save_masks(str(Path(out_dir) / name), {f"layer{i}": token_masks[f"layer{i}"]})
            entry["token_mask"] = {**tm, "path": name}
    return d


def resolve_mask_paths(config_dict: dict, base: str | Path) -> dict:
    """Relative ``pattern: file`` paths of an exported config -> absolute paths under ``base`` (the export dir)."""
    d = json.loads(json.dumps(config_dict))
    att = d.get("attention") or {}
    tms = [att.get("token_mask")] + [e.get("token_mask") for e in att.get("per_layer") or []]
    for tm in tms:
        if tm is not None and tm.get("pattern") == "file" and tm.get("path") and not Path(tm["path"]).is_absolute():
            tm["path"] = str(Path(base, tm["path"]).resolve())  # (--to-ds rewrites it from the stored masks)
    return d


# ----------------------------------------------------------------------------------------------- weights
def to_remote_state_dict(
    state_dict: dict[str, torch.Tensor], layout_state: dict | None, token_masks: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Our ``BertForPreTraining`` state dict -> the keys of the exported ``SparseBertForMaskedLM``.

    The exported classes hold our ``BertModel`` as ``sparsebert.bert`` and our ``PreTrainingHeads`` as ``cls``;
    master layouts become persistent buffers ``sparsebert.sparse_layouts.layer{i}``, token masks
    ``sparsebert.token_masks.layer{i}`` (DAM's ``bert.dam.alpha`` and DIET's ``bert.positional_attention.*`` are
    ordinary parameters and keep their names).
    """
    out = {}
    for k, v in state_dict.items():
        if k.startswith("bert."):
            out[f"{BASE_PREFIX}.{k}"] = v
        elif k.startswith("cls."):
            out[k] = v
        else:
            raise ExportError(f"unexpected weight {k!r}: neither under bert. nor cls.")
    for layer, lay in (layout_state or {}).items():
        if lay is not None:
            out[f"{BASE_PREFIX}.{LAYOUT_PREFIX}{layer}"] = lay.to(torch.int64).contiguous()
    for layer, m in (token_masks or {}).items():
        out[f"{BASE_PREFIX}.{TOKEN_MASK_PREFIX}{layer}"] = m.to(torch.bool).contiguous()
    return out


def from_remote_state_dict(remote: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict, dict]:
    """Inverse of :func:`to_remote_state_dict`: (our state dict, layout state of the sparse layers, token masks)."""
    sd, layouts, masks = {}, {}, {}
    lay_prefix = f"{BASE_PREFIX}.{LAYOUT_PREFIX}"
    mask_prefix = f"{BASE_PREFIX}.{TOKEN_MASK_PREFIX}"
    for k, v in remote.items():
        if k.startswith(lay_prefix):
            layouts[k[len(lay_prefix) :]] = v
        elif k.startswith(mask_prefix):
            masks[k[len(mask_prefix) :]] = v.bool()
        elif k.startswith(f"{BASE_PREFIX}."):
            sd[k[len(BASE_PREFIX) + 1 :]] = v
        elif k.startswith("cls."):
            sd[k] = v
        else:
            raise ExportError(
                f"unexpected weight {k!r} in a {MODEL_TYPE} export (task heads cannot go back to "
                "our pre-training model)"
            )
    return sd, layouts, masks
