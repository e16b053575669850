"""The trainer's checkpoint part: where a run resumes from (rank 0 decides, every rank confirms), loading it,
saving (the non-finite refusal first, the run's settings as ``config.toml``, the commit marker last, retention), and
the end-of-run export of learned DAM masks. The file format and the crash-safe save are pretrain/checkpoint.py's;
this object holds the run's settings and hook so the trainer's loop only says *when*.
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch
from deepspeed.checkpoint.constants import (
    UNIVERSAL_CHECKPOINT_INFO,
    UNIVERSAL_CHECKPOINT_VERSION_KEY,
    UNIVERSAL_CHECKPOINT_VERSION_VALUE,
)

from common.errors import write_errors
from common.outputs import check_dir_writable, check_not_input
from pretrain import checkpoint, resize, resume
from pretrain.args import ArgsError, RunConfig
from pretrain.distributed import DistInfo, broadcast_module_state, rank0_result
from pretrain.faults import Faults
from pretrain.parallelize import build_attention_plans, gathered

RUN_CONFIG_FILE = "config.toml"
"""The run's resolved settings, written into each checkpoint beside DeepSpeed's files (checksummed by the marker)."""


class NonFiniteLossError(RuntimeError):
    """A NaN/inf loss in bf16/fp32 (fp16 overflows are skipped by the loss scaler instead), or a NaN/inf gradient
    norm before a save where DeepSpeed applied that update (bf16.check_grad_overflow off)."""


def check_checkpoint_dirs(run: RunConfig) -> None:
    """Before any work: a --load that does not exist is a typo unless it is --save (the documented first run of
    ``--save X --load X``), and --save must be writable (a read-only one failed at the first save, hours in) and
    never one of the inputs or a directory above one (common/outputs.py)."""
    ck, data = run.checkpoint, run.data
    if ck.load and not os.path.exists(ck.load):
        if not ck.save or os.path.abspath(ck.load) != os.path.abspath(ck.save):
            raise ArgsError(
                f"--load {ck.load}: no such directory; check the path (a first run that saves and resumes in one "
                "place gives the same directory to --save and --load)"
            )
    if ck.load and os.path.exists(ck.load) and not os.path.isdir(ck.load):
        raise ArgsError(f"--load {ck.load} is a file; give the checkpoint directory (it holds `latest`)")
    if ck.save:
        inputs = [("--data-path", p + e) for _, p in data.blend for e in (".bin", ".idx")]
        inputs += [("--vocab-file", data.vocab_file), ("--tokenizer-model", data.tokenizer_model)]
        check_not_input(ck.save, "--save", inputs)
        check_dir_writable(ck.save, "--save")  # every rank probes (its own temporary name): all refuse alike


@dataclasses.dataclass
class ResumePoint:
    """What --load resolved to, before anything is built from it (:meth:`Checkpointer.find`)."""

    tag: str | None
    """The complete checkpoint every rank agreed on (None: start from scratch)."""
    client: dict[str, Any] | None
    """Its client state (iteration, consumed samples, model config, layout state, world size)."""
    resuming: bool
    """A real resume (a tag and not --finetune): iteration, optimizer, scheduler and RNG continue."""
    load_tag: str | None
    """The tag DeepSpeed loads: ``tag``, or the universal checkpoint made from it for another world size."""
    saved_world: int
    """Ranks of the run that saved it (this run's when not resuming)."""
    plan: Any = None
    """pretrain.resume's plan: schedule and optimizer settings to install, notes to print."""

    @property
    def iteration(self) -> int:
        """The step the run continues after (0: from scratch or --finetune)."""
        return int(self.client["iteration"]) if self.resuming else 0

    @property
    def consumed_samples(self) -> int:
        return int(self.client["consumed_train_samples"]) if self.resuming else 0


class Checkpointer:
    """Save and resume for one run: ``run`` (its --save/--load settings, the settings recorded in each checkpoint),
    ``ds`` (the DeepSpeed config read: precision, ZeRO stage), this rank's ``dist``, the run's fault hook (the one
    place a fault enters a save), ``say`` (rank 0's printer) and the model's config (model.config.ModelConfig:
    recorded in each checkpoint, compared on resume). ``run_config_text``, when given, is written as
    ``config.toml`` into every checkpoint before its commit marker."""

    def __init__(
        self,
        run: RunConfig,
        ds: Any,
        dist: DistInfo,
        faults: Faults,
        say: Callable[[str], None],
        model_config: Any,
        run_config_text: str | None = None,
    ) -> None:
        self.run, self.ds, self.dist, self.faults, self.say = run, ds, dist, faults, say
        self.model_config = model_config
        self.run_config_text = run_config_text

    @property
    def config(self):
        return self.run.checkpoint

    # ------------------------------------------------------------------ resume
    def find(self) -> ResumePoint:
        """Which checkpoint --load means: rank 0 picks the newest committed one that verifies and every rank
        confirms it sees it (checkpoint.agree_on_resume). Checked first: the directories, and that every rank sees
        --save."""
        ck, world = self.config, self.dist.world_size
        check_checkpoint_dirs(self.run)
        if ck.save and world > 1:  # a node-local --save stops here, not at the first resume
            checkpoint.check_save_dir_shared(ck.save)
        tag, client = checkpoint.agree_on_resume(ck.load, strict=ck.strict_load) if ck.load else (None, None)
        if ck.load and tag is None:
            self.say(f"--load {ck.load}: no complete checkpoint there; starting from scratch")
        resuming = tag is not None and not ck.finetune
        saved_world = int(client.get("world_size") or world) if resuming else world
        return ResumePoint(tag, client, resuming, tag, saved_world)

    def plan(self, point: ResumePoint, schedule: Any, batch: Any) -> None:
        """For a real resume, before the model is built: the architecture must match, pretrain.resume plans the
        settings a resume may change, and another world size gets DeepSpeed's universal checkpoint to load."""
        if not point.resuming:
            return
        ck, world, client = self.config, self.dist.world_size, point.client
        where = f"{ck.load}/{point.tag}"
        checkpoint.check_architecture(where, client, self.model_config.to_dict())
        point.plan = resume.plan_resume(where, client, self.run, schedule, batch.global_batch, batch.micro)
        universal = resize.prepare(self.ds, ck.load, point.tag, client, world)
        if universal is not None:
            point.load_tag = universal
            self.say(
                f"{ck.load}/{point.tag} was saved by {point.saved_world} rank(s), this run has {world}: "
                f"ZeRO stage {client.get('zero_stage')} state re-partitioned through DeepSpeed's universal "
                f"checkpoint {ck.load}/{universal}"
            )
        if point.saved_world != world:
            self.say(
                f"global batch {batch.global_batch} kept ({batch.gas} accumulation step(s) of {batch.micro} on "
                f"{world} rank(s)); the per-rank RNG of {point.saved_world} rank(s) is not restored, "
                "so dropout masks differ from a run that kept its ranks"
            )

    def load(self, engine, point: ResumePoint) -> dict[str, Any] | None:
        """A resume's engine state (model, optimizer, scheduler, loss scaler), repaired where DeepSpeed's universal
        load is wrong, the learned layouts, and the planned schedule and optimizer settings. Returns the saved RNG
        state (None: not restored), which the caller sets once the data iterator is built."""
        if not point.resuming:
            return None
        ck, plan, system = self.config, point.plan, self.run.system
        restore_rng = point.saved_world == self.dist.world_size and not ck.no_load_rng
        rng = checkpoint.load(engine, ck.load, point.load_tag, point.client, restore_rng=restore_rng)
        if point.load_tag != point.tag:  # what DeepSpeed's universal load restores wrongly (pretrain/resize.py)
            for note in resize.repair_universal_load(engine.optimizer, ck.load, point.load_tag):
                self.say(f"universal load repaired: {note}")
        if point.client.get("layout_state") is not None:
            engine.module.load_layout_state(point.client["layout_state"])  # drops the plans apply_compile built
            if system.compile:
                build_attention_plans(engine.module, self.run.data.seq_length, self.dist.device)
        if plan.schedule is not None:
            resume.install_schedule(engine.lr_scheduler, plan.schedule)
        if plan.optimizer is not None:
            resume.install_optimizer_settings(engine.optimizer, plan.optimizer)
        self.say(
            f"resumed from {ck.load}/{point.tag}: iteration {point.iteration}, {point.consumed_samples} samples "
            "consumed"
        )
        for note in plan.notes:
            self.say(note)
        return rng

    def load_finetune_weights(self, model: torch.nn.Module, point: ResumePoint) -> None:
        """Phase 2 of a two-phase run: weights only, position table extended when the model got longer.

        Rank 0 reads the checkpoint (for ZeRO, every rank's shards: one consolidation instead of one per rank) and
        broadcasts the weights; the other ranks read nothing.
        """
        load_dir, tag, client = self.config.load, point.tag, point.client
        diffs = checkpoint.architecture_differences(
            client.get("model_config", {}), self.model_config.to_dict(), allow={"max_position_embeddings"}
        )
        if diffs:
            raise checkpoint.CheckpointError(
                f"--finetune {load_dir}/{tag}: the model differs beyond "
                "max_position_embeddings:\n  " + "\n  ".join(diffs)
            )

        def read() -> list[str]:
            weights = checkpoint.load_fp32_weights(load_dir, tag)
            extended = checkpoint.extend_position_embeddings(weights, model)
            model.load_state_dict(weights, strict=True)
            return extended

        for line in rank0_result(read):
            self.say(f"extended {line}")
        broadcast_module_state(model, self.dist.device)
        if client.get("layout_state") is not None:
            model.load_layout_state(client["layout_state"])
        self.say(f"--finetune: loaded weights of {load_dir}/{tag}; iteration, optimizer and LR warmup restart")

    # ------------------------------------------------------------------ save
    def save(self, engine, iteration: int, consumed_samples: int) -> str:
        """Every rank: refuse a state a non-finite update made (bf16 without the overflow check), then the
        crash-safe save of pretrain/checkpoint.py with this run's client state (and ``config.toml``); the RNG is
        captured first and restored after, so a run that saves continues exactly like one that does not."""
        if self.ds.applies_nonfinite_grads:
            self.refuse_nonfinite_update(engine, iteration)
        rng = checkpoint.rng_state()  # first: what follows may draw random numbers
        client = {
            "iteration": iteration,
            "consumed_train_samples": consumed_samples,
            "model_config": self.model_config.to_dict(),
            "args": self.run.to_dict(),
            "layout_state": engine.module.layout_state(),
            "world_size": self.dist.world_size,
            # what deepspeed.checkpoint.ds_to_universal requires of a checkpoint (a plain data-parallel model)
            UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE},
        }
        save_dir, ck = self.config.save, self.config
        text = {RUN_CONFIG_FILE: self.run_config_text} if self.run_config_text is not None else None
        with write_errors(f"--save {save_dir}: saving iteration {iteration}", save_dir):
            tag = checkpoint.save(engine, save_dir, iteration, client, ck.keep_last, rng, self.faults, text)
        checkpoint.set_rng_state(rng)
        self.say(f"saved {save_dir}/{tag}")
        return tag

    def refuse_nonfinite_update(self, engine, iteration: int) -> None:
        """With bf16.check_grad_overflow off (the shipped bf16 ZeRO-1/2 configs: that check reads the norm back every
        step) DeepSpeed applies an update whose gradients were not finite instead of skipping it, and the next step's
        loss stops the run. No checkpoint is written from such a state: one read of the last step's gradient norm
        before a save (all-reduced by DeepSpeed: every rank decides alike)."""
        norm = engine.get_global_grad_norm()
        if norm is not None and not math.isfinite(float(norm)):
            raise NonFiniteLossError(
                f"non-finite gradient norm at iteration {iteration} (bf16, check_grad_overflow false in "
                f"{self.ds.path}): the update was applied, so nothing is saved; every rank stopped. Last complete "
                f"checkpoint: {self.last_checkpoint_text()}"
            )

    def last_checkpoint_text(self) -> str:
        """Where a stopped run resumes from (for the error that stops it)."""
        save = self.config.save or self.config.load
        tag = checkpoint.find_resume_tag(save) if save else None
        return f"{save}/{tag} (resume with --load {save})" if tag else "none"

    def export_dam_masks(self, module: torch.nn.Module) -> Path | None:
        """A DAM search run ends by writing the binarized learned masks into --save (input of the fixed-mask
        stage). Every rank (gathering is a collective under ZeRO-3); returns the file on rank 0."""
        token_mask = getattr(module.config.attention, "token_mask", None) or {}
        if token_mask.get("pattern") != "dam" or not self.config.save:
            return None
        with gathered(module.mask_parameters(), self.ds.zero_stage):
            masks = module.export_learned_masks()
        if self.dist.rank != 0:
            return None
        from model.attention.sparsebert import save_masks

        path = Path(self.config.save, "learned_masks.pt")
        save_masks(str(path), masks)
        self.say(
            f"exported the learned DAM masks to {path} (train stage 2 with attention.token_mask = "
            f'{{"pattern": "file", "path": "{path}"}})'
        )
        return path
