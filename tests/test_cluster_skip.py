"""A cluster test whose machine has root and the tools fails when its cluster does not start; it skips only by
request (tests/cluster_skip.py)."""

from __future__ import annotations

import pytest
from _pytest.outcomes import Failed, Skipped

from tests.cluster_skip import SKIP_OK, start_failed


def test_a_cluster_that_should_start_and_does_not_fails(monkeypatch):
    monkeypatch.delenv(SKIP_OK, raising=False)
    with pytest.raises(Failed, match=r"the test Slurm cluster did not start .*slurmctld did not answer.*=1 to skip"):
        start_failed("the test Slurm cluster", RuntimeError("slurmctld did not answer `scontrol ping`"))


def test_the_skip_is_explicit(monkeypatch):
    monkeypatch.setenv(SKIP_OK, "1")
    with pytest.raises(Skipped, match=r"did not start .*ip netns add.*SPARSE_BERT_CLUSTER_SKIP_OK=1"):
        start_failed("the 2-host test cluster", RuntimeError("`ip netns add sb0` failed: permission denied"))
