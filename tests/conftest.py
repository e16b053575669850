"""The suite's tiers and shared fixtures (where the reference corpus lives, tiny temp dirs).

Two tiers: the default tier (run_scripts/test.sh, CI) holds every test that takes under
:data:`DEFAULT_TIER_BUDGET_S` alone on the 2-core dev box; a longer one is marked ``extended`` (with why and its
time) and runs only in run_scripts/extended_check.sh (``SPARSE_BERT_EXTENDED=1``). ``multirank`` says a test starts
several processes (the floor pass and ``-m "not multirank"`` leave those out); it is not a tier. ``gpu`` tests run on a
CUDA GPU where there is one (devtools/gpu_check selects them)."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _corpus_dir() -> Path:
    env = os.environ.get("SPARSEBERT_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


CORPUS = _corpus_dir()

EXTENDED = os.environ.get("SPARSE_BERT_EXTENDED") == "1"
"""Run the tests marked ``extended`` (run_scripts/extended_check.sh and run_scripts/repeat_check.sh set it): the
second tier, longer than the default tier's budget (a test over :data:`DEFAULT_TIER_BUDGET_S` belongs there)."""

DEFAULT_TIER_BUDGET_S = 30.0
"""A default-tier test that takes longer than this on the 2-core dev box belongs to the extended tier; the summary
names every one that did (a report, not a failure: a loaded machine slows every test)."""

# The DeepSpeed CPU op that run_scripts/setup_env.sh builds lives here; the ranks the tests launch look in the same
# place, so a plain `pytest FILE` works as well as run_scripts/test.sh (which exports the same default).
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))

XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
"""How many pytest-xdist workers share this machine (run_scripts/test.sh starts 2; 0 without xdist)."""

if XDIST_WORKERS > 1:
    # Each worker gets its share of the cores for torch's intra-op threads (and so do the processes it starts that do
    # not set their own): two workers of 2 threads each on 2 cores only slow each other down. The launched ranks
    # already run with OMP_NUM_THREADS=1 (tests/train_utils.py env()).
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // XDIST_WORKERS)))
    # transformers copies an exported model's remote code into one modules cache, under the model directory's name:
    # two workers loading same-named exports (tmp_path/dense_remote) at once would write the same files
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw")
    os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix=f"hf-modules-{worker}-"))
    atexit.register(shutil.rmtree, os.environ["HF_MODULES_CACHE"], True)

if os.environ.get("TRITON_INTERPRET") is None:
    import torch

    if not torch.cuda.is_available():
        # Triton reads it when it is imported (its own @triton.jit helpers, tl.rand, are decorated then): on a machine
        # without a GPU, Triton can only interpret, and tests/test_triton_block.py runs our kernel that way.
        os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config, items) -> None:
    if EXTENDED:
        return
    skip = pytest.mark.skip(reason="extended tier: bash run_scripts/extended_check.sh (SPARSE_BERT_EXTENDED=1)")
    for item in items:
        if "extended" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    """Names the default-tier tests that took longer than the tier's budget (setup + call + teardown)."""
    if EXTENDED:
        return
    took: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) in ("setup", "call", "teardown") and hasattr(r, "duration"):
                took[r.nodeid] = took.get(r.nodeid, 0.0) + r.duration
    over = sorted(((t, n) for n, t in took.items() if t > DEFAULT_TIER_BUDGET_S), reverse=True)
    if over:
        terminalreporter.section(f"default-tier tests over {DEFAULT_TIER_BUDGET_S:.0f} s (move to the extended tier)")
        for t, n in over:
            terminalreporter.write_line(f"{t:7.1f} s  {n}")


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


def _shm_buffers() -> set[Path]:
    shm = Path("/dev/shm")
    return set(shm.glob("deepspeed_allreduce_buffer_*")) if shm.is_dir() else set()


def pytest_sessionstart(session) -> None:
    if not hasattr(session.config, "workerinput"):  # the one process that outlives every test (xdist's controller)
        session.config._shm_before = _shm_buffers()


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ARG001
    """Removes DeepSpeed CPU all-reduce buffers (/dev/shm, RAM) that runs of this session left: the trainer unlinks
    its own once mapped, but a rank killed during initialisation (the fault tests) cannot. Only once every test is
    done (an xdist worker that finishes first would unlink the buffer of a run still starting on another)."""
    before = getattr(session.config, "_shm_before", None)
    if before is not None:
        for p in _shm_buffers() - before:
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
