"""``auto``'s measured table: generated from the committed GPU reports (never drifts from them), keyed by names the
registries know, followed under a mocked compute capability on CUDA, with the rule where it has no entry."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.attention.layouts import layouts
from devtools import auto_table
from model import attention as A
from model.attention.kernels import KERNELS
from model.attention.kernels.auto import TABLE_KERNELS, TABLE_PATH, load_table, table_choice
from model.bert import BertForPreTraining
from model.config import ModelConfig

CUDA = torch.device("cuda")
TABLE = load_table()


@pytest.fixture
def h200(monkeypatch):
    """A CUDA device of compute capability 9.0 (mocked), whose kernel plans are not built (no GPU here)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    for name in TABLE_KERNELS:
        monkeypatch.setattr(KERNELS[name], "make_plan", lambda *a, name=name, **k: name)


def _auto_plan(name: str, n: int):
    """``auto``'s plan for the kernel table's layout ``name`` at ``n``, made by the attention module."""
    mod = A.BlockSparseAttention(layouts()[name](), kernel="auto", max_seq_length=n)
    return mod._plan(mod.sparsity_config.padded_length(n), CUDA)


def test_table_is_what_the_script_generates_from_the_committed_reports():
    sources = [(s["report"], s["commit"]) for s in TABLE["sources"]]
    assert sources, "the table names no report"
    assert TABLE_PATH.read_text() == auto_table.render(auto_table.build(sources))


def test_every_entry_names_registered_kernels_and_a_known_layout_family():
    bench = layouts()
    assert TABLE["entries"]
    for e in TABLE["entries"]:
        assert e["kernel"] in KERNELS and e["kernel"] in TABLE_KERNELS
        assert set(e["ratios"]) <= set(TABLE_KERNELS) and "dense" in e["ratios"]
        cfg = bench[e["bench_layout"]]()
        assert cfg.mode in A.BLOCK_LAYOUTS and cfg.family() == e["family"]
        assert e["kernel"] == min(e["ratios"], key=lambda k: (e["ratios"][k], k != "dense"))
        assert isinstance(e["dropout"], float) and e["dtype"] in ("fp32", "fp16", "bf16")
        assert e["padded_n"] == cfg.padded_length(e["n"])


@pytest.mark.parametrize("entry", TABLE["entries"], ids=lambda e: f"{e['family']}@{e['n']}")
def test_auto_follows_the_table_on_a_matching_gpu(h200, entry):
    """Every entry: ``auto`` on a sm 9.0 GPU runs the entry's fastest path, says so in its start-up line (with the
    dropout it was measured at), and with attention dropout never runs flex; a run whose dropout the entry was not
    measured with is warned, naming the fallback."""
    plan = _auto_plan(entry["bench_layout"], entry["n"])
    assert plan.family == entry["family"]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[entry["dtype"]]
    p = entry["dropout"]
    assert plan.prepare(CUDA, dtype, p) == entry["kernel"]
    line = plan.describe(dtype)
    assert f"auto -> {entry['kernel']} for {entry['family']} at N={plan.seq_len}, {entry['dtype']}" in line
    assert f"measured table ({entry['gpu']} sm 9.0" in line and entry["report"] in line
    assert f"attention dropout {p:g}, contiguous q/k/v" in line and "WARNING" not in line  # bf3efde: no views yet
    other = 0.1 if p == 0.0 else 0.0
    with_other = _auto_plan(entry["bench_layout"], entry["n"])
    allowed = {k: r for k, r in entry["ratios"].items() if not (other > 0 and k == "flex")}
    assert with_other.prepare(CUDA, dtype, other) == min(allowed, key=lambda k: (allowed[k], k != "dense"))
    warned = with_other.describe(dtype)
    assert f"WARNING: the table was measured at attention dropout {p:g}, this run trains with {other:g}" in warned
    assert "falling back to the dropout-" in warned and f"--dropout {other:g}" in warned


def test_each_family_gets_its_fastest_measured_path_on_h200(h200):
    """The bf3efde H200 table (issue #48): BlockBERT -> block_gather, Fixed and the window -> triton_block (dense
    given the layout runs SDPA with its mask, ~5x dense: never the pick); the rule alone gives flex on sm 8.0+."""
    assert _auto_plan("fixed_b64", 4096).prepare(CUDA, torch.bfloat16, 0.0) == "triton_block"
    assert _auto_plan("blockbert_n2", 8192).prepare(CUDA, torch.bfloat16, 0.0) == "block_gather"
    assert _auto_plan("blockbert_n3", 4096).prepare(CUDA, torch.bfloat16, 0.1) == "block_gather"
    assert _auto_plan("local_bi_b64", 8192).prepare(CUDA, torch.bfloat16, 0.1) == "triton_block"


@pytest.mark.parametrize(
    "why, capability, n, dtype",
    [
        ("other GPU generation", (8, 0), 4096, torch.bfloat16),
        ("below the measured N", (9, 0), 1024, torch.bfloat16),
        ("above the measured N", (9, 0), 16384, torch.bfloat16),
        ("unmeasured dtype", (9, 0), 4096, torch.float16),
    ],
)
def test_no_entry_falls_back_to_the_rule(monkeypatch, h200, why, capability, n, dtype):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    plan = _auto_plan("fixed_b64", n)
    rule = A.choose_kernel("cuda", dtype, plan.seq_len, plan.density, dropout=False, capability=capability)
    assert plan.prepare(CUDA, dtype, 0.0) == rule
    assert ": rule (cuda sm " in plan.describe(dtype)


def test_nearest_measured_n_within_the_range():
    table = {
        "entries": [
            dict(capability=[9, 0], family="f", dtype="bf16", padded_n=n, ratios={"dense": 1.0, "block_gather": r})
            for n, r in ((4096, 1.5), (8192, 0.5))
        ]
    }

    def pick(n):
        hit = table_choice((9, 0), "f", n, torch.bfloat16, 0.0, table)
        return hit and hit.kernel

    assert [pick(n) for n in (4096, 5000, 6000, 8192)] == ["dense", "dense", "block_gather", "block_gather"]
    assert pick(2048) is None and pick(8193) is None
    assert table_choice((9, 0), "g", 4096, torch.bfloat16, 0.0, table) is None


def test_entries_of_the_runs_dropout_win_over_others():
    """With entries at dropout 0 and 0.1 for one key, a run at 0.1 follows the 0.1 ones without a warning; a run at
    0.08 follows the nearest (0.1) and is warned; flex is never picked under dropout."""
    table = {
        "entries": [
            dict(capability=[9, 0], family="f", dtype="bf16", padded_n=4096, dropout=p, ratios=ratios)
            for p, ratios in (
                (0.0, {"dense": 1.0, "flex": 0.2, "block_gather": 0.5, "triton_block": 0.6}),
                (0.1, {"dense": 1.0, "flex": 0.2, "block_gather": 0.7, "triton_block": 0.4}),
            )
        ]
    }
    assert table_choice((9, 0), "f", 4096, torch.bfloat16, 0.0, table).kernel == "flex"
    at_01 = table_choice((9, 0), "f", 4096, torch.bfloat16, 0.1, table)
    assert (at_01.kernel, at_01.entry["dropout"], at_01.warning) == ("triton_block", 0.1, "")
    at_008 = table_choice((9, 0), "f", 4096, torch.bfloat16, 0.08, table)
    assert at_008.kernel == "triton_block" and at_008.warning.startswith("WARNING: the table was measured at ")
    old = {"entries": [dict(table["entries"][0], dropout=False)]}  # a table written before dropout was a value
    hit = table_choice((9, 0), "f", 4096, torch.bfloat16, 0.1, old)
    assert hit.kernel == "block_gather" and "measured at attention dropout 0," in hit.warning


def test_token_mask_layouts_and_deterministic_runs_use_the_rule(h200, monkeypatch):
    """A SparseBERT token mask reshapes the layout (no family), and --deterministic runs SDPA's math backend, which
    the table did not measure: both keep the rule."""
    mask = torch.ones(12, 4096, 4096, dtype=torch.bool).tril(64).triu(-64)
    mod = A.BlockSparseAttention(layouts()["fixed_b64"](), kernel="auto", max_seq_length=4096, fixed_token_mask=mask)
    assert mod._plan(4096, CUDA).family is None
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    plan = _auto_plan("local_bi_b64", 4096)
    assert plan.prepare(CUDA, torch.bfloat16, 0.0) == "block_gather" and "rule" in plan.describe(torch.bfloat16)


def test_start_up_lines_name_each_distinct_choice_once():
    """What the trainer prints at start: one line per distinct ``auto`` choice across the layers (CPU: the rule)."""
    d = ModelConfig.preset("tiny", max_position_embeddings=256).to_dict()
    d["attention"] = {**d["attention"], "sparsity": {"mode": "fixed", "block": 16}}
    model = BertForPreTraining(ModelConfig.from_dict(d))
    lines = model.build_attention_plans(256, "cpu", torch.float32)
    assert len(lines) == 1 and lines[0].startswith("attention kernel auto -> block_gather for fixed_b16 at N=256")
    assert "rule (cpu, density" in lines[0]


def test_entries_say_under_which_dropout_and_qkv_layout_they_were_measured(tmp_path):
    """A report of ``benchmarks.attention`` says its attention dropout and q/k/v layout (meta ``dropout``, ``qkv``);
    the entry keeps both, and a report older than those keys counts as dropout 0 with contiguous q/k/v."""
    rows = [
        dict(kernel=k, layout="fixed_b64", n=4096, density=0.3, time_best_s=t, dense_time_best_s=1.0)
        for k, t in (("flex", 0.9), ("block_gather", 0.8))
    ]
    meta = dict(machine="NVIDIA H200 (x86_64)", device="cuda", dtype="bf16", commit="abc1234")
    for name, extra in (("new", dict(dropout=0.1, qkv="fused_views")), ("old", {})):
        (tmp_path / f"{name}.json").write_text(json.dumps(dict(meta=meta | extra, rows=rows, complete=True)))
    new, old = (auto_table.build([(f"{n}.json", "")], root=tmp_path)["entries"][0] for n in ("new", "old"))
    assert (new["dropout"], new["qkv"], new["kernel"]) == (0.1, "fused_views", "block_gather")
    assert (old["dropout"], old["qkv"]) == (0.0, "contiguous")
