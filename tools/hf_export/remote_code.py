"""Copy OUR model code (model/*.py, model/attention/*.py) into an export directory as flat, relatively-imported
modules, plus the thin Hugging Face wrappers of ``remote_template/``.

Why copy instead of re-implementing: the exported model then runs the very code we trained with, so logits match
exactly and there is one source of truth. Hugging Face's dynamic-module loader follows ``from .x import y`` between
files of the same directory, so ``model/attention/kernels.py`` becomes ``ours_attention_kernels.py`` and
``from model.attention.kernels import KERNELS`` becomes ``from .ours_attention_kernels import KERNELS``.

Only what the exported model runs is copied (:func:`plan_export`): starting from the names the wrappers in
``remote_template/`` import, the top-level definitions they reach through names and imports are kept, module by
module; a definition nothing kept refers to (e.g. DeepSpeed's compatibility classes next to our attention module)
is left out, and so is an import only such definitions used, and a module nothing kept imports. Statements with
effects at import (registrations by decorator, side-effect imports of kernel modules, module-level calls) are
always kept.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
import sys
from pathlib import Path
from typing import Callable

import torch

from model.attention.band import dense_mask
from model.bert import BertForPreTraining, layer_token_mask
from model.config import ModelConfig

REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = REPO / "model"
TEMPLATE_DIR = Path(__file__).resolve().parent / "remote_template"
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
    "AutoModelForTokenClassification": "modeling_sparsebert.SparseBertForTokenClassification",
    "AutoModelForMultipleChoice": "modeling_sparsebert.SparseBertForMultipleChoice",
}


class ExportError(RuntimeError):
    """The model code cannot be exported as self-contained remote code."""


EXPORTED_PACKAGES = ("model", "common")
"""Our packages whose modules travel with the export: the model and the base layer it imports (common/)."""


def flat_name(module: str) -> str:
    """``model.attention.kernels`` -> ``ours_attention_kernels``; ``common.strict_config`` ->
    ``ours_common_strict_config``."""
    parts = module.split(".")
    if parts[0] not in EXPORTED_PACKAGES or len(parts) < 2:
        raise ExportError(f"not a module of our model or common package: {module!r}")
    return "ours_" + "_".join(parts[1:] if parts[0] == "model" else parts)


def _module_file(module: str, root: Path = REPO) -> Path:
    rel = Path(*module.split("."))
    for cand in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if cand.is_file():
            return cand
    raise ExportError(f"cannot find the source of {module!r} under {root}")


def _model_imports(path: Path, tree: ast.Module | None = None) -> list[str]:
    """Every ``model.*`` / ``common.*`` module imported anywhere in ``path`` (top level or inside functions);
    ``tree``: the file already parsed."""
    out = []
    for node in ast.walk(tree or ast.parse(path.read_text(), str(path))):
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


_PURE_DECORATORS = {"dataclass", "dataclasses.dataclass", "functools.cache", "functools.lru_cache", "torch.no_grad"}
"""Decorators with no effect beyond the definition they decorate: a definition carrying only these may be left
out; any other decorator (``@register_kernel``, ``@register_pattern``, ...) registers something, so it stays."""
_IDENT = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _dotted(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


class _Stmt:
    """One top-level statement of a module: the names it binds and uses, and the imports of our code inside it."""

    def __init__(self, node: ast.stmt):
        self.node = node
        self.binds: set[str] = set()
        self.is_import = isinstance(node, (ast.Import, ast.ImportFrom))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.binds.add(node.name)
            self.prunable = all(_dotted(d) in _PURE_DECORATORS for d in node.decorator_list)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            self.binds |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            calls = node.value is not None and any(isinstance(n, ast.Call) for n in ast.walk(node.value))
            self.prunable = not calls
        elif self.is_import:
            self.binds |= {(a.asname or a.name).split(".")[0] for a in node.names}
            self.prunable = not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        else:  # docstrings, module-level calls, if/try blocks: kept
            self.prunable = False
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        # runs something at import beyond binding names: a registration by decorator, a module-level call
        self.effect = not self.prunable and not self.is_import and not docstring and not isinstance(node, ast.Assign)
        self.uses: set[str] = set()
        self.imports: list[tuple[str, set[str]]] = []  # (our module, names), top level or inside functions
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                self.uses.add(n.id)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and _IDENT.fullmatch(n.value):
                self.uses |= set(n.value.split("."))  # getattr(x, "name"), "Forward" references
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
                if n.module.split(".")[0] in EXPORTED_PACKAGES:
                    self.imports.append((n.module, {a.name for a in n.names}))
        self.uses -= self.binds if not self.is_import else set()

    def lines(self) -> range:
        """The source lines (0-based) of the statement, decorators included."""
        first = min([self.node.lineno, *(d.lineno for d in getattr(self.node, "decorator_list", []))])
        return range(first - 1, self.node.end_lineno)


def _kept(stmts: list[_Stmt], requested: set[str], effects: Callable[[str], bool]) -> list[bool]:
    """Which statements of a module the requested names need (see the module docstring). An import whose names
    the module never uses is a re-export or an import for its effects: kept when the imported module has effects at
    import (``effects(module)``, e.g. kernels registering themselves) or is not ours, else left to the requests."""
    used_anywhere = set().union(*(s.uses for s in stmts if not s.is_import)) if stmts else set()
    keep = [
        not s.prunable
        or (
            s.is_import and not s.binds & used_anywhere and (not s.imports or any(effects(src) for src, _ in s.imports))
        )
        for s in stmts
    ]
    changed = True
    while changed:
        needed = set(requested).union(*(s.uses for s, k in zip(stmts, keep) if k))
        grown = [k or bool(s.binds & needed) for s, k in zip(stmts, keep)]
        changed, keep = grown != keep, grown
    return keep


def plan_export(template_dir: Path = TEMPLATE_DIR, root: Path = REPO) -> dict[str, list[bool]]:
    """``{module: which of its top-level statements to copy}`` for the modules (of our packages under ``root``) the
    exported model runs, starting from the ``from .ours_x import A, B`` lines of the wrappers in ``template_dir``."""
    by_flat = {}
    for pkg in EXPORTED_PACKAGES:
        for f in (root / pkg).rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            mod = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            if mod.count("."):
                by_flat[flat_name(mod)] = mod
    requested: dict[str, set[str]] = {}
    for t in sorted(template_dir.glob("*.py")):
        for n in ast.walk(ast.parse(t.read_text(), str(t))):
            if isinstance(n, ast.ImportFrom) and n.level == 1 and (n.module or "").startswith("ours_"):
                if n.module not in by_flat:
                    raise ExportError(f"{t.name} imports .{n.module}, which is none of our modules")
                requested.setdefault(by_flat[n.module], set()).update(a.name for a in n.names)
    parsed: dict[str, list[_Stmt]] = {}

    def stmts(mod: str) -> list[_Stmt]:
        if mod not in parsed:
            path = _module_file(mod, root)
            tree = ast.parse(path.read_text(), str(path))
            _model_imports(path, tree)  # refuses imports that cannot be flattened
            parsed[mod] = [_Stmt(n) for n in tree.body]
        return parsed[mod]

    @functools.cache
    def effects(mod: str, _seen: frozenset = frozenset()) -> bool:
        """Importing ``mod`` runs something (itself, or through a module it imports whose names it never uses)."""
        if mod in _seen:
            return False
        own = stmts(mod)
        used = set().union(*(s.uses for s in own if not s.is_import))
        return any(s.effect for s in own) or any(
            effects(src, _seen | {mod}) for s in own if s.is_import and not s.binds & used for src, _ in s.imports
        )

    plan: dict[str, list[bool]] = {}
    changed = True
    while changed:
        changed = False
        for mod in sorted(requested):
            plan[mod] = _kept(stmts(mod), requested[mod], effects)
            for s, k in zip(parsed[mod], plan[mod]):
                for src, names in s.imports if k else ():
                    if not names <= requested.get(src, set()):
                        requested.setdefault(src, set()).update(names)
                        changed = True
    return plan


def module_closure() -> list[str]:
    """The ``model.*`` and ``common.*`` modules the exported model runs, sorted."""
    return sorted(plan_export())


def pruned_source(module: str, keep: list[bool], root: Path = REPO) -> tuple[str, list[str]]:
    """The module's source without the statements ``keep`` leaves out, and the names those defined."""
    text = _module_file(module, root).read_text()
    lines = text.splitlines(keepends=True)
    stmts = [_Stmt(n) for n in ast.parse(text).body]
    drop, dropped = set(), []
    for s, k in zip(stmts, keep):
        if not k:
            drop.update(s.lines())
            dropped += sorted(s.binds)
    return "".join(line for i, line in enumerate(lines) if i not in drop), dropped


_FROM_RE = re.compile(r"^(\s*)from\s+((?:model|common)(?:\.\w+)+)\s+import\b", re.MULTILINE)


def rewrite_imports(source: str) -> str:
    """Absolute ``from model.x.y import`` -> relative ``from .ours_x_y import`` (``common.x`` -> ``.ours_common_x``;
    HF's loader follows these)."""
    return _FROM_RE.sub(lambda m: f"{m.group(1)}from .{flat_name(m.group(2))} import", source)


def _check_external_imports(path: Path, text: str | None = None) -> None:
    """Exported code may import only the standard library, torch and transformers (``text``: the file's source, when
    it is not written yet)."""
    allowed = {"torch", "transformers"} | set(sys.stdlib_module_names)
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
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


def _source_digest() -> str:
    """sha256 of every file the exported code is made from (our packages' modules and the wrappers): the key of
    :func:`_flattened_code`, so a changed source gives a new copy."""
    h = hashlib.sha256()
    files = [p for pkg in EXPORTED_PACKAGES for p in (REPO / pkg).rglob("*.py")] + list(TEMPLATE_DIR.glob("*.py"))
    for f in sorted(files):
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=2)
def _flattened_code(digest: str) -> tuple[tuple[str, str], ...]:  # noqa: ARG001  (the cache key)
    """``(file name, text)`` of every file of the exported code, checked. The same for every model (the code does
    not depend on the config), so one process exporting many (a checkpoint sweep, the tests) plans and parses the
    package once per version of its sources: the plan parses each module several times, seconds of CPU per export."""
    files = []
    for m, keep in sorted(plan_export().items()):
        src = _module_file(m)
        text, dropped = pruned_source(m, keep)
        header = f"# Copied from {src.relative_to(REPO)} by tools/hf_export (imports made relative). Do not edit.\n"
        if dropped:
            header += f"# Left out (the exported model never uses them): {', '.join(dropped)}\n"
        files.append((f"{flat_name(m)}.py", header + rewrite_imports(text)))
    files += [(t.name, t.read_text()) for t in sorted(TEMPLATE_DIR.glob("*.py"))]
    for name, text in files:
        _check_external_imports(Path(name), text)
        leftover = re.search(r"^\s*(from|import)\s+(model|common)\b", text, re.MULTILINE)
        if leftover:
            raise ExportError(f"{name}: an absolute import of our package survived flattening: {leftover.group(0)!r}")
    return tuple(files)


def copy_model_code(out_dir: str | Path) -> list[str]:
    """Write the flattened model modules and the HF wrappers into ``out_dir``; returns the file names written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = _flattened_code(_source_digest())
    for name, text in files:
        (out / name).write_text(text)
    return [name for name, _ in files]


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


def config_token_masks(config: ModelConfig) -> dict[str, torch.Tensor]:
    """:func:`token_mask_state` of the model ``config`` describes, without building it (the export of a checkpoint:
    fixed masks are not saved with the weights; random patterns are drawn from the config's seed)."""
    out = {}
    for i in range(config.num_layers):
        m = layer_token_mask(config, i)
        if m is not None:
            n = m.shape[-1]
            out[f"layer{i}"] = dense_mask(m)[:, :n, :n].detach().cpu().bool().clone()
    return out


def weight_problems(config: ModelConfig, state_dict: dict[str, torch.Tensor]) -> list[str]:
    """What differs between ``state_dict`` and the parameters of the model ``config`` describes: missing and
    unexpected names, other shapes. Checked on a skeleton on the meta device (no memory, no initialisation); fixed
    token masks are left out of it, since they hold no parameter and some are drawn from data."""
    d = config.to_dict()
    att = d["attention"]
    for entry in [att, *(att.get("per_layer") or [])]:
        tm = entry.get("token_mask")
        if tm is not None and tm.get("pattern") != "dam":
            entry["token_mask"] = None
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in BertForPreTraining(ModelConfig.from_dict(d)).state_dict().items()}
    have = {k: tuple(v.shape) for k, v in state_dict.items()}
    problems = [f"missing {k}" for k in want if k not in have] + [f"unexpected {k}" for k in have if k not in want]
    problems += [f"{k}: shape {have[k]}, the config gives {want[k]}" for k in want if k in have and have[k] != want[k]]
    return problems


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
