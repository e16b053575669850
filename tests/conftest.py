"""Shared fixtures: where the reference corpus lives, tiny temp dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _corpus_dir() -> Path:
    env = os.environ.get("SPARSEBERT_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


CORPUS = _corpus_dir()

EXTENDED = os.environ.get("SPARSE_BERT_EXTENDED") == "1"
"""Run the tests marked ``extended`` (run_scripts/extended_check.sh sets it): longer than CI's budget, or not yet
seen passing three times in a row under load."""

if os.environ.get("TRITON_INTERPRET") is None:
    import torch

    if not torch.cuda.is_available():
        # Triton reads it when it is imported (its own @triton.jit helpers, tl.rand, are decorated then): on a machine
        # without a GPU, Triton can only interpret, and tests/test_triton_block.py runs our kernel that way.
        os.environ["TRITON_INTERPRET"] = "1"

LONG = EXTENDED or os.environ.get("SPARSE_BERT_LONG") == "1"
"""Run the tests marked ``long`` (run_scripts/repeat_check.sh sets it): multi-rank, multi-host and Slurm cases that
are proven stable but too long for CI's budget; the repeat check runs them N times under load before every stop."""


def pytest_collection_modifyitems(config, items) -> None:
    skips = {}
    if not EXTENDED:
        reason = "extended check only: bash run_scripts/extended_check.sh (SPARSE_BERT_EXTENDED=1)"
        skips["extended"] = pytest.mark.skip(reason=reason)
    if not LONG:
        skips["long"] = pytest.mark.skip(reason="long: bash run_scripts/repeat_check.sh runs it (SPARSE_BERT_LONG=1)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)
                break


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The shared reference corpus (../shared/corpus or $SPARSEBERT_CORPUS); skips when absent."""
    if not (CORPUS / "SOURCES.md").is_file():
        pytest.skip(f"reference corpus not found at {CORPUS} (set SPARSEBERT_CORPUS to its path)")
    return CORPUS


@pytest.fixture(scope="session")
def bert_uncased_vocab(corpus: Path) -> Path:
    p = corpus / "vocab" / "bert-base-uncased" / "vocab.txt"
    if not p.is_file():
        pytest.skip(f"BERT uncased vocab not found at {p}")
    return p


def _listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and modification time."""
    out = {}
    if root.is_dir():
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                st = p.stat()
                out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


#: inputs the suite reads and must never write: the reference corpus and the shipped sample corpus. Tests run as
#: root in CI, where a read-only mode does not stop a write, so the check is on the contents themselves.
READ_ONLY_INPUTS = (CORPUS, REPO / "run_scripts" / "sample_data")


@pytest.fixture(scope="session", autouse=True)
def no_shared_memory_left_behind():
    """Removes DeepSpeed CPU all-reduce buffers (/dev/shm, RAM) that runs of this session left: the trainer unlinks
    its own once mapped, but a rank killed during initialisation (the fault tests) cannot."""
    shm = Path("/dev/shm")
    before = set(shm.glob("deepspeed_allreduce_buffer_*")) if shm.is_dir() else set()
    yield
    for p in (set(shm.glob("deepspeed_allreduce_buffer_*")) if shm.is_dir() else set()) - before:
        p.unlink(missing_ok=True)


@pytest.fixture(scope="session", autouse=True)
def inputs_stay_untouched():
    """Fails the session if any test wrote into, changed or deleted from an input directory (caches and outputs
    belong in temporary directories)."""
    before = {str(root): _listing(root) for root in READ_ONLY_INPUTS}
    yield
    changed = []
    for root in READ_ONLY_INPUTS:
        now = _listing(root)
        old = before[str(root)]
        changed += [f"{root}/{k}: {'new' if k not in old else 'changed'}" for k in now if now[k] != old.get(k)]
        changed += [f"{root}/{k}: deleted" for k in old if k not in now]
    assert not changed, "tests wrote into their inputs:\n  " + "\n  ".join(changed[:20])


@pytest.fixture
def fail_on_recompile_limit():
    """Compiled flex must never fall back to eager silently: on for one test only (set for the whole session, CPU's
    eager FlexAttention, itself a compiled wrapper, failed in later modules). Through ``torch._dynamo.config.patch``,
    never ``monkeypatch``: pytest 9.2's monkeypatch restores from the target's ``__dict__``, where torch's config
    module keeps no values, so its undo deleted the key, which torch then hides for the rest of the session
    (``recompile_limit does not exist`` in every later flex call)."""
    import torch._dynamo

    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
