"""A rank whose output reader is gone (the ssh session of ``deepspeed --launcher pdsh`` ended by the runner's
SIGTERM) goes on: its prints and log lines go to /dev/null instead of raising BrokenPipeError, so it can still save
(common/process.py: outlive_lost_output)."""

from __future__ import annotations

import subprocess
import sys

from tests import train_utils as tu

CHILD = """import logging, sys, time
sys.path.insert(0, {repo!r})
from common.process import outlive_lost_output
if {guard}:
    outlive_lost_output()
log = logging.getLogger("ds")
log.addHandler(logging.StreamHandler(sys.stdout))  # as DeepSpeed's logger, created after the guard
print("ready", flush=True)
time.sleep(1.5)  # the reader closes the pipe meanwhile
for i in range(200):
    print("line", i, flush=True)
    log.warning("log line %d", i)
    print("err", i, file=sys.stderr, flush=True)
open({marker!r}, "w").write("saved")
"""


def _run(tmp_path, guard: bool) -> tuple[int, bool]:
    marker = tmp_path / f"saved_{guard}"
    code = CHILD.format(repo=str(tu.REPO), guard=guard, marker=str(marker))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline() == b"ready\n"
    p.stdout.close()
    p.stderr.close()
    return p.wait(timeout=60), marker.exists()


def test_a_rank_whose_reader_is_gone_carries_on(tmp_path):
    assert _run(tmp_path, guard=True) == (0, True)


def test_without_the_guard_it_dies_at_its_next_line(tmp_path):
    code, saved = _run(tmp_path, guard=False)
    assert code != 0 and not saved
