"""benchmarks/step (``python -m benchmarks.step --measure {time,profile,memory,host}``): the one training-step
harness. Its command line keeps every flag of the four tools it replaced (time's --variants x --seq-lens became
--cases, the case syntax benchmarks.attention shares); --kernel never reaches dense (issue #48);
and at CPU scale each measure reports what the GPU run fills: the trainer's inputs and the paper set-ups' kernels
(``time``: no all-ones attention mask reaches the engine, the MLM head gets the derived static cap, with the papers'
attention dropout 0.1 ``auto`` trains BlockBERT with block_gather; issue 25 item 3), the profile of padded and packed
rows and its stop at the step's deadline, the peak memory by category, and the host's operators per phase."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from argparse import Namespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.step import profiling as ps
from benchmarks.step.case import Case, case_model_config
from benchmarks.step.cli import build_parser, main
from benchmarks.step.memory import peak_breakdown
from data_pipeline.masking import derived_max_predictions
from tests import train_utils as tu

MIB = 2**20

# ------------------------------------------------------------------------------------------------- the command line
FLAGS = {
    "time": "--model-preset --cases --precisions --kernel --vocab-size --data-path --vocab-file "
    "--tokenizer-type --sample-mode --tokens --warmup --steps --device --compile --json",
    "profile": "--model-preset --variants --seq-len --batch --precision --kernel --vocab-size --data-path --vocab-file "
    "--tokenizer-type --sample-mode --warmup --steps --compile-estimate-s --budget-s --device --json --trace",
    "memory": "--model-preset --cases --precision --zero --kernel --vocab-size --tokens --warmup --top --device --json",
    "host": "--configs --hidden --layers --vocab-size --seq-len --batch --warmup --steps --top --json",
}
"""The flags of benchmarks/train_step_ds.py, profile_step.py, step_memory.py and host_overhead.py (less the deprecated
--preset and --vocab; train_step_ds's --variants x --seq-lens are --cases, issue #55): run_scripts/gpu_window.sh and
devtools/gpu_check call the measures with them."""


@pytest.mark.parametrize("measure", list(FLAGS))
def test_every_flag_of_the_old_tool_keeps_its_name_under_its_measure(measure):
    options = {o for a in build_parser(measure)._actions for o in a.option_strings}
    assert set(FLAGS[measure].split()) | {"--measure", "-h", "--help"} == options  # nothing lost, nothing added
    assert not {"--preset", "--vocab"} & options  # the deprecated aliases are gone
    if measure == "time":  # the cross product is one --cases word, in the order train_step_ds's flags gave
        assert build_parser(measure).parse_args(["--measure", "time"]).cases == [
            (v, n) for n in (512, 1024) for v in ("dense", "blockbert-n2", "blockbert-n3")
        ]


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--steps", "1"], "the following arguments are required: --measure"),
        (["--measure", "speed"], "argument --measure: invalid choice: 'speed'"),
        (["--measure", "host", "--cases", "dense@64"], "unrecognized arguments: --cases dense@64"),
        (["--measure", "memory", "--cases", "dense4096"], "--cases 'dense4096': no @N; write VARIANT@N"),
        (["--measure", "time", "--variants", "dense"], "unrecognized arguments: --variants dense"),
        (["--measure", "profile", "--variants", "packed"], "--variants packed needs --data-path"),
        (["--measure", "time", "--data-path", "x"], "--data-path needs --vocab-file"),
        (["--measure", "host", "--configs", "nope.json"], "--configs nope.json: no such file in"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag_before_any_set_up(argv, says, capsys):
    with pytest.raises(SystemExit) as stop:  # argparse's error: usage, then the one line
        main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
@pytest.mark.parametrize("measure", ["time", "profile", "memory"])
def test_device_cuda_is_refused_cleanly_without_a_gpu(measure, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--measure", measure, "--device", "cuda"] + (["--variants", "eager"] if measure == "profile" else []))
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--device cuda: no CUDA GPU here" in err and "Traceback" not in err


def test_unusable_files_are_one_line_and_exit_2_before_any_set_up(tmp_path, capsys):
    """(Were tests/test_bad_input.py's train_step_ds cases.) A --json that cannot be written, a missing shard or
    vocabulary: one line naming it, before minutes of set-up."""
    tu.write_vocab(tmp_path / "vocab.txt")
    tu.write_shard(tmp_path / "shard", num_docs=4)
    (tmp_path / "file").write_text("")
    d = str(tmp_path)
    cases = [
        (["--measure", "time", "--json", f"{d}/file/x.json"], f"--json {d}/file/x.json: {d}/file is a file"),
        (["--measure", "memory", "--json", d], f"--json {d} is a directory"),
        (["--measure", "host", "--json", f"{d}/file/x.json"], f"--json {d}/file/x.json: {d}/file is a file"),
        (["--measure", "profile", "--trace", f"{d}/file/t.json"], f"--trace {d}/file/t.json: {d}/file is a file"),
        (["--measure", "time", "--data-path", f"{d}/gone", "--vocab-file", f"{d}/vocab.txt"], "gone.idx: file not"),
        (["--measure", "profile", "--data-path", f"{d}/shard", "--vocab-file", f"{d}/gone"], "which does not exist"),
    ]
    for argv, says in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("benchmarks.step: error: ") and says in err and "\n" not in err, err


# ------------------------------------------------------------------------------------- the model of a case (#48)
def _shape(kernel: str) -> Namespace:
    return Namespace(hidden=64, layers=2, heads=4, vocab_size=30522, kernel=kernel)


def _chosen(config) -> str:
    """The kernels ``auto`` resolved in the first layer after one forward of a CPU batch."""
    from benchmarks.step.engine import kernels_used
    from benchmarks.support.measure import synthetic_batch
    from model.bert import BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(config).train()
    model(**synthetic_batch(2, 64, config.vocab_size, torch.device("cpu")))
    return kernels_used(model)


def test_kernel_flag_reaches_the_sparse_variants_only():
    """--kernel K once sent dense through K too (issue #48: with triton_block, dense took 189.5 ms against 69.6 under
    auto), so every n=2 / dense ratio was against a slowed dense. Dense (and a whole preset without a layout) keeps
    auto, the dense reference's fastest path; the block-sparse variants get K."""
    for kernel in ("block_gather", "triton_block"):
        assert case_model_config(Case("dense", seq_len=64), _shape(kernel)).attention.kernel == "auto", kernel
        assert case_model_config(Case("modernbert-base", seq_len=64), _shape(kernel)).attention.kernel == "auto"
        assert case_model_config(Case("blockbert-n2", seq_len=64), _shape(kernel)).attention.kernel == kernel
    assert _chosen(case_model_config(Case("dense", seq_len=64), _shape("block_gather"))) == "dense"
    assert _chosen(case_model_config(Case("blockbert-n3", seq_len=64), _shape("block_gather"))) == "block_gather"


def test_a_whole_preset_variant_trains_that_preset_with_the_kernel_asked_for():
    from model.config import ModelConfig

    args = Namespace(hidden=64, layers=2, heads=4, vocab_size=30522, kernel="block_gather")
    got = case_model_config(Case("modernbert-blockbert", seq_len=8192), args)
    want = ModelConfig.preset("modernbert-blockbert-base")
    assert (got.num_layers, got.hidden_size, got.intermediate_size) == (
        want.num_layers,
        want.hidden_size,
        want.intermediate_size,
    )
    assert got.max_position_embeddings == 8192 and got.vocab_size == 30522
    assert got.attention.kernel == "block_gather" and got.attention.global_every == want.attention.global_every
    small = case_model_config(Case("blockbert-n2", seq_len=512), args)
    assert (small.num_layers, small.hidden_size, small.attention.kernel) == (2, 64, "block_gather")


# ------------------------------------------------------------------------------------------ the measures' parts
def test_profile_variants_run_in_priority_order_until_the_deadline(monkeypatch, tmp_path):
    clock = [1000.0]
    monkeypatch.setattr(ps.time, "time", lambda: clock[0])
    ran = []

    def fake(name, case, args, device, trace):
        ran.append((name, case.compile, case.batch, trace))
        clock[0] += 10.0  # each variant takes 10 s
        return {
            "variant": name,
            "case": {"batch": case.batch},
            "step_s": 1.0,
            "busy_fraction": 1,
            "host_syncs_per_step": 0,
        }

    monkeypatch.setattr(ps, "profile_variant", fake)
    monkeypatch.setenv(ps.STEP_DEADLINE_ENV, str(1000.0 + 40.0 + ps.MARGIN_S))
    args = Namespace(
        budget_s=None,
        compile_estimate_s=15.0,
        precision="bf16",
        seq_len=512,
        batch=32,
        model_preset="bert-base",
        variants=list(ps.STEP_VARIANTS),
        trace=str(tmp_path / "t.json.gz"),
    )
    written = []
    result = ps.run(args, None, "dev", lambda r: written.append(json.loads(json.dumps(r))))
    # eager (10 s) at t=0, zero1_overlap 10 -> 20, zero0_autocast 20 -> 30; compiled needs max(2 x 10 s, 15 s) with
    # 10 left: left out; batch_x2 at 30 needs 10 s with 10 left: runs to 40; the rest have 0 s left
    assert [r[0] for r in ran] == ["eager", "zero1_overlap", "zero0_autocast", "batch_x2"]
    assert not any(r[1] for r in ran) and [r[2] for r in ran] == [32, 32, 32, 64]
    assert ran[0][3] == args.trace and all(r[3] is None for r in ran[1:])  # the trace of the first variant only
    left = ["compiled", "batch_x4", "dropout0", "packed", "zero0", "zero2"] + list(ps.STEP_VARIANTS)[10:]
    assert result["left_out"] == left and not result["complete"]
    assert len(written) == 4 and [len(w["rows"]) for w in written] == [1, 2, 3, 4]  # written after every variant
    assert written[-1]["left_out"] == ["compiled"]


def test_the_peak_holds_the_large_temporary_and_names_the_op_that_made_it():
    w = torch.nn.Linear(256, 256)
    x = torch.randn(64, 256)

    def step():
        big = torch.ones(1024, 1024)  # 4 MiB, freed before the smaller allocations below
        total = big.sum()
        del big
        kept = torch.zeros(256, 1024)  # 1 MiB
        w(x).relu().sum().backward()
        return total, kept

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step()
    r = peak_breakdown(prof, torch.device("cpu"), top=3)
    before = sum(p.numel() * 4 for p in w.parameters()) + x.numel() * 4
    assert r["peak_mib"] == pytest.approx((4 * MIB + before) / MIB, abs=0.01)  # the ones, not ones + zeros (5 MiB)
    assert sum(r["by_category_mib"].values()) == pytest.approx(r["peak_mib"])
    assert r["top"][0]["op"] == "aten::ones" and r["top"][0]["mib"] == pytest.approx(4.0, abs=1e-3)
    assert r["by_category_mib"]["parameter"] == pytest.approx(sum(p.numel() * 4 for p in w.parameters()) / MIB)


# ------------------------------------------------------------------------------- end to end: the four measures
TINY = ["--model-preset", "tiny", "--device", "cpu", "--warmup", "1"]
#: DeepSpeed's ZeRO-1 reduction at the boundary without hooks (stage_1_and_2.py allreduce_bucket / allreduce_and_copy,
#: DeepSpeed 0.19.8): per parameter tensor a slice, two views and a copy_ back from the reduced flat bucket (4); per
#: bucket a cat, the all-reduce and its averaging (5 here, 8 allowed). The hooks' path costs 12 per parameter (a Python
#: hook per tensor: narrow and copy into the contiguous bucket, views, detach, counting the tensors in the graph).
PER_PARAM, PER_STEP = 4, 8
#: ZeRO-0 autocast's step outside torch's optimizer: the trainer's clip_grad_norm_ (_foreach_norm, stack, norm, add,
#: reciprocal, mul, clamp, _foreach_mul_) and DeepSpeed's step bookkeeping, whatever the number of tensors
AUTOCAST_STEP = 16


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[dict, str]]:
    """Each measure's JSON and console output, all run by one process (tests/bench_step_entry.py): one import of
    torch and DeepSpeed for the module's end-to-end tests."""
    tmp = tmp_path_factory.mktemp("bench_step")
    data = tu.prepare(tmp)
    shards = ["--data-path", str(data / "shard"), "--vocab-file", str(data / "vocab.txt")]
    vocab = ["--vocab-size", str(tu.VOCAB_SIZE)]
    commands = {
        "time": ["--measure", "time", *TINY, "--precisions", "bf16", "--steps", "1"]
        + ["--cases", "dense,blockbert-n2,blockbert-n3@128"],
        "time_data": ["--measure", "time", *TINY, "--cases", "dense@64", "--precisions", "bf16", "--steps", "2"]
        + [*shards, *vocab],
        "profile": ["--measure", "profile", *TINY, "--seq-len", "64", "--batch", "2", "--steps", "1", *vocab, *shards]
        + ["--sample-mode", "doc-sentences", "--variants", "eager", "packed", "--trace", str(tmp / "trace.json.gz")],
        # --kernel block_gather: the sparse variants' kernel; dense must still run its own (issue #48)
        "memory": ["--measure", "memory", *TINY, "--cases", "dense@64", "--kernel", "block_gather"],
        "host": ["--measure", "host", "--configs", "zero1_bf16.json", "zero1_bf16_overlap.json"]
        + ["zero0_bf16_autocast.json", "--hidden", "32", "--warmup", "1", "--steps", "1"],
    }
    for name, argv in commands.items():
        argv += ["--json", str(tmp / f"{name}.json")]
    out = tmp / "runs.json"
    entry = [
        sys.executable,
        str(tu.REPO / "tests" / "bench_step_entry.py"),
        str(out),
        json.dumps(list(commands.values())),
    ]
    p = subprocess.run(entry, cwd=tu.REPO, env=tu.env(), capture_output=True, text=True, timeout=800)
    assert out.is_file(), p.stdout[-3000:] + p.stderr[-3000:]
    done = dict(zip(commands, json.loads(out.read_text())))
    results = {}
    for name, r in done.items():
        f = tmp / f"{name}.json"
        results[name] = (json.loads(f.read_text()) if f.is_file() else None, r["output"], r["rc"])
    results["trace"] = tmp / "trace.json.gz"
    return results


def _ok(runs, name: str) -> tuple[dict, str]:
    result, output, rc = runs[name]
    assert rc == 0 and result is not None, output[-3000:]
    return result, output


@pytest.mark.timeout(900)
def test_time_rows_record_the_inputs_and_kernels_the_trainer_uses(runs):
    result, output = _ok(runs, "time")
    assert result["measure"] == "time" and result["complete"] and result["commit"]
    rows = {r["variant"]: r for r in result["rows"]}
    assert set(rows) == {"dense", "blockbert-n2", "blockbert-n3"}
    for r in rows.values():
        assert r["attention_mask_passed"] is False
        assert r["max_predictions"] == derived_max_predictions(128, 0.15)
        assert r["batch"] == 256 // 128 and r["mfu"] is None and r["step_s"] > 0  # tiny's b x N; no peak on CPU
    assert rows["dense"]["kernel_used"] == "dense"
    assert rows["blockbert-n2"]["kernel_used"] == rows["blockbert-n3"]["kernel_used"] == "block_gather"
    (c,) = result["comparisons"]
    assert c["step_ratio"] == pytest.approx(rows["blockbert-n2"]["step_s"] / rows["dense"]["step_s"])
    assert "| bf16 | 128 | dense | 2 | dense |" in output  # the Markdown table (benchmarks/report.py)


@pytest.mark.timeout(900)
def test_time_runs_the_data_pipelines_batches(runs):
    """--data-path: each step a batch of the trainer's loader (doc-sentences rows, their padding, the cap the trainer
    derives); tokens/s counts the real tokens."""
    result, _ = _ok(runs, "time_data")
    (row,) = result["rows"]
    assert row["batches"] == "data pipeline" and row["max_predictions"] == derived_max_predictions(64, 0.15)
    assert 0 < row["tokens_per_s"] * row["step_s"] <= row["batch"] * 64


def _fpt(row: dict) -> float:
    """The harness's FLOPs per token, recomputed from model.flops with the tiny preset's shapes."""
    from model.flops import flops_per_token
    from model.presets import PRESETS

    t = PRESETS["tiny"]
    return flops_per_token(t["hidden_size"], t["num_layers"], 64, tu.VOCAB_SIZE, 1.0, row["predicted_share"])


@pytest.mark.timeout(900)
def test_profile_reports_every_field_for_padded_and_packed_rows(runs):
    result, output = _ok(runs, "profile")
    trace = runs["trace"]
    assert result["complete"] and result["left_out"] == []
    eager, packed = result["rows"]
    assert (eager["variant"], packed["variant"]) == ("eager", "packed")
    assert packed["case"]["sample_mode"] == "packed-docs" and eager["case"]["sample_mode"] is None
    assert eager["padding_share"] > packed["padding_share"]  # doc-sentences rows are padded, packed ones filled
    for r in (eager, packed):
        assert r["case"]["batch"] == 2 and r["case"]["seq_len"] == 64 and r["mfu"] is None  # no peak on CPU
        assert 0 < len(r["top_kernels"]) <= ps.TOP_KERNELS and r["top_kernels"][0]["name"].startswith("aten::")
        shares = [k["share"] for k in r["top_kernels"]]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= r["busy_fraction"] <= 1.05
        assert r["tflops"] == pytest.approx(r["tokens_per_s"] * _fpt(r) / 1e12, rel=1e-9)
        # DeepSpeed's bf16 ZeRO-1 step makes none: its gradient norm and clipping patched (pretrain/deepspeed_patch.py,
        # applied by initialize_engine), its throughput timers off in the shipped config; torch's CPU AdamW reads
        # its step counts (CPU-only: the CUDA AdamW is fused)
        assert r["host_syncs_per_step"] == sum(r["host_sync_sites"].values()) > 0
        assert not any(s.startswith("(deepspeed)") for s in r["host_sync_sites"]), r["host_sync_sites"]
        assert any(s.startswith("(torch.optim)") for s in r["host_sync_sites"]), r["host_sync_sites"]
        assert r["peak_memory_mib"] > 0 and r["step_s"] > 0
    assert "trace" not in packed and eager["trace"] == str(trace)
    assert any(e.get("name", "").startswith("aten::") for e in json.load(gzip.open(trace))["traceEvents"])
    md = "\n".join(ps.markdown(result))
    assert "| eager | 64 | 2 | 1 | 0.1 | padded (" in md and "| packed | 64 | 2 | 1 | 0.1 | packed |" in md
    assert "Top kernels of `eager`" in md and "Host syncs of `eager` per step, by site: " in md
    assert "(torch.optim)" in md.split("Host syncs of `eager`")[1]
    assert md in output  # what the console shows


@pytest.mark.timeout(900)
def test_memory_reports_a_training_step_by_category(runs):
    result, output = _ok(runs, "memory")
    (row,) = result["rows"]
    assert row["variant"] == "dense" and row["seq_len"] == 64
    assert row["kernel_used"] == "dense", output[-3000:]  # --kernel block_gather is the sparse variants' (issue #48)
    assert {"parameter", "optimizer_state"} <= set(row["by_category_mib"]), row  # what else is live: the config's
    assert sum(row["by_category_mib"].values()) == pytest.approx(row["peak_mib"], rel=1e-6)
    assert "| case | peak MiB |" in output, output[-3000:]


@pytest.mark.timeout(900)
def test_host_the_shipped_bf16_steps_do_no_per_parameter_work_in_deepspeed(runs):
    """The host's per-parameter work in the shipped bf16 ZeRO-1 step, counted on CPU: the H200 profile
    (docs/performance.md) found the bert-base step host-bound, ~28 ms of every step in DeepSpeed ZeRO's per-parameter
    gradient hooks. ``ds_configs/zero1_bf16.json`` turns them off (``overlap_comm`` and ``contiguous_gradients``
    false: ZeRO-1 then reduces the gradients once, at the accumulation boundary); ``zero1_bf16_overlap.json`` keeps
    them for jobs whose gradient reduction is worth overlapping with the backward."""
    result, output = _ok(runs, "host")
    shipped, overlap, autocast = result["rows"]
    n = shipped["param_tensors"]
    assert n == overlap["param_tensors"] > 150  # bert-base's parameter tensors (12 layers), at a tiny width
    bound = PER_PARAM * n + PER_STEP
    assert shipped["ops"]["engine_backward"] <= bound, shipped["top_ops"]
    assert overlap["ops"]["engine_backward"] > bound  # the counter sees the hooks: this test can fail
    # the model's own operators are the same in both: only DeepSpeed's work differs
    for phase in ("forward", "autograd", "step"):
        assert shipped["ops"][phase] == overlap["ops"][phase], phase
    # ZeRO-0 under torch_autocast, one rank: DeepSpeed adds nothing to the backward (the all-reduce over one rank is
    # off: 1 operator left, the loss's scaling by the accumulation steps) and nothing to the step but the optimizer;
    # the trainer's clipping is torch's multi-tensor clip_grad_norm_ (8 operators, whatever the tensor count)
    assert autocast["ops"]["engine_backward"] <= 1, autocast["top_ops"]
    assert autocast["ops"]["step"] - autocast["ops_in_torch_optimizer"] + autocast["ops"]["other"] <= AUTOCAST_STEP
    assert f"| zero1_bf16.json | {shipped['ops']['forward']} |" in output


def test_cases_parse_and_compare():
    """(Was tests/test_gpu_check.py's train_step case.) VARIANT@N, a one-line error for anything else, and the n=2 /
    dense ratios only where both were measured."""
    from benchmarks.step.case import CASES
    from benchmarks.step.timing import comparisons

    assert CASES.parse(["dense@512", "blockbert-n2@4096"]) == [("dense", 512), ("blockbert-n2", 4096)]
    with pytest.raises(ValueError, match="VARIANT@N"):
        CASES.parse(["dense4096"])
    rows = [
        {"variant": "dense", "precision": "bf16", "seq_len": 4096, "step_s": 0.4, "peak_memory_mib": 1000.0},
        {"variant": "blockbert-n2", "precision": "bf16", "seq_len": 4096, "step_s": 0.2, "peak_memory_mib": 600.0},
        {"variant": "dense", "precision": "bf16", "seq_len": 512, "step_s": 0.1, "peak_memory_mib": 100.0},
    ]
    assert comparisons(rows) == [{"precision": "bf16", "seq_len": 4096, "step_ratio": 0.5, "memory_ratio": 0.6}]
