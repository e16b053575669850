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


def _worker(rank: int, port: int, job: str, dirs: list[str], out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
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
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def _run(job: str, dirs: list[Path], tmp_path: Path) -> list[dict]:
    mp.start_processes(
        _worker,
        args=(tu.free_port(), job, [str(d) for d in dirs], str(tmp_path)),
        nprocs=2,
        start_method="spawn",
        join=True,
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert "crash" not in r, r.get("crash")
    return results


def test_rank0_decides_even_when_another_rank_sees_a_stale_latest(tmp_path):
    a, b = tmp_path / "node0", tmp_path / "node1"
    _tag(a, 2)
    _tag(a, 4)
    _tag(b, 2)
    _tag(b, 4, latest=False)  # rank 1's `latest` is stale: on its own it would resume iteration 2
    assert ck.find_resume_tag(b) == ck.tag_for(2)
    results = _run("resume", [a, b], tmp_path)
    assert [r["tag"] for r in results] == [ck.tag_for(4)] * 2


def test_a_rank_that_cannot_see_the_checkpoint_stops_every_rank_naming_it(tmp_path):
    a, b = tmp_path / "node0", tmp_path / "node1"
    _tag(a, 2)
    _tag(a, 4)
    _tag(b, 2)  # node-local directory of rank 1 never received iteration 4
    results = _run("resume", [a, b], tmp_path)
    assert all("error" in r for r in results)
    assert results[0]["error"] == results[1]["error"]
    msg = results[0]["error"]
    assert "rank 1 on " in msg and str(b / ck.tag_for(4) / ck.COMMIT_MARKER) in msg and "rank 0" in msg


def test_no_checkpoint_on_rank0_means_a_fresh_start_everywhere(tmp_path):
    a, b = tmp_path / "node0", tmp_path / "node1"
    _tag(b, 2)  # only rank 1 sees one: rank 0's view wins
    assert [r["tag"] for r in _run("resume", [a, b], tmp_path)] == [None, None]


def test_broadcast_module_state_gives_every_rank_rank0s_weights(tmp_path):
    results = _run("broadcast", [tmp_path, tmp_path], tmp_path)
    assert results[0] == results[1]
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    ref.register_buffer("mask", torch.rand(3) > 0.5)
    assert results[1] == {k: v.tolist() for k, v in ref.state_dict().items()}
