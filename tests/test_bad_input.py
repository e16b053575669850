"""Issue 34: bad input never destroys data and never passes silently. Real commands on tiny data: existing outputs
are kept without --overwrite, an output is never an input, shards that hold no text or only [UNK] are refused,
shards are tied to their vocabulary, and every refusal is one line with exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.preprocess import main as preprocess_main
from data_pipeline.train_tokenizer import main as tokenizer_main
from tools.inspect_dataset import main as inspect_main
from tools.merge_shards import main as merge_main

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "run_scripts" / "sample_data" / "corpus"


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory) -> tuple[Path, Path]:
    """Two vocabularies trained here: on the whole sample corpus, and a smaller one on its wiki part."""
    tmp = tmp_path_factory.mktemp("vocab")
    assert tokenizer_main(["--input", str(SAMPLE), "--output-dir", str(tmp / "a"), "--vocab-size", "4000"]) == 0
    small = ["--input", str(SAMPLE / "jsonl"), "--output-dir", str(tmp / "b"), "--vocab-size", "900"]
    assert tokenizer_main(small) == 0
    return tmp / "a" / "vocab.txt", tmp / "b" / "vocab.txt"


def preprocess(inputs, prefix: Path, vocab: Path, *extra) -> int:
    args = ["--input", *map(str, inputs if isinstance(inputs, list) else [inputs]), "--output-prefix", str(prefix)]
    args += ["--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", str(vocab), "--no-progress", *extra]
    return preprocess_main(args)


def one_error_line(err: str) -> str:
    """The stderr of a refusal: exactly one `PROG: error: ...` line and no traceback."""
    lines = [ln for ln in err.splitlines() if "error:" in ln]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def shard_bytes(prefix: Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


# ------------------------------------------------------------------------------------------- preprocess
def test_preprocess_keeps_an_existing_shard(vocabs, tmp_path, capsys):
    """It replaced a 424-document shard with a 20-document one and printed nothing."""
    vocab = vocabs[0]
    assert preprocess(SAMPLE, tmp_path / "p", vocab) == 0
    before = shard_bytes(tmp_path / "p_text_document")
    capsys.readouterr()
    assert preprocess(SAMPLE / "jsonl", tmp_path / "p", vocab) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "p_text_document.bin" in line and "--overwrite" in line and "--output-prefix" in line
    assert shard_bytes(tmp_path / "p_text_document") == before
    assert preprocess(SAMPLE / "jsonl", tmp_path / "p", vocab, "--overwrite") == 0
    assert shard_bytes(tmp_path / "p_text_document") != before


def test_preprocess_output_that_is_an_input_is_refused(vocabs, tmp_path, capsys):
    text = tmp_path / "p_text_document.bin"  # a text file where the shard would go, given as the input
    text.write_text("The river rises near the market square.\n")
    assert preprocess(text, tmp_path / "p", vocabs[0], "--overwrite", "--input-format", "text") == 2
    assert "is the input --input" in one_error_line(capsys.readouterr().err)
    assert text.read_text().startswith("The river")


def test_preprocess_refuses_inputs_without_text(vocabs, tmp_path, capsys):
    """An all-malformed jsonl file and a parquet file without the text column gave 0-document shards (exit 0),
    which training then rejected with a traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "cut\n{"title": "no text key"}\n{oops\n')
    pq.write_table(pa.table({"body": ["hello world", "more words"]}), tmp_path / "x.parquet")
    for src in (bad, tmp_path / "x.parquet"):
        capsys.readouterr()
        assert preprocess(src, tmp_path / src.stem, vocabs[0]) == 2
        line = one_error_line(capsys.readouterr().err)
        assert "0 documents" in line and "--json-keys" in line
        assert not list(tmp_path.glob(f"{src.stem}_text_*"))
        report = json.loads((tmp_path / "reports" / f"{src.stem}.report.json").read_text())
        assert report["status"].startswith("failed")


def test_preprocess_refuses_all_unk(tmp_path, capsys):
    """A vocabulary of special tokens only (what an empty corpus used to give) wrote 100% [UNK] shards."""
    vocab = tmp_path / "specials.txt"
    vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    assert preprocess(SAMPLE / "jsonl", tmp_path / "u", vocab) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "are [UNK]" in line and "specials.txt" in line and "train_tokenizer" in line
    assert not list(tmp_path.glob("u_text_*"))


# ------------------------------------------------------------------------------------------- the vocabulary
def test_shards_are_tied_to_their_vocabulary(vocabs, tmp_path, capsys):
    """Old shards plus a new vocab trained silently on the wrong tokens; the fingerprint in the report is
    compared by tools.inspect_dataset (both commands) and by build_datasets (the trainer's path)."""
    from data_pipeline.data_config import DataConfig, DataConfigError
    from data_pipeline.datasets import build_datasets
    from data_pipeline.tokenization import build_tokenizer

    made, other = vocabs
    assert preprocess(SAMPLE / "jsonl", tmp_path / "s", made, "--split-sentences") == 0
    prefix = str(tmp_path / "s_text_sentence")
    report = json.loads((tmp_path / "reports" / "s.report.json").read_text())
    assert report["tokenizer"]["fingerprint"] == build_tokenizer("BertWordPieceLowerCase", str(made)).fingerprint()
    capsys.readouterr()
    assert inspect_main([prefix, "--vocab-file", str(made), "--num-docs", "1"]) == 0
    assert inspect_main([prefix, "--vocab-file", str(other)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(made) in line and "fingerprint" in line
    samples = ["samples", "--data-path", prefix, "--seq-length", "64", "--tokenizer-type", "BertWordPieceLowerCase"]
    assert inspect_main([*samples, "--vocab-file", str(other), "--stats"]) == 2
    assert "fingerprint" in one_error_line(capsys.readouterr().err)
    config = DataConfig(data_path=[prefix], seq_length=64)
    with pytest.raises(DataConfigError, match="fingerprint"):
        build_datasets(config, build_tokenizer("BertWordPieceLowerCase", str(other)))
    # the same ids from another file (a copy) are the same vocabulary
    copy = tmp_path / "copy.txt"
    shutil.copyfile(made, copy)
    assert inspect_main([prefix, "--vocab-file", str(copy), "--num-docs", "0"]) == 0
    # Megatron's reader opens the shards: the report lives in reports/, not beside them
    assert sorted(p.name for p in tmp_path.glob("s_*")) == ["s_text_sentence.bin", "s_text_sentence.idx"]


# ------------------------------------------------------------------------------------------- merge_shards
def test_merge_shards_guard(vocabs, tmp_path, capsys):
    assert preprocess(SAMPLE / "jsonl", tmp_path / "a", vocabs[0]) == 0
    assert preprocess(SAMPLE / "wikiextractor", tmp_path / "b", vocabs[0]) == 0
    a, b = str(tmp_path / "a_text_document"), str(tmp_path / "b_text_document")
    before = shard_bytes(tmp_path / "a_text_document")
    capsys.readouterr()
    assert merge_main(["--inputs", a, b, "--output-prefix", a, "--overwrite"]) == 2
    assert "is the input --inputs" in one_error_line(capsys.readouterr().err)
    assert shard_bytes(tmp_path / "a_text_document") == before
    assert merge_main(["--inputs", a, b, "--output-prefix", str(tmp_path / "m")]) == 0
    merged = shard_bytes(tmp_path / "m")
    assert merge_main(["--inputs", b, "--output-prefix", str(tmp_path / "m")]) == 2
    assert "--overwrite" in one_error_line(capsys.readouterr().err)
    assert shard_bytes(tmp_path / "m") == merged
    assert merge_main(["--inputs", b, "--output-prefix", str(tmp_path / "m"), "--overwrite"]) == 0
    assert shard_bytes(tmp_path / "m") == shard_bytes(tmp_path / "b_text_document")


# ------------------------------------------------------------------------------------------- the error rule
def test_debug_flag_shows_the_traceback(tmp_path):
    cmd = [sys.executable, "-m", "tools.inspect_dataset", str(tmp_path / "missing")]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.startswith("tools.inspect_dataset: error: ") and r.stderr.count("\n") == 1
    r = subprocess.run([*cmd, "--debug"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" in r.stderr and "tools.inspect_dataset: error: " in r.stderr
    env = {"SPARSE_BERT_DEBUG": "1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "Traceback" in r.stderr


# ------------------------------------------------------------------------------------------- trainer and conversion
def run_trainer_cases(cases: list[list[str]], parallel: int = 4) -> list[dict]:
    """One `python -m pretrain.train` per case, ``parallel`` at a time (a process per case: a second
    deepspeed.initialize in one process meets the first one's stale groups); returns exit codes and stderr."""
    from tests import train_utils as tu

    out: list[dict] = [{} for _ in cases]
    pending = list(enumerate(cases))
    running: list[tuple[int, subprocess.Popen]] = []
    while pending or running:
        while pending and len(running) < parallel:
            i, args = pending.pop(0)
            cmd = [sys.executable, "-m", "pretrain.train", *args]
            p = subprocess.Popen(cmd, cwd=REPO, env=tu.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            running.append((i, p))
        i, p = running.pop(0)
        _, err = p.communicate(timeout=600)
        out[i] = {"code": p.returncode, "err": "\n".join(ln for ln in err.splitlines() if "[WARNING]" not in ln)}
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A one-rank, two-iteration checkpoint of the tiny model (ZeRO-0, fp32) and its inputs."""
    from tests import train_utils as tu

    tmp = tmp_path_factory.mktemp("trained")
    tu.prepare(tmp)
    r = tu.launch("python", tu.train_args(tmp, "zero0_fp32.json", 2, "--save", str(tmp / "ckpt")), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    return tmp


@pytest.fixture
def small_disks(tmp_path):
    """A 200 KiB tmpfs (full after a few writes) and a read-only tmpfs; needs root (skipped otherwise)."""
    full, ro = tmp_path / "full", tmp_path / "ro"
    full.mkdir()
    ro.mkdir()
    mounted = []
    for where, opts in ((full, "size=200k"), (ro, "size=1m,ro")):
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
        if r.returncode != 0:
            for m in mounted:
                subprocess.run(["umount", str(m)])
            pytest.skip(f"cannot mount a tmpfs here (root needed): {r.stderr.strip()}")
        mounted.append(where)
    yield full, ro
    for m in mounted:
        subprocess.run(["umount", "-l", str(m)], check=True)


# The default tier's canary: a data file, a ds_config, a checkpoint path and a save that fails mid-run (a process
# each: the data checks come after DeepSpeed's engine starts); the other six cases are `extended` (all ten took 40 s).
CANARY = ("truncated .bin", "ds_config typo", "misspelled --load", "disk full")


@pytest.mark.parametrize("which", ["canary", pytest.param("rest", marks=pytest.mark.extended)])
def test_trainer_bad_input_is_one_line(trained, tmp_path, small_disks, which):
    """A truncated .bin, a misspelled shard prefix, a vocabulary too small for the shards, a 0-document shard, a
    typo inside a ds_config block, a misspelled --load, a --save that is a file, read-only or fills the disk: each
    was a 35-line traceback with exit 1 (for --load, a silent fresh start with exit 0; for a full disk, `unexpected
    pos 582912 vs 582804`)."""
    import numpy as np

    from data_pipeline.indexed import IndexedDatasetBuilder
    from tests import train_utils as tu

    t = trained
    Path(tmp_path / "cut.bin").write_bytes((t / "shard.bin").read_bytes()[:1000])
    shutil.copyfile(t / "shard.idx", tmp_path / "cut.idx")
    (tmp_path / "small.txt").write_text("\n".join((t / "vocab.txt").read_text().splitlines()[:20]) + "\n")
    with IndexedDatasetBuilder(tmp_path / "empty", np.uint16):
        pass
    ds = json.loads((REPO / "ds_configs" / "zero0_fp32.json").read_text())
    (tmp_path / "typo.json").write_text(json.dumps({**ds, "bf16": {"enabeld": True}}))
    (tmp_path / "afile").write_text("x")

    def args(*extra: str, data: Path = t / "shard", vocab: Path = t / "vocab.txt", ds: str | None = None) -> list:
        a = tu.train_args(t, "zero0_fp32.json", 2, *extra)
        a[a.index("--data-path") + 1] = str(data)
        a[a.index("--vocab-file") + 1] = str(vocab)
        if ds:
            a[a.index("--deepspeed_config") + 1] = ds
        return a

    cases = {
        "truncated .bin": (args(data=tmp_path / "cut"), ["cut.bin", "truncated"]),
        "misspelled prefix": (args(data=t / "shardd"), ["shardd.idx", "file not found", "check the prefix"]),
        "small vocab": (args(vocab=tmp_path / "small.txt"), ["token id", "vocab_size 20"]),
        "0-document shard": (args(data=tmp_path / "empty"), ["empty.idx", "no tokens"]),
        "ds_config typo": (args(ds=str(tmp_path / "typo.json")), ["typo.json", "enabeld", "check its spelling"]),
        "misspelled --load": (args("--load", str(t / "ckpt_typo"), "--save", str(tmp_path / "new")), ["ckpt_typo"]),
        "--save is a file": (args("--save", str(tmp_path / "afile")), ["--save", "afile", "is a file"]),
        "--save is the data": (args("--save", str(t)), ["--save", "contains the input --data-path"]),
        "read-only --save": (args("--save", str(small_disks[1] / "ck")), ["--save", "read-only file system"]),
        "disk full": (args("--save", str(small_disks[0] / "ck")), ["--save", "saving iteration 2", "disk is full"]),
    }
    cases = {k: v for k, v in cases.items() if (k in CANARY) == (which == "canary")}
    results = run_trainer_cases([a for a, _ in cases.values()])
    for (name, (_, words)), res in zip(cases.items(), results):
        assert res["code"] == 2, (name, res)
        line = one_error_line(res["err"])
        assert line.startswith("pretrain: error: "), (name, line)
        for w in words:
            assert w in line, (name, w, line)
    if "misspelled --load" in cases:  # it did not start a fresh run
        assert not (tmp_path / "new").exists()


def test_convert_never_deletes_its_input(trained, tmp_path, capsys):
    """`--load X --to-hf X --overwrite` exited 0 and left X with only the Hugging Face files: every iter_* was
    deleted. A directory above X, a file as --to-hf and a binary vocab file are one line each too."""
    from tools.convert_checkpoint import main as convert_main

    ckpt = tmp_path / "run" / "ckpt"
    shutil.copytree(trained / "ckpt", ckpt)
    before = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    (tmp_path / "afile").write_text("x")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)))
    cases = [
        (["--to-hf", str(ckpt), "--overwrite"], "is the input --load"),
        (["--to-hf", str(tmp_path / "run"), "--overwrite"], "contains the input --load"),
        (["--to-hf", str(tmp_path / "afile")], "is a file"),
        (["--to-hf", str(tmp_path / "hf"), "--vocab-file", str(tmp_path / "binary.txt")], "not a text file"),
    ]
    for extra, words in cases:
        assert convert_main(["--load", str(ckpt), *extra]) == 2, extra
        assert words in one_error_line(capsys.readouterr().err)
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == before
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert convert_main(["--load", str(ckpt), "--to-hf", str(tmp_path / "hf")]) == 0
    assert convert_main(["--load", str(ckpt), "--to-hf", str(tmp_path / "hf")]) == 2  # exists: --overwrite
    assert "--overwrite" in one_error_line(capsys.readouterr().err)


# ------------------------------------------------------------------ the sweep of the remaining entry points
# Each case showed a traceback, exited 1, wrote elsewhere than asked or passed silently before (issue 34's sweep:
# benchmarks.profile_memory, model_stats, plot_layouts, inspect_dataset, gpu_check's flags, benchmarks/* in the docs).
# {d}: a folder of inputs, {ro}: a read-only tmpfs, {full}: a full tmpfs.
SWEEP = [
    ("tools.model_stats", ["--model-config", "{d}/gone.json"], "--model-config {d}/gone.json: no such file"),
    ("tools.model_stats", ["--model-config", "{d}/empty.json"], "--model-config {d}/empty.json is empty"),
    ("tools.model_stats", ["--model-config", "{d}/bin.json"], "not a text file (byte 0 is not UTF-8)"),
    ("tools.model_stats", ["--model-config", "{d}/list.json"], "expected a JSON object, got a list"),
    ("tools.model_stats", ["--model-config", "{d}"], "--model-config {d} is a directory"),
    ("tools.model_stats", ["--position", "[1]"], "--position must be a JSON object"),
    ("tools.model_stats", ["--model-preset", "nope"], "--model-preset nope: unknown model preset"),
    ("tools.plot_layouts", ["--model-config", "{d}/list.json", "--stats"], "expected a JSON object, got a list"),
    ("tools.plot_layouts", ["--sparsity", "[1]", "--num-heads", "2", "--stats"], "--sparsity: sparse_attention"),
    ("tools.plot_layouts", ["--model-preset", "nope", "--stats"], "--model-preset nope: unknown model preset"),
    (
        "tools.plot_layouts",
        ["--model-preset", "blockbert-base-n2", "--seq-length", "64", "--out", "{ro}/l.png"],
        "--out {ro}/l.png: cannot write there",
    ),
    (
        "tools.plot_layouts",
        ["--model-preset", "blockbert-base-n2", "--seq-length", "64", "--out", "{full}/l.png"],
        "no space left on the device",
    ),
    (
        "tools.plot_layouts",
        ["--model-preset", "blockbert-base-n2", "--seq-length", "64", "--out", "{d}"],
        "--out {d} is a directory",
    ),  # wrote {d}.png
    ("benchmarks.profile_memory", ["--out", "{ro}/pm"], "--out {ro}/pm: cannot write there: read-only"),
    ("benchmarks.profile_memory", ["--out", "{d}/empty.json"], "is a file; give a directory path"),
    ("tools.inspect_dataset", ["{d}/shard", "--vocab-file", "{d}"], "which is a directory"),
    ("devtools.auto_table", ["{d}/gone.json", "--out", "{d}/t.json"], "{d}/gone.json: no such file"),
    ("devtools.auto_table", ["{d}/list.json", "--out", "{d}/t.json"], "commit the report (docs/gpu_reports/)"),
    ("devtools.gpu_check", ["--only", "nope"], "--only nope: no such step"),  # ran nothing and passed
    ("devtools.gpu_check", ["--out-dir", "{ro}/gc"], "--out-dir {ro}/gc: cannot write there"),
    ("devtools.gpu_check", ["--work-dir", "{ro}/w", "--out-dir", "{d}/gc"], "--work-dir {ro}/w: cannot write there"),
    ("benchmarks.attention", ["--table", "{d}/gone.json"], "--table {d}/gone.json: no such file"),
    ("benchmarks.attention", ["--table", "{d}/empty.json"], "--table {d}/empty.json is empty"),
    ("benchmarks.attention", ["--table", "{d}/list.json"], "expected a JSON object, got a list"),
    ("benchmarks.attention", ["--table", "{d}/other.json"], "not a results file of this benchmark"),
    ("benchmarks.attention", ["--out-dir", "{ro}/ba"], "--out-dir {ro}/ba: cannot write there"),
    ("benchmarks.attention", ["--out-dir", "{full}/ba"], "no space left on the device"),
    (
        "benchmarks.attention",
        ["--measure", "memory", "--write-doc", "{d}/gone.md"],
        "--write-doc {d}/gone.md: no such file",
    ),
    ("benchmarks.attention", ["--measure", "memory", "--out-dir", "{ro}/am"], "--out-dir {ro}/am: cannot write there"),
    ("benchmarks.attention", ["--measure", "masks", "--out", "{ro}/x.json"], "--out {ro}/x.json: cannot write there"),
    ("benchmarks.attention", ["--measure", "masks", "--out", "{d}"], "--out {d} is a directory"),
    ("benchmarks.step", ["--measure", "time", "--json", "{ro}/x.json"], "--json {ro}/x.json: cannot write there"),
    (
        "benchmarks.step",
        ["--measure", "time", "--data-path", "{d}/gone", "--vocab-file", "{d}/vocab.txt"],
        "gone.idx: file not",
    ),
    (
        "benchmarks.step",
        ["--measure", "time", "--data-path", "{d}/shard", "--vocab-file", "{d}/gone"],
        "which does not exist",
    ),
    ("benchmarks.dataloader", ["--data-path", "{d}/gone", "--vocab-file", "{d}/vocab.txt"], "gone.idx: file not"),
    ("benchmarks.dataloader", ["--vocab-file", "{d}/gone"], "which does not exist"),
    ("benchmarks.wiki_extract", ["--dump", "{d}/gone.bz2"], "--dump {d}/gone.bz2: no such file"),
    (
        "benchmarks.wiki_extract",
        ["--dump", "{d}/empty.json", "--output-dir", "{ro}/we"],
        "--output-dir {ro}/we: cannot",
    ),
    ("benchmarks.packing", ["--vocab-file", "{d}/gone"], "which does not exist"),
    ("benchmarks.packing", ["--vocab-file", "{d}/vocab.txt", "--work-dir", "{ro}/w"], "--work-dir {ro}/w: cannot"),
    ("benchmarks.preprocess_throughput", ["--vocab-file", "{d}/gone"], "which does not exist"),
    (
        "benchmarks.preprocess_throughput",
        ["--vocab-file", "{d}/vocab.txt", "--megatron-repo", "{d}"],
        "--megatron-repo {d}: no tools/preprocess_data.py there",
    ),
    (
        "benchmarks.preprocess_throughput",
        ["--vocab-file", "{d}/vocab.txt", "--output-json", "{ro}/x.json"],
        "--output-json {ro}/x.json: cannot write there",
    ),
]


@pytest.fixture
def sweep_dirs(tmp_path, small_disks) -> dict[str, str]:
    from tests import train_utils as tu

    full, ro = small_disks
    d = tmp_path / "in"
    d.mkdir()
    (d / "empty.json").write_text("")
    (d / "bin.json").write_bytes(bytes(range(200, 256)) * 4)
    (d / "list.json").write_text("[1, 2]")
    (d / "other.json").write_text('{"rows": []}')
    tu.write_vocab(d / "vocab.txt")
    tu.write_shard(d / "shard", num_docs=4)
    (full / "fill").write_bytes(b"\0" * 200 * 1024)  # the 200 KiB tmpfs is now full
    return {"d": str(d), "ro": str(ro), "full": str(full)}


@pytest.mark.parametrize("module, argv, match", SWEEP, ids=[f"{m}:{' '.join(a)[:40]}" for m, a, _ in SWEEP])
def test_entry_points_refuse_bad_input_in_one_line(module, argv, match, sweep_dirs, capsys):
    import importlib

    main = importlib.import_module(module).main
    assert main([a.format(**sweep_dirs) for a in argv]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"{module}: error: ") and match.format(**sweep_dirs) in line, line


def test_inspect_samples_says_when_the_index_cannot_be_cached(sweep_dirs, capsys):
    """The sample index is a cache: a full disk does not stop the inspection, but is said (it passed silently)."""
    from tools.inspect_dataset import samples_main

    d, full = sweep_dirs["d"], sweep_dirs["full"]
    argv = ["--data-path", f"{d}/shard", "--tokenizer-type", "BertWordPieceLowerCase", "--vocab-file", f"{d}/vocab.txt"]
    argv += ["--seq-length", "32", "--split", "1,0,0", "--stats"]
    assert samples_main(argv + ["--cache-dir", f"{full}/cache"]) == 0
    assert "could not cache the index" in capsys.readouterr().err


def test_pretrain_compare_refuses_an_unwritable_out_before_any_run(sweep_dirs, capsys):
    from benchmarks.pretrain_compare.cli import main as compare_main

    d, ro = sweep_dirs["d"], sweep_dirs["ro"]
    argv = [
        "--out",
        f"{ro}/cmp",
        "--preset",
        "cpu-small",
        "--vocab-file",
        f"{d}/vocab.txt",
        "--data-path",
        f"{d}/shard",
    ]
    assert compare_main(argv) == 2
    assert f"[compare] error: --out {ro}/cmp: cannot write there: read-only" in capsys.readouterr().err
