"""Every model family trains and resumes exactly under ZeRO 0, 1, 2 and 3 on 2 CPU ranks.

The families come from the registries (every SparseBERT token pattern, DAM and a mask file included; every DIET
position type; every segment encoding) plus dense, BlockBERT and a free head size, so a new model option is covered
without a new test. Per ZeRO stage one `deepspeed --num_gpus 2` launch runs, per family, a straight 4-iteration run
and a 2 + 2 run (saved at 2 by --exit-interval, resumed with --load) through the real Trainer; the resumed losses,
LRs and gradient norms must equal the straight run's bitwise (dropout stays on: the RNG is restored)."""

from __future__ import annotations

import json

import pytest

from model.attention.token_patterns import TOKEN_MASKS
from model.config import ModelConfig
from model.positions import POSITION_TYPES, SEGMENT_TYPES
from tests import train_utils as tu

pytestmark = [
    pytest.mark.multirank,
    pytest.mark.extended,
]  # ~2-3 min in all; canaries: tests/test_train_resume.py, test_convert_checkpoint.py
N = 32
ITERS, STOP = 4, 2
STAGES = (0, 1, 2, 3)


def _token_mask(pattern: str, tmp) -> dict:
    tm = {"pattern": pattern, "seq_len": N, "block": 8}
    if TOKEN_MASKS[pattern].kind == "file":  # stage 2 of a SparseBERT run: a mask saved by stage 1
        import torch

        from model.attention.token_patterns import save_masks

        path = tmp / "masks.pt"
        keep = torch.rand(2, 4, N, N, generator=torch.Generator().manual_seed(0)) > 0.5
        keep |= torch.eye(N, dtype=torch.bool)
        save_masks(str(path), {f"layer{i}": keep[i] for i in range(2)})
        tm["path"] = str(path)
    return tm


def families(tmp) -> dict[str, dict]:
    """name -> ModelConfig overrides of the 'tiny' preset (hidden 64, 2 layers, 4 heads)."""
    out: dict[str, dict] = {
        "dense": {},
        "blockbert_n2": {"attention": {"sparsity": {"mode": "blockbert", "num_blocks": 2, "head_assignment": "3:1"}}},
        "free_head_size": {"head_size": 24},
    }
    for pattern in TOKEN_MASKS:
        out[f"token_{pattern}"] = {"attention": {"token_mask": _token_mask(pattern, tmp)}}
    for pos in POSITION_TYPES:
        if pos != "absolute":
            out[f"position_{pos}"] = {"position": {"type": pos}}
    for seg in SEGMENT_TYPES:
        if seg != "input":
            out[f"segment_{seg}"] = {"segment": seg}
    return out


def _runs(tmp, name: str, stage: int) -> list[list[str]]:
    base = tu.train_args(tmp, f"zero{stage}_fp32.json", ITERS, "--model-config", str(tmp / f"{name}.json"), seq=N)
    base += ["--global-batch-size", "8"]
    ck = str(tmp / f"ck_{name}_z{stage}")
    log = lambda kind: ["--log-json", str(tmp / f"{name}_z{stage}_{kind}.jsonl")]  # noqa: E731
    resumable = ["--save", ck, "--load", ck]
    return [
        base + log("straight"),
        base + log("resumed") + resumable + ["--exit-interval", str(STOP)],
        base + log("resumed") + resumable,
    ]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    tmp = tu.prepare(tmp_path_factory.mktemp("zero_matrix"))
    fams = families(tmp)
    for name, overrides in fams.items():
        cfg = ModelConfig.preset("tiny", vocab_size=tu.VOCAB_SIZE, max_position_embeddings=64, **overrides)
        (tmp / f"{name}.json").write_text(json.dumps(cfg.to_dict()))
    return tmp, sorted(fams)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("stage", STAGES)
def test_every_family_trains_and_resumes_exactly(prepared, stage):
    tmp, names = prepared
    spec = tmp / f"spec_z{stage}.json"
    spec.write_text(json.dumps({"cases": [{"name": n, "runs": _runs(tmp, n, stage)} for n in names]}))
    p = tu.launch("deepspeed", [str(spec)], entry=tu.REPO / "tests" / "zero_matrix_entry.py", timeout=840)
    assert p.returncode == 0, p.stdout[-6000:]
    bad = []
    for name in names:
        straight = tu.train_records(tmp / f"{name}_z{stage}_straight.jsonl")
        resumed = tu.train_records(tmp / f"{name}_z{stage}_resumed.jsonl")
        assert [r["iteration"] for r in straight] == list(range(1, ITERS + 1)), name
        assert [r["iteration"] for r in resumed] == list(range(1, ITERS + 1)), name
        keys = ("loss", "lr", "grad_norm")
        if [[r[k] for k in keys] for r in straight] != [[r[k] for k in keys] for r in resumed]:
            bad.append(f"{name}: straight {[r['loss'] for r in straight]} vs resumed {[r['loss'] for r in resumed]}")
    assert not bad, f"ZeRO-{stage}: resume differs from a straight run:\n" + "\n".join(bad)
