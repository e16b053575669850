"""Reading a DeepSpeed JSON config: our two legacy blocks, batch-size arithmetic, and errors that name the file.

DeepSpeed 0.19.8 raises on the removed `sparse_attention` and `amp` blocks and silently ignores unknown top-level
keys. We read `sparse_attention` ourselves (it becomes the model's AttentionConfig.sparsity), refuse `amp` with the
replacement to use, and reject unknown top-level keys so a typo never trains with a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from common.errors import UserError
from common.inputs import read_json_object

if TYPE_CHECKING:
    from pretrain.micro_batch import MicroBatchChoice


class DSConfigError(UserError, ValueError):
    """A ds_config problem; the message always names the file."""


# Top-level blocks DeepSpeed 0.19.8 reads that are not spelled in deepspeed.runtime.constants.
_EXTRA_KNOWN_KEYS = {
    "zero_optimization",
    "activation_checkpointing",
    "flops_profiler",
    "tensorboard",
    "wandb",
    "csv_monitor",
    "comet",
    "aio",
    "data_efficiency",
    "compile",
    "comms_logger",
    "autotuning",
    "monitor_config",
    "hybrid_engine",
    "pipeline",
    "timers",
    "nvme_path",
    "weight_quantization",
    "zenflow",
}


def _known_top_level_keys() -> set[str]:
    import deepspeed.runtime.constants as constants  # heavy import only when a config is read

    known = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)}
    return known | _EXTRA_KNOWN_KEYS


@dataclass
class ResolvedDSConfig:
    """A ds_config ready for deepspeed.initialize, plus what we took out of it."""

    path: str
    """The JSON file it came from (for messages)."""
    config: dict[str, Any]
    """The dict handed to deepspeed.initialize (legacy blocks removed, batch sizes filled in)."""
    sparse_attention: dict[str, Any] | None = None
    """The legacy `sparse_attention` block, for the model's AttentionConfig.sparsity (None when absent)."""
    notes: list[str] = field(default_factory=list)
    """What we changed, printed once by rank 0."""
    clip_grad: float = 0.0
    """The gradient-norm bound the trainer applies itself where :attr:`trainer_clips` (the config's
    ``gradient_clipping``, DeepSpeed's default 1.0 when absent, moved here by :func:`apply_clip_grad`, which sets it
    to 0 for DeepSpeed); 0: no clipping by the trainer."""

    @property
    def precision(self) -> str:
        """'fp16', 'bf16' or 'fp32': the dtype the engine computes in (a torch_autocast block counts as its dtype)."""
        return precision_of(self.config)

    @property
    def precision_summary(self) -> str:
        """The precision as logs and checkpoint summaries say it (``bf16 (torch_autocast)`` for autocast)."""
        return precision_summary(self.config)

    @property
    def zero_stage(self) -> int:
        return int(self.config.get("zero_optimization", {}).get("stage", 0))

    @property
    def trainer_clips(self) -> bool:
        """ZeRO stage 0 without DeepSpeed's bf16/fp16 optimizer (fp32, or bf16 through torch_autocast): there
        DeepSpeed clips with a loop over the parameter tensors on the host (runtime/utils.py clip_grad_norm_: a norm
        kernel per tensor, and no norm reported), so the trainer clips instead with torch's clip_grad_norm_ (on a
        GPU one multi-tensor norm and scale) and reports that norm (pretrain/parallelize.py clip_gradients)."""
        from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config

        ds_optimizer = get_float16_config(self.config).enabled or get_bfloat16_config(self.config).enabled
        return self.zero_stage == 0 and not ds_optimizer

    @property
    def applies_nonfinite_grads(self) -> bool:
        """True when DeepSpeed applies an update whose gradients are not finite instead of skipping it: bf16 under
        ZeRO 1-2 with ``bf16.check_grad_overflow`` false (that check is what reads the norm back every step)."""
        return self.precision == "bf16" and self.zero_stage in (1, 2) and not bf16_checks_grad_overflow(self.config)


def precision_of(cfg: dict[str, Any]) -> str:
    """The compute precision of a ds_config dict, read by DeepSpeed's own parsers, so every spelling DeepSpeed
    accepts counts (``"bf16"`` and its older name ``"bfloat16"``, ``"torch_autocast"`` with its dtype)."""
    from deepspeed.runtime.config import get_torch_autocast_dtype, get_torch_autocast_enabled
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config

    if get_float16_config(cfg).enabled:
        return "fp16"
    if get_bfloat16_config(cfg).enabled:
        return "bf16"
    if get_torch_autocast_enabled(cfg):
        return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(get_torch_autocast_dtype(cfg), "fp32")
    return "fp32"


def bf16_checks_grad_overflow(cfg: dict[str, Any]) -> bool:
    """DeepSpeed's ``bf16.check_grad_overflow`` (default true), read by its own parser."""
    from deepspeed.runtime.precision_config import get_bfloat16_config

    return get_bfloat16_config(cfg).check_grad_overflow


def host_sync_notes(cfg: dict[str, Any], path: str) -> list[str]:
    """Start-up notes for the DeepSpeed settings that make the host wait for the device inside every step (the
    shipped configs turn them off; a user config that keeps them is told, not overridden). docs/training.md,
    "Host syncs in the step", lists them with the counts tests/test_host_syncs.py measures."""
    from deepspeed.utils.config import get_timers_config

    notes = []
    timers = get_timers_config(cfg)
    if timers.enabled and timers.synchronized:
        notes.append(
            f"{path}: timers.throughput is on (DeepSpeed's default): it synchronizes the device at every "
            "micro-batch's forward and step (two host syncs each); this trainer measures tokens/s itself: set "
            '"timers": {"throughput": {"enabled": false}} (docs/training.md, host syncs)'
        )
    prec = precision_of(cfg)
    stage = int(cfg.get("zero_optimization", {}).get("stage", 0))
    if prec == "bf16" and stage in (1, 2) and bf16_checks_grad_overflow(cfg):
        notes.append(
            f"{path}: bf16.check_grad_overflow is on (DeepSpeed's default): ZeRO's step reads the overflow flag and "
            "the gradient norm back (host syncs every step) to skip a step with non-finite gradients; this trainer "
            'already stops every rank on a non-finite loss: set "check_grad_overflow": false in the bf16 block to '
            "drop them (docs/training.md, host syncs)"
        )
    return notes


def precision_summary(cfg: dict[str, Any]) -> str:
    from deepspeed.runtime.config import get_torch_autocast_enabled

    prec = precision_of(cfg)
    return f"{prec} (torch_autocast)" if prec != "fp32" and get_torch_autocast_enabled(cfg) else prec


def _check_precision_blocks(cfg: dict[str, Any], path: str) -> None:
    """Refuse what DeepSpeed would read differently from what the file seems to say, naming the keys."""
    from deepspeed.runtime.config import get_torch_autocast_dtype, get_torch_autocast_enabled
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config

    for key in ("fp16", "bf16", "bfloat16", "torch_autocast"):
        if key in cfg and not isinstance(cfg[key], dict):
            raise DSConfigError(f"{path}: '{key}' must be an object like {{\"enabled\": true}}")
        if key in cfg and not isinstance(cfg[key].get("enabled", False), bool):
            raise DSConfigError(
                f"{path}: '{key}.enabled' is {cfg[key]['enabled']!r}; DeepSpeed reads anything but true as false "
                '("auto" is filled in by Hugging Face\'s Trainer integration, not by DeepSpeed): write true or false'
            )
    if "bf16" in cfg and "bfloat16" in cfg:
        raise DSConfigError(f"{path}: both 'bf16' and its old name 'bfloat16' are present; keep one ('bf16')")
    bf16 = "bf16" if "bf16" in cfg else "bfloat16"
    try:
        states = (
            ("fp16", get_float16_config(cfg).enabled),
            (bf16, get_bfloat16_config(cfg).enabled),
            ("torch_autocast", get_torch_autocast_enabled(cfg)),
        )
    except Exception as e:  # pydantic's ValidationError: a typo inside a block ("bf16": {"enabeld": true})
        raise DSConfigError(validation_message(e, path)) from e
    enabled = [name for name, on in states if on]
    if len(enabled) > 1:
        raise DSConfigError(f"{path}: {' and '.join(repr(k) for k in enabled)} are both enabled; enable at most one")
    if enabled == ["torch_autocast"]:
        dtype = get_torch_autocast_dtype(cfg)
        if dtype is None:
            raise DSConfigError(
                f"{path}: 'torch_autocast' has no 'dtype'; DeepSpeed would use the device's autocast default (fp16 "
                'on CUDA, bf16 on CPU): name it, e.g. "torch_autocast": {"enabled": true, "dtype": "bfloat16"}'
            )
        if dtype != torch.bfloat16:
            raise DSConfigError(
                f"{path}: 'torch_autocast' with dtype {dtype} is not supported by this trainer (its loss-scale, "
                'overflow and skip logic is built on DeepSpeed\'s \'fp16\' block): use "fp16": {"enabled": true} '
                'or "torch_autocast": {"enabled": true, "dtype": "bfloat16"}'
            )


def read_ds_config(path: str | Path) -> ResolvedDSConfig:
    """Parse the JSON file, strip `sparse_attention`, refuse `amp` and unknown top-level keys."""
    path = str(path)
    cfg = read_json_object(path, "", "a DeepSpeed config JSON file (see ds_configs/)", DSConfigError)
    if "amp" in cfg:
        raise DSConfigError(
            f"{path}: the 'amp' block (NVIDIA Apex AMP) is not supported by DeepSpeed 0.19 nor by this trainer; "
            'remove it and use "fp16": {"enabled": true} (dynamic loss scale) or "bf16": {"enabled": true}'
        )
    out = ResolvedDSConfig(path=path, config=cfg)
    if "sparse_attention" in cfg:
        block = cfg.pop("sparse_attention")
        if not isinstance(block, dict):
            raise DSConfigError(f"{path}: 'sparse_attention' must be an object, got {type(block).__name__}")
        from model.attention.deepspeed.ds_config import from_deepspeed_block

        out.sparse_attention = from_deepspeed_block(block)
        out.notes.append(
            f"{path}: read the legacy 'sparse_attention' block into the model's attention config "
            "and removed it before deepspeed.initialize"
        )
    unknown = sorted(set(cfg) - _known_top_level_keys())
    if unknown:
        raise DSConfigError(
            f"{path}: unknown top-level key(s) {unknown}; DeepSpeed 0.19.8 would silently ignore "
            "them. Fix the spelling or remove them (see docs/training.md for the accepted blocks)"
        )
    _check_precision_blocks(cfg, path)
    out.notes.extend(host_sync_notes(cfg, path))
    return out


def resolve_batch_sizes(
    ds: ResolvedDSConfig,
    micro_batch_size: int | str | None,
    global_batch_size: int | None,
    dp_world_size: int,
    choose: Callable[[list[int]], MicroBatchChoice] | None = None,
    ramp: list[int] | None = None,
) -> tuple[int, int, int]:
    """Fill train_micro_batch_size_per_gpu / gradient_accumulation_steps / train_batch_size consistently.

    Command-line values win over the file only when the file leaves them out; a conflict is an error naming both.
    ``micro_batch_size`` 'auto' keeps the global batch (the flag's or train_batch_size) and asks ``choose`` (given
    the per-rank batches, :func:`pretrain.micro_batch.per_rank_batches`) for the micro batch; its reason joins
    ``ds.notes``. Returns (micro, accumulation steps, global).
    """
    cfg, path = ds.config, ds.path

    def pick(flag_value: int | None, key: str, flag: str) -> int | None:
        file_value = cfg.get(key)
        if flag_value is not None and file_value is not None and int(file_value) != flag_value:
            raise DSConfigError(
                f"{path}: {key}={file_value} disagrees with {flag} {flag_value}; give it in one place only"
            )
        return flag_value if flag_value is not None else (int(file_value) if file_value is not None else None)

    glob = pick(global_batch_size, "train_batch_size", "--global-batch-size")
    gas = cfg.get("gradient_accumulation_steps")
    if micro_batch_size == "auto":
        micro = _auto_micro(ds, glob, gas, dp_world_size, choose, ramp)
    else:
        micro = pick(micro_batch_size, "train_micro_batch_size_per_gpu", "--micro-batch-size")
    if micro is None:
        raise DSConfigError(
            f"{path}: no micro batch size; pass --micro-batch-size or set train_micro_batch_size_per_gpu"
        )
    if glob is None:
        glob = micro * dp_world_size * int(gas or 1)
    if glob % (micro * dp_world_size):
        raise DSConfigError(
            f"global batch {glob} is not a multiple of micro batch {micro} x {dp_world_size} "
            f"data-parallel ranks (config {path}); change --global-batch-size or --micro-batch-size"
        )
    want_gas = glob // (micro * dp_world_size)
    if gas is not None and int(gas) != want_gas:
        raise DSConfigError(
            f"{path}: gradient_accumulation_steps={gas} but global batch {glob} / (micro {micro} x "
            f"{dp_world_size} ranks) = {want_gas}; remove it from the file (it is derived)"
        )
    cfg["train_micro_batch_size_per_gpu"] = micro
    cfg["gradient_accumulation_steps"] = want_gas
    cfg["train_batch_size"] = glob
    return micro, want_gas, glob


def _auto_micro(
    ds: ResolvedDSConfig,
    glob: int | None,
    gas: Any,
    dp_world_size: int,
    choose: Callable[[list[int]], MicroBatchChoice] | None,
    ramp: list[int] | None,
) -> int:
    """--micro-batch-size auto: the chooser's micro batch for the kept global batch (its reason noted)."""
    from pretrain.micro_batch import MicroBatchError, choose_micro_batch, per_rank_batches

    path = ds.path
    for key in ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        if ds.config.get(key) is not None:
            raise DSConfigError(
                f"{path}: {key}={ds.config[key]} fixes the micro batch, but --micro-batch-size auto chooses it; "
                "remove it from the file or give --micro-batch-size N"
            )
    if glob is None:
        raise DSConfigError(
            f"--micro-batch-size auto needs a global batch to keep: pass --global-batch-size or set train_batch_size "
            f"in {path}"
        )
    try:
        per_rank = per_rank_batches(glob, dp_world_size, ramp)
        choice = choose(per_rank) if choose is not None else choose_micro_batch(per_rank, "cpu")
    except MicroBatchError as e:
        raise DSConfigError(str(e)) from e
    ds.notes.append(
        f"{choice.reason}; global batch {glob} kept: {glob // (choice.micro * dp_world_size)} accumulation step(s) "
        f"x {choice.micro} x {dp_world_size} rank(s)"
    )
    return choice.micro


def apply_clip_grad(ds: ResolvedDSConfig, clip_grad: float | None) -> None:
    """--clip-grad fills gradient_clipping (the engine clips); a conflicting value in the file is an error. Where
    ``ds.trainer_clips`` the bound moves to ``ds.clip_grad`` instead (the trainer clips, DeepSpeed does not)."""
    if clip_grad is not None:
        file_value = ds.config.get("gradient_clipping")
        if file_value is not None and float(file_value) != clip_grad:
            raise DSConfigError(f"{ds.path}: gradient_clipping={file_value} disagrees with --clip-grad {clip_grad}")
        ds.config["gradient_clipping"] = clip_grad
    if ds.trainer_clips:
        from deepspeed.runtime.constants import GRADIENT_CLIPPING_DEFAULT  # 1.0: DeepSpeed clips unless told 0

        ds.clip_grad = float(ds.config.get("gradient_clipping", GRADIENT_CLIPPING_DEFAULT))
        ds.config["gradient_clipping"] = 0.0


def validate_with_deepspeed(ds: ResolvedDSConfig) -> None:
    """Let DeepSpeed's own validation (pydantic models, batch assertions) judge the config; errors name the file."""
    from deepspeed.runtime.config import DeepSpeedConfig

    try:
        DeepSpeedConfig(dict(ds.config))
    except Exception as e:  # DeepSpeed raises ValueError, AssertionError, pydantic errors, DeepSpeedConfigError
        raise DSConfigError(validation_message(e, ds.path)) from e


def validation_message(e: Exception, path: str) -> str:
    """One line for DeepSpeed's verdict on a config: a pydantic ValidationError names each bad key with its block
    (``bf16.enabeld: Extra inputs are not permitted``) instead of a multi-line dump; others keep their text."""
    errors = getattr(e, "errors", None)
    if callable(errors) and type(e).__name__ == "ValidationError":
        model = getattr(e, "title", "") or ""
        parts = []
        for err in errors():
            loc = ".".join(str(x) for x in err.get("loc", ()))
            hint = " (unknown key: check its spelling)" if err.get("type") == "extra_forbidden" else ""
            parts.append(f"{loc}: {err.get('msg')}{hint}")
        where = f" in {model}" if model else ""
        return f"DeepSpeed rejected the config {path}{where}: " + "; ".join(parts) + "; fix the key or value there"
    text = " ".join(str(e).split())
    return f"DeepSpeed rejected the config {path}: {type(e).__name__}: {text}"


def _sibling_configs(path: str, precision: str) -> list[str]:
    """The other-precision variants of a shipped config (`zero2_fp16.json` -> `zero2_bf16.json`, `zero2_fp32.json`)
    that exist next to it, best replacement first."""
    p = Path(path)
    if f"_{precision}" not in p.name:
        return []
    out = []
    for alt in {"fp16": ("bf16", "fp32"), "bf16": ("fp16", "fp32")}.get(precision, ()):
        cand = p.with_name(p.name.replace(f"_{precision}", f"_{alt}"))
        if cand.is_file():
            out.append(str(cand))
    return out


def gpus_support_bf16() -> bool:
    """Every visible GPU has bf16 hardware (compute capability 8.0+); precision_problem refuses bf16 below that."""
    import torch

    return all(torch.cuda.get_device_capability(i)[0] >= 8 for i in range(torch.cuda.device_count()))


def precision_problem(ds: ResolvedDSConfig) -> str | None:
    """Why this machine cannot run the config's precision (None when it can), decided before any rank starts work.

    DeepSpeed's accelerator makes the same decision inside deepspeed.initialize, but only after the model is built,
    with a traceback on every rank; we ask it first and name the file. On CPU, fp16 needs AVX512-FP16 or AMX (the
    accelerator asks `torch.ops.mkldnn._is_mkldnn_fp16_supported()`); on CUDA, bf16 needs compute capability 8.0+
    (Ampere): older GPUs only emulate it.
    """
    prec = ds.precision
    if prec == "fp32":
        return None
    import torch

    if torch.cuda.is_available():
        if prec == "bf16":
            major, minor = torch.cuda.get_device_capability()
            if major < 8:
                name = torch.cuda.get_device_name()
                return (
                    f"{ds.path} enables bf16, but {name} (compute capability {major}.{minor}) has no bf16 "
                    "hardware (needs 8.0+, A100/H100): it would run emulated, many times slower"
                )
        return None
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if prec == "fp16" and not acc.is_fp16_supported():
        return (
            f"{ds.path} enables fp16, which DeepSpeed cannot run on this CPU: fp16 on CPU needs AVX512-FP16 or "
            "AMX (torch.ops.mkldnn._is_mkldnn_fp16_supported() is False here)"
        )
    if prec == "bf16" and not acc.is_bf16_supported():
        return f"{ds.path} enables bf16, which DeepSpeed's {acc.device_name()} accelerator does not support here"
    return None


def check_compile_supported(ds: ResolvedDSConfig, compile_model: bool) -> None:
    """Raise DSConfigError for ``--compile`` under ZeRO-3: stage 3 gathers and frees every layer's parameters in
    hooks around its forward, which torch.compile of the module breaks its graph on (DeepSpeed compiles stage 3
    only through its separate DeepCompile path); the combination is untested here, so it is refused at start."""
    if compile_model and ds.zero_stage == 3:
        raise DSConfigError(
            f"{ds.path}: ZeRO stage 3 with --compile is not supported (stage 3 gathers parameters in hooks around "
            "every layer, untested under torch.compile); drop --compile or use a stage 0-2 config from ds_configs/"
        )


def check_precision_supported(ds: ResolvedDSConfig) -> None:
    """Raise DSConfigError (one line: file, reason, what to use instead) when the precision cannot run here."""
    problem = precision_problem(ds)
    if problem is None:
        return
    alts = _sibling_configs(ds.path, ds.precision)
    other = "a _bf16 or _fp32 config" if ds.precision == "fp16" else "a _fp16 or _fp32 config"
    hint = f"use {' or '.join(alts)}" if alts else f"use {other} from ds_configs/"
    raise DSConfigError(f"{problem}; {hint}")
