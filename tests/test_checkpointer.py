"""The trainer's checkpoint part alone (pretrain/checkpointer.py) on a real one-rank process group, a real tiny model
and real files: the save order (DeepSpeed's files, the RNG, ``config.toml``, then the fault hook, then the commit
marker and `latest`), retention, the RNG left as it was, the resume decision (fall back past a damaged checkpoint,
or refuse under --strict-load), and the refusal to save a state a non-finite update made.

The engine is a stand-in for DeepSpeed's file writing only: it writes the module's weights and the client state
into ``mp_rank_00_model_states.pt`` as DeepSpeed does (pretrain/checkpoint_reader.py reads them back); the save
through DeepSpeed itself is tests/test_train_resume.py's and tests/test_faults.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from model.bert import BertForPreTraining
from model.config import ModelConfig
from pretrain import checkpoint as ck
from pretrain import faults
from pretrain.args import ArgsError, parse_args
from pretrain.checkpointer import RUN_CONFIG_FILE, Checkpointer, NonFiniteLossError
from pretrain.ds_config import read_ds_config
from tests.one_rank import one_rank_group

REPO = Path(__file__).resolve().parents[1]
TOML = "[loop]\ntrain_iters = 4\n\n[checkpoints]\nkeep_last = 2\n"


class FilesEngine:
    """What a save and a resume ask of DeepSpeed's engine, writing the files DeepSpeed's ZeRO-0/1 save writes for
    the model (weights and client state in one ``torch.save``)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.grad_norm: torch.Tensor | None = torch.tensor(1.5)

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        assert save_latest is False  # `latest` is the checkpointer's, written after the marker
        Path(save_dir, tag).mkdir(parents=True, exist_ok=True)
        torch.save(
            {"module": self.module.state_dict(), **client_state}, Path(save_dir, tag, "mp_rank_00_model_states.pt")
        )

    def get_global_grad_norm(self):
        return self.grad_norm


class InSave(faults.Faults):
    """Records what the tag directory held when the hook ran (between the files and the marker)."""

    def __init__(self, save_dir: Path) -> None:
        self.save_dir, self.seen = save_dir, {}

    def in_save(self, iteration: int, rank: int) -> None:
        tag = Path(self.save_dir, ck.tag_for(iteration))
        latest = Path(self.save_dir, ck.LATEST)
        self.seen[iteration] = (sorted(p.name for p in tag.iterdir()), latest.read_text() if latest.exists() else None)


def make(tmp_path, info, *flags: str, ds: str = "zero1_fp32.json", hook=None, text: str | None = TOML):
    run = parse_args(["--data-path", str(tmp_path / "shard"), "--train-iters", "4", "--micro-batch-size", "2", *flags])
    printed: list[str] = []
    config = ModelConfig.preset("tiny", vocab_size=64)
    torch.manual_seed(0)
    engine = FilesEngine(BertForPreTraining(config))
    ckpt = Checkpointer(run, read_ds_config(REPO / "ds_configs" / ds), info, hook or faults.Faults(), printed.append,
                        config, text)  # fmt: skip
    return ckpt, engine, printed


def test_a_save_writes_the_files_and_config_toml_then_the_marker_last_and_keeps_the_last_k(tmp_path):
    save = tmp_path / "ck"
    hook = InSave(save)
    with one_rank_group(tmp_path) as info:
        ckpt, engine, printed = make(tmp_path, info, "--save", str(save), "--keep-last", "2", hook=hook)
        torch.manual_seed(7)
        expected = torch.rand(3)
        torch.manual_seed(7)
        for it in (1, 2, 3):
            assert ckpt.save(engine, it, 2 * it) == ck.tag_for(it)
        assert torch.equal(torch.rand(3), expected)  # saving drew nothing from the run's RNG
    names = ["config.toml", "mp_rank_00_model_states.pt", "rng_rank0.pt"]
    assert hook.seen == {1: (names, None), 2: (names, ck.tag_for(1)), 3: (names, ck.tag_for(2))}  # no marker yet
    assert [t for _, t in ck.committed_tags(save)] == [ck.tag_for(2), ck.tag_for(3)]  # --keep-last 2
    assert (save / ck.LATEST).read_text() == ck.tag_for(3)
    tag = save / ck.tag_for(3)
    assert (tag / RUN_CONFIG_FILE).read_text() == TOML
    marker = json.loads((tag / ck.COMMIT_MARKER).read_text())
    assert sorted(marker["files"]) == names and marker["files"][RUN_CONFIG_FILE] == ck.file_record(
        tag / RUN_CONFIG_FILE
    )
    assert ck.verify_tag(save, ck.tag_for(3)) == ([], True)
    client = ck.read_client_state(save, ck.tag_for(3))
    assert (client["iteration"], client["consumed_train_samples"], client["world_size"]) == (3, 6, 1)
    assert client["model_config"] == ckpt.model_config.to_dict()
    assert printed == [f"saved {save}/{ck.tag_for(it)}" for it in (1, 2, 3)]


def test_without_run_config_text_no_config_toml_is_written(tmp_path):
    with one_rank_group(tmp_path) as info:
        ckpt, engine, _ = make(tmp_path, info, "--save", str(tmp_path / "ck"), text=None)
        ckpt.save(engine, 1, 2)
    assert not (tmp_path / "ck" / ck.tag_for(1) / RUN_CONFIG_FILE).exists()
    assert ck.verify_tag(tmp_path / "ck", ck.tag_for(1)) == ([], True)


def test_the_resume_decision_falls_back_past_a_damaged_checkpoint_or_refuses_under_strict_load(tmp_path, capsys):
    save = tmp_path / "ck"
    with one_rank_group(tmp_path) as info:
        ckpt, engine, _ = make(tmp_path, info, "--save", str(save))
        for it in (2, 4):
            ckpt.save(engine, it, 2 * it)
        damaged = save / ck.tag_for(4) / RUN_CONFIG_FILE
        damaged.write_text(TOML.replace("4", "5"))  # same size, other bytes: the checksum differs
        reader, _, printed = make(tmp_path, info, "--load", str(save))
        point = reader.find()
        assert (point.tag, point.resuming, point.iteration, point.consumed_samples) == (ck.tag_for(2), True, 2, 4)
        assert point.load_tag == point.tag and point.saved_world == 1
        out = capsys.readouterr().out
        assert f"{save / ck.tag_for(4)} does not verify" in out and "falling back to" in out
        strict, _, _ = make(tmp_path, info, "--load", str(save), "--strict-load")
        with pytest.raises(ck.CheckpointError, match="--strict-load"):
            strict.find()
        finetune, _, _ = make(tmp_path, info, "--load", str(save), "--finetune")
        point = finetune.find()  # weights only: the step counter restarts
        assert (point.tag, point.resuming, point.iteration) == (ck.tag_for(2), False, 0)
        empty, _, printed = make(tmp_path, info, "--load", str(tmp_path / "new"), "--save", str(tmp_path / "new"))
        assert empty.find().tag is None and printed == [f"--load {tmp_path / 'new'}: no complete checkpoint there; "
                                                        "starting from scratch"]  # fmt: skip
        typo, _, _ = make(tmp_path, info, "--load", str(tmp_path / "typo"))
        with pytest.raises(ArgsError, match="no such directory"):
            typo.find()


def test_a_state_a_nonfinite_update_made_is_never_saved(tmp_path):
    """bf16 ZeRO-1/2 with check_grad_overflow off (the shipped configs) applies an update with non-finite gradients
    instead of skipping it: the save refuses before anything is written, naming the last complete checkpoint."""
    save = tmp_path / "ck"
    with one_rank_group(tmp_path) as info:
        ckpt, engine, _ = make(tmp_path, info, "--save", str(save), ds="zero1_bf16.json")
        engine.grad_norm = torch.tensor(float("nan"))
        with pytest.raises(NonFiniteLossError, match="non-finite gradient norm at iteration 6 .*checkpoint: none"):
            ckpt.save(engine, 6, 12)
        assert not save.exists() or not any(save.iterdir())
        engine.grad_norm = torch.tensor(1.5)  # a finite norm: the save goes on
        ckpt.save(engine, 6, 12)
        engine.grad_norm = torch.tensor(float("inf"))
        with pytest.raises(NonFiniteLossError, match=f"checkpoint: {save}/{ck.tag_for(6)} \\(resume with --load"):
            ckpt.save(engine, 7, 14)
        assert [t for _, t in ck.committed_tags(save)] == [ck.tag_for(6)]
        fp32, engine, _ = make(tmp_path, info, "--save", str(save))  # fp32 skips nothing: no read, no refusal
        engine.grad_norm = torch.tensor(float("nan"))
        fp32.save(engine, 8, 16)


def test_the_kill_in_save_fault_enters_through_the_hook():
    hook = faults.from_environment({"SPARSEBERT_FAULT_KILL_IN_SAVE": "3,5"})
    assert isinstance(hook, faults.EnvFaults) and hook.kill_in_save == {3, 5}
    hook.in_save(4, 0)  # another iteration: nothing happens (3 on rank 0 would SIGKILL: tests/test_faults.py)
    hook.in_save(3, 1)  # another rank
    faults.Faults().in_save(3, 0)  # the production hook does nothing
