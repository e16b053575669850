"""``python -m benchmarks.attention``: one parser for five measures (each keeps its flags and defaults, a flag of
another measure is one line naming it), one case syntax with benchmarks.step (``--cases NAME@N``: the same words
read and refused alike), both sides of every timed comparison get q/k/v as training makes them
(views of one fused projection), and a fast canary of each measure writes what it promises."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from benchmarks.attention import cli, retained_memory, steps, triton_tiles
from benchmarks.attention.layouts import HEADS, TUNED_LAYOUTS


def test_each_measure_keeps_its_flags_and_defaults(tmp_path):
    """The defaults of the five tools the command replaced, and the command lines the GPU check and the GPU window
    script give it."""
    t = cli.parse([])
    assert (t.measure, t.cases, t.kernels) == (
        "time",
        [(lay, n) for n in (512, 1024, 2048, 4096) for lay in TUNED_LAYOUTS],
        ["block_gather", "flex"],
    )
    assert (t.dtype, t.batch, t.device, t.repeats, str(t.out_dir)) == ("fp32", 1, "cpu", 3, "out/bench_attention")
    assert (t.target_factor, t.math_max_n, t.max_dense_masked_n, t.table, t.no_plot) == (1.15, 2048, 2048, None, False)
    m = cli.parse(["--measure", "memory", "--write-doc"])
    assert (m.cases, str(m.write_doc)) == (
        [(fam, n) for n in (4096, 8192) for fam in retained_memory.families()],
        "docs/model.md",
    )
    assert "dense" not in m.kernels and retained_memory.GATHER_ONLY in m.kernels and not m.model_level
    tl = cli.parse(["--measure", "tiles"])
    assert (tl.batch, tl.dtype, tl.cases, tl.configs) == (
        8,
        "bf16",
        [(lay, n) for n in (4096, 8192) for lay in ("blockbert_n2", "local_bi_b64")],
        triton_tiles.DEFAULT_CONFIGS,
    )
    k = cli.parse(["--measure", "masks"])
    assert (k.seq_length, k.batch, k.repeats, k.masks_only, k.out) == (512, 2, 3, False, None)
    assert cli.parse(["--measure", "flex-tiles"]).cases == [(lay, n) for n in (4096, 8192) for lay in TUNED_LAYOUTS]
    gpu_check = [
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--cases",
        "blockbert_n2,blockbert_n3,fixed_b64,local_bi_b64@256,512",
    ]
    gpu_check += ["--kernels", "block_gather", "--repeats", "1"]
    gpu_check += ["--target-factor", "1.3", "--out-dir", str(tmp_path), "--no-plot"]
    assert cli.parse(gpu_check).target_factor == 1.3
    assert cli.parse(["--measure", "tiles", "--device", "cpu", "--json", "x.json"]).json == "x.json"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--configs", "64x64:4:2"], "--configs is a flag of --measure tiles, not of --measure time"),
        (
            ["--measure", "masks", "--cases", "fixed_b64@64"],
            "--cases is a flag of --measure time / memory / tiles / flex-tiles",
        ),
        (["--measure", "memory", "--model-level", "--cases", "fixed@64"], "--cases: --model-level measures its"),
        (
            ["--measure", "tiles", "--device", "cpu", "--configs", "96x64:4:2"],
            "--configs '96x64:4:2': tiles are powers of two",
        ),
    ],
)
def test_bad_flags_are_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


# ----------------------------------------------------------------------- one case syntax with benchmarks.step
CASE_WORDS = {
    "benchmarks.step": ("dense", "blockbert-n2", "VARIANT"),
    "benchmarks.attention": ("blockbert_n2", "blockbert_n3", "LAYOUT"),
}
"""Harness -> two names its ``--measure time --cases`` takes, and what it calls a name."""


def _time_cases(harness: str, words: list[str]) -> list[tuple[str, int]]:
    """``--measure time --cases WORDS`` as the harness's own parser reads them."""
    if harness == "benchmarks.step":
        from benchmarks.step.cli import build_parser

        return build_parser("time").parse_args(["--measure", "time", "--cases", *words]).cases
    return cli.parse(["--measure", "time", "--cases", *words]).cases


@pytest.mark.parametrize("harness", list(CASE_WORDS))
def test_both_harnesses_read_the_same_case_words_alike(harness):
    """NAME@N; NAME,NAME@N,N is every pair, lengths outer; cases run in the order written, and the kernel table
    groups them by N in the order the lengths first appear (one dense baseline per N)."""
    from benchmarks.support.cases import by_length

    a, b, _ = CASE_WORDS[harness]
    got = _time_cases(harness, [f"{b}@512", f"{a},{b}@128,256"])
    assert got == [(b, 512), (a, 128), (b, 128), (a, 256), (b, 256)]
    assert by_length(got + [(a, 512)]) == [(512, [b, a]), (128, [a, b]), (256, [a, b])]


@pytest.mark.parametrize(
    "word, problem",
    [
        ("{a}64", "no @N"),
        ("{a}@0", "N '0' is not a positive whole number"),
        ("{a}@", "N '' is not a positive whole number"),
        ("{a}@128,6x4", "N '6x4' is not a positive whole number"),
        ("{a}x@64", "no {what} '{a}x' (did you mean {a}?)"),
        ("{a},{b},{a}@64", "{a}@64 is given twice"),
    ],
)
def test_both_harnesses_refuse_a_bad_case_with_the_same_line(word, problem, capsys):
    """The same mistake is the same argparse error (exit 2, before any set-up) in both harnesses, naming the word, what
    is wrong with it, and how to write a case with the harness's own names."""
    said = set()
    for harness, (a, b, what) in CASE_WORDS.items():
        spec = word.format(a=a, b=b)
        with pytest.raises(SystemExit) as stop:
            _time_cases(harness, [spec])
        line = capsys.readouterr().err.strip().splitlines()[-1]
        wanted = f"{harness}: error: --cases {spec!r}: {problem.format(a=a, b=b, what=what)}"
        assert stop.value.code == 2 and wanted in line, line
        if "twice" not in problem:
            assert f"; write {what}@N, or {what},{what}@N,N for every pair, with {what} one of {a}, {b}" in line
        said.add(line.split(": error: ")[1].split("; write")[0].replace(a, "A").replace(b, "B").replace(what, "W"))
    assert len(said) == 1, said


def test_an_old_spelling_is_refused():
    """``--seq-len`` (the masks tool's deprecated alias) is gone; argparse's abbreviations are off."""
    with pytest.raises(SystemExit) as e:
        cli.parse(["--measure", "masks", "--seq-len", "64"])
    assert e.value.code == 2


def test_the_step_feeds_views_of_one_fused_projection():
    """Both sides of a comparison see q/k/v as model/bert.py makes them (strided views of one [B, N, 3, H, D]
    tensor), read the output as [B, N, H * D], and the fused gradient equals separate contiguous inputs' gradients."""
    qkv = steps.fused_qkv(2, 3, 32, 8, torch.device("cpu"), torch.float32)
    seen = []

    def sdpa(q, k, v):
        seen.append((q, k, v))
        return F.scaled_dot_product_attention(q, k, v)

    steps.make_step(sdpa, qkv)()
    q, k, v = seen[0]
    assert q.shape == (2, 3, 32, 8) and not q.is_contiguous()
    assert q.untyped_storage().data_ptr() == k.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert qkv.grad is None  # dropped after each step
    sep = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    go = torch.randn(2, 32, 24, generator=torch.Generator().manual_seed(1))
    F.scaled_dot_product_attention(*sep).transpose(1, 2).reshape(2, 32, 24).backward(go)
    qkv.grad = None
    out = F.scaled_dot_product_attention(*steps.heads_of(qkv))
    out.transpose(1, 2).reshape(2, 32, 24).backward(go)
    torch.testing.assert_close(qkv.grad, torch.stack([t.grad.transpose(1, 2) for t in sep], 2))


@pytest.mark.timeout(120)
def test_kernel_table_canary(tmp_path, capsys):
    """``--measure time`` at N=64: one row per kernel x layout, the report says both sides' conditions, and
    ``--table`` renders the report as attention.md holds it."""
    argv = ["--cases", "blockbert_n2@64", "--kernels", "block_gather", "dense", "--repeats", "1"]
    assert cli.main([*argv, "--out-dir", str(tmp_path), "--no-plot", "--folded-baseline"]) == 0
    report = json.loads((tmp_path / "attention.json").read_text())
    assert report["complete"] and not report["failed"]
    assert (report["meta"]["qkv"], report["meta"]["dropout"], report["meta"]["heads"]) == ("fused_views", 0.0, HEADS)
    rows = report["rows"]
    assert [(r["kernel"], r["layout"]) for r in rows] == [
        ("sdpa_folded", "none"),
        ("block_gather", "blockbert_n2"),
        ("dense", "blockbert_n2"),
    ]
    assert all(r["time_ratio"] > 0 and r["mem_mib"] > 0 for r in rows)
    assert rows[1]["density"] == pytest.approx(0.5)
    capsys.readouterr()
    assert cli.main(["--table", str(tmp_path / "attention.json")]) == 0
    assert capsys.readouterr().out == (tmp_path / "attention.md").read_text()


@pytest.mark.timeout(120)
def test_masks_memory_and_flex_tiles_canaries(tmp_path, capsys):
    out = tmp_path / "masks.json"
    argv = ["--measure", "masks", "--seq-length", "64", "--batch", "1", "--repeats", "1", "--patterns", "star"]
    assert cli.main([*argv, "--masks-only", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["case"], r["kernel"]) for r in rows] == [("mask:star", "dense"), ("mask:star", "block_gather")]
    assert all(r["ratio_vs_dense_sdpa"] > 0 and 0 < r["block_density"] <= 1 for r in rows)
    argv = ["--measure", "memory", "--cases", "fixed@256", "--kernels", "block_gather"]
    assert cli.main([*argv, "--out-dir", str(tmp_path)]) == 0
    (row,) = json.loads((tmp_path / "attention_memory.json").read_text())["rows"]
    assert (row["family"], row["n"]) == ("fixed", 256) and row["meets"]
    capsys.readouterr()
    assert cli.main(["--measure", "flex-tiles", "--cases", "fixed_b64,blockbert_n2@256"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| layout | N |") and [ln.split(" | ")[:2] for ln in lines[2:]] == [
        ["| fixed_b64", "256"],
        ["| blockbert_n2", "256"],
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("measure", ["time", "tiles"])
def test_device_cuda_is_refused_cleanly_without_a_gpu(measure, tmp_path, capsys):
    """(Was tests/test_gpu_check.py's benchmark case.) One line and exit 2, not a CUDA traceback."""
    out = ["--out-dir", str(tmp_path / "x")] if measure == "time" else ["--json", str(tmp_path / "x.json")]
    with pytest.raises(SystemExit) as stop:
        cli.main(["--measure", measure, "--device", "cuda", *out])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--device cuda: no CUDA GPU here" in err and "Traceback" not in err


def test_dropout_reaches_both_sides_of_the_comparison(tmp_path):
    """``--dropout P`` (auto's table must be measured with training's dropout, issue #48): the dense baseline and every
    kernel module run dropout P in training mode, the report's meta records P, flex (no dropout) is left out."""
    from benchmarks.attention import kernel_table

    torch.manual_seed(0)
    q = torch.randn(1, 2, 64, 16)
    dense = kernel_table.dense_sdpa(0.5)
    assert not torch.equal(dense(q, q, q), dense(q, q, q))  # dropout drawn per call
    assert torch.equal(kernel_table.dense_sdpa(0.0)(q, q, q), F.scaled_dot_product_attention(q, q, q))
    args = cli.parse(["--cases", "blockbert_n2@64", "--kernels", "block_gather", "flex", "dense"])
    args.dropout = 0.1
    mods = [c[2] for c in kernel_table.candidates(args, 64, ["blockbert_n2"], torch.device("cpu"))]
    assert [m.kernel_name for m in mods] == ["block_gather", "dense"]
    assert all(m.dropout_p == 0.1 and m.training for m in mods)
    argv = ["--cases", "blockbert_n2@64", "--kernels", "block_gather", "--repeats", "1"]
    assert cli.main([*argv, "--dropout", "0.1", "--out-dir", str(tmp_path), "--no-plot"]) == 0
    report = json.loads((tmp_path / "attention.json").read_text())
    assert report["meta"]["dropout"] == 0.1 and [r["kernel"] for r in report["rows"]] == ["block_gather"]
    assert "attention dropout 0.1" in (tmp_path / "attention.md").read_text()
    assert cli.main([*argv, "--dropout", "1.5", "--out-dir", str(tmp_path)]) == 2
