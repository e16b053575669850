"""Checkpoint integrity: the commit marker records each file's size and CRC-32 at save; resume and the Hugging Face
export verify them. A flipped or truncated file of any kind (module states, optimizer states, RNG, the marker itself)
is named; resume falls back to the newest committed checkpoint that verifies and says so, ``--strict-load`` stops
instead, the export refuses. Checkpoints whose marker records no files (saved before this existed) still load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pretrain import checkpoint as ck
from tests import train_utils as tu
from tools.hf_export import export

ITERS = 6
BLOCKBERT = {
    "kernel": "block_gather",
    "sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1", "block": 16},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """2 ranks, ZeRO-3 fp32 (per-rank module and optimizer shards), a BlockBERT (layout state in the client state),
    6 iterations saved every 2: iter 2, 4, 6 and the straight run's losses."""
    tmp = tmp_path_factory.mktemp("integrity")
    tu.prepare(tmp, attention=BLOCKBERT, hidden_dropout=0.0, attention_dropout=0.0)
    args = tu.train_args(tmp, "zero3_fp32.json", ITERS, *tu.DETERMINISTIC, global_batch=4)
    args += ["--save", str(tmp / "ckpt"), "--save-interval", "2", "--log-json", str(tmp / "straight.jsonl")]
    r = tu.launch("deepspeed", args, timeout=400)
    assert r.returncode == 0, r.stdout[-4000:]
    return tmp


def _damage(f: Path, how: str) -> None:
    data = bytearray(f.read_bytes())
    if how == "truncate":
        f.write_bytes(bytes(data[: len(data) // 2]))
    else:  # 64 bytes flipped in the middle (what the silent corruption was)
        mid = len(data) // 2
        for i in range(mid, min(mid + 64, len(data))):
            data[i] ^= 0xFF
        f.write_bytes(bytes(data))


def _copy(run: Path, dst: Path, tags=(2, 4)) -> Path:
    for it in tags:
        shutil.copytree(run / "ckpt" / ck.tag_for(it), dst / ck.tag_for(it))
    (dst / "latest").write_text(ck.tag_for(max(tags)))
    return dst


@pytest.mark.extended  # the module's 2-rank ZeRO-3 run (~35 s) serves only this tier
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_marker_records_every_file_with_size_and_crc(run):
    tag_dir = run / "ckpt" / ck.tag_for(4)
    marker = json.loads((tag_dir / ck.COMMIT_MARKER).read_text())
    names = ck.tag_files(tag_dir)
    assert set(marker["files"]) == set(names)
    kinds = {"zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"}
    assert kinds | {"rng_rank0.pt", "rng_rank1.pt"} <= set(names)
    for n in names:
        assert marker["files"][n] == ck.file_record(tag_dir / n)
        assert marker["files"][n]["size"] == (tag_dir / n).stat().st_size
    assert ck.verify_tag(run / "ckpt", ck.tag_for(4)) == ([], True)


def _kinds(run: Path) -> list[str]:
    return ck.tag_files(run / "ckpt" / ck.tag_for(4)) + [ck.COMMIT_MARKER]


@pytest.mark.extended  # needs the module's 2-rank run
@pytest.mark.multirank
@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["flip", "truncate"])
def test_each_damaged_file_is_named_and_resume_falls_back(run, tmp_path, how):
    """Every file kind of the newest checkpoint, damaged in turn: rank 0's choice skips it naming the file and takes
    the previous committed checkpoint; --strict-load raises naming it; the export refuses naming it."""
    for name in _kinds(run):
        root = _copy(run, tmp_path / f"{how}-{name}")
        bad = root / ck.tag_for(4) / name
        _damage(bad, how)
        tag, client, notes = ck.select_resume_tag(root)
        assert tag == ck.tag_for(2), (name, notes)
        assert client["iteration"] == 2
        assert str(bad) in notes[0] and f"falling back to {root / ck.tag_for(2)}" in notes[-1], notes
        with pytest.raises(ck.CheckpointError, match="--strict-load") as e:
            ck.select_resume_tag(root, strict=True)
        assert str(bad) in str(e.value)
        with pytest.raises(export.ConversionError, match="refusing to export") as e:
            export.ds_to_hf(str(root), str(tmp_path / "hf"), tag=ck.tag_for(4), tokenizer=False)
        assert str(bad) in str(e.value)


@pytest.mark.extended  # needs the module's 2-rank run
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_none_verifies_is_an_error_listing_each(run, tmp_path):
    root = _copy(run, tmp_path / "ck")
    _damage(root / ck.tag_for(4) / "rng_rank1.pt", "flip")
    (root / ck.tag_for(2) / "zero_pp_rank_0_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(ck.CheckpointError, match="no committed checkpoint") as e:
        ck.select_resume_tag(root)
    assert "rng_rank1.pt: CRC-32" in str(e.value) and "zero_pp_rank_0_mp_rank_00_optim_states.pt: missing" in str(
        e.value
    )


@pytest.mark.extended  # needs the module's 2-rank run
@pytest.mark.multirank
@pytest.mark.timeout(600)
def test_old_marker_without_checksums_loads_unverified(run, tmp_path):
    root = _copy(run, tmp_path / "ck")
    marker = root / ck.tag_for(4) / ck.COMMIT_MARKER
    old = {k: v for k, v in json.loads(marker.read_text()).items() if k != "files"}
    marker.write_text(json.dumps(old))
    tag, client, notes = ck.select_resume_tag(root)
    assert tag == ck.tag_for(4) and client["iteration"] == 4
    assert notes == [f"{root / ck.tag_for(4)}: " + notes[0].split(": ", 1)[1]] and "loading it unverified" in notes[0]
    out = tmp_path / "hf"
    export.ds_to_hf(str(root), str(out), tokenizer=False)  # exported, with a note on stderr
    assert (out / "config.json").is_file()


@pytest.mark.extended  # needs the module's 2-rank run
@pytest.mark.multirank
@pytest.mark.timeout(900)
def test_resume_skips_a_corrupt_checkpoint_and_replays_the_straight_run(run, tmp_path):
    """The newest checkpoint's module states with 64 bytes flipped: the run says so, resumes from the one before
    and its losses equal the straight run's bitwise; with --strict-load it stops with exit code 2 naming the file."""
    root = _copy(run, tmp_path / "ck")
    bad = root / ck.tag_for(4) / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    _damage(bad, "flip")
    args = tu.train_args(run, "zero3_fp32.json", ITERS, *tu.DETERMINISTIC, global_batch=4)
    args += ["--save", str(tmp_path / "new"), "--load", str(root), "--log-json", str(tmp_path / "b.jsonl")]
    strict = tu.launch("deepspeed", args + ["--strict-load"], timeout=400)
    assert strict.returncode == 2, strict.stdout[-3000:]
    assert f"{bad}: CRC-32" in strict.stdout and "--strict-load" in strict.stdout
    assert not (tmp_path / "b.jsonl").exists()
    resumed = tu.launch("deepspeed", args, timeout=400)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    out = resumed.stdout
    assert f"[checkpoint] {root / ck.tag_for(4)} does not verify: {bad}: CRC-32" in out
    assert f"falling back to {root / ck.tag_for(2)}" in out
    assert f"resumed from {root}/{ck.tag_for(2)}: iteration 2" in out
    a, b = tu.train_records(run / "straight.jsonl"), tu.train_records(tmp_path / "b.jsonl")
    assert [r["iteration"] for r in b] == [3, 4, 5, 6]
    assert [r["loss"] for r in b] == [r["loss"] for r in a[2:]]
    assert ck.verify_tag(tmp_path / "new", ck.tag_for(6)) == ([], True)


def test_clear_tag_empties_the_tag_and_its_conversions_only(tmp_path):
    for d in ("iter_0000006", "iter_0000006_universal", "iter_0000006_universal.partial", "iter_0000060"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"stale")
    assert sorted(ck.clear_tag(tmp_path, "iter_0000006")) == [
        "iter_0000006",
        "iter_0000006_universal",
        "iter_0000006_universal.partial",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000060"]


@pytest.mark.timeout(600)
def test_a_save_over_an_interrupted_save_of_another_world_size_keeps_none_of_its_files(tmp_path):
    """A 2-rank save of iteration 2 was interrupted (rank 1's ZeRO shard and a stale conversion left, no marker);
    the 1-rank rerun that saves iteration 2 again starts from an empty tag: the stale files are gone and its
    marker lists only its own (the chaos test found a later resize merging the stale shard: a shape error)."""
    tu.prepare(tmp_path)
    save = tmp_path / "ck"
    stale = save / "iter_0000002" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"rank 1 of the interrupted 2-rank save")
    (save / "iter_0000002_universal").mkdir()
    args = tu.train_args(tmp_path, "zero2_fp32.json", 2, "--save", str(save), "--save-interval", "2", global_batch=4)
    p = tu.launch("deepspeed", args, nprocs=1, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]
    assert not stale.exists() and not (save / "iter_0000002_universal").exists()
    marker = json.loads((save / "iter_0000002" / ck.COMMIT_MARKER).read_text())
    assert marker["world_size"] == 1 and not any("rank_1" in name for name in marker["files"]), marker["files"]
    assert ck.verify_tag(save, "iter_0000002") == ([], True)
