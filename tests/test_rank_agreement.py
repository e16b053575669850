"""Two gloo processes whose views of the checkpoint directory differ (as with stale network-filesystem caches or
node-local disks): rank 0 decides what to resume and every rank follows or stops together, naming the path;
rank 0's weights reach every rank without the others reading a file."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pretrain import checkpoint as ck
from tests import train_utils as tu

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(180)]


def _tag(root: Path, it: int, latest: bool = True) -> None:
    d = root / ck.tag_for(it)
    d.mkdir(parents=True)
    (d / ck.COMMIT_MARKER).write_text(json.dumps({"iteration": it}))
    if latest:
        (root / ck.LATEST).write_text(ck.tag_for(it))


def _worker(rank: int, port: int, jobs: list[tuple[str, list[str]]], out: str) -> None:
    """Every job of the module in one process group (one spawn of two ranks: their start-up is most of the cost)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    results = []
    for job, dirs in jobs:
        try:
            if job == "resume":
                try:
                    tag, client = ck.agree_on_resume(dirs[rank], read_client=False)
                    result = {"tag": tag}
                except ck.CheckpointError as e:
                    result = {"error": str(e)}
            else:
                from pretrain.distributed import broadcast_module_state

                torch.manual_seed(rank)  # different weights on each rank before the broadcast
                m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
                m.register_buffer("mask", torch.rand(3) > 0.5)
                broadcast_module_state(m, torch.device("cpu"))
                result = {k: v.tolist() for k, v in m.state_dict().items()}
        except Exception:
            result = {"crash": traceback.format_exc()}
        results.append(result)
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def _stale_latest(root: Path) -> list[Path]:
    a, b = root / "node0", root / "node1"
    _tag(a, 2)
    _tag(a, 4)
    _tag(b, 2)
    _tag(b, 4, latest=False)  # rank 1's `latest` is stale: on its own it would resume iteration 2
    return [a, b]


def _unseen(root: Path) -> list[Path]:
    a, b = root / "node0", root / "node1"
    _tag(a, 2)
    _tag(a, 4)
    _tag(b, 2)  # node-local directory of rank 1 never received iteration 4
    return [a, b]


def _only_rank1(root: Path) -> list[Path]:
    a, b = root / "node0", root / "node1"
    _tag(b, 2)  # only rank 1 sees one: rank 0's view wins
    return [a, b]


def _broadcast(root: Path) -> list[Path]:
    root.mkdir()
    return [root, root]


#: each test's job and the directories its two ranks see
CASES = {"stale": ("resume", _stale_latest), "unseen": ("resume", _unseen), "none": ("resume", _only_rank1)}
CASES["broadcast"] = ("broadcast", _broadcast)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict[str, tuple[list[Path], list[dict]]]:
    """Every case's two results (rank 0's, rank 1's), from one two-rank run."""
    tmp = tmp_path_factory.mktemp("rank_agreement")
    dirs = {name: make(tmp / name) for name, (_, make) in CASES.items()}
    jobs = [(job, [str(d) for d in dirs[name]]) for name, (job, _) in CASES.items()]
    mp.start_processes(_worker, args=(tu.free_port(), jobs, str(tmp)), nprocs=2, start_method="spawn", join=True)
    per_rank = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(2)]
    out = {}
    for i, name in enumerate(CASES):
        results = [per_rank[0][i], per_rank[1][i]]
        for r in results:
            assert "crash" not in r, r.get("crash")
        out[name] = (dirs[name], results)
    return out


def test_rank0_decides_even_when_another_rank_sees_a_stale_latest(ran):
    (a, b), results = ran["stale"]
    assert ck.find_resume_tag(b) == ck.tag_for(2)
    assert [r["tag"] for r in results] == [ck.tag_for(4)] * 2


def test_a_rank_that_cannot_see_the_checkpoint_stops_every_rank_naming_it(ran):
    (a, b), results = ran["unseen"]
    assert all("error" in r for r in results)
    assert results[0]["error"] == results[1]["error"]
    msg = results[0]["error"]
    assert "rank 1 on " in msg and str(b / ck.tag_for(4) / ck.COMMIT_MARKER) in msg and "rank 0" in msg


def test_no_checkpoint_on_rank0_means_a_fresh_start_everywhere(ran):
    assert [r["tag"] for r in ran["none"][1]] == [None, None]


def test_broadcast_module_state_gives_every_rank_rank0s_weights(ran):
    results = ran["broadcast"][1]
    assert results[0] == results[1]
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    ref.register_buffer("mask", torch.rand(3) > 0.5)
    assert results[1] == {k: v.tolist() for k, v in ref.state_dict().items()}
