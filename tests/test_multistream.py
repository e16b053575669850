"""A multistream Wikipedia dump split by its index into units of streams (data_pipeline/multistream.py): each unit
reads only its own streams; over workers, MPI ranks and a resume after SIGKILL the shards equal one process reading
the whole dump, byte for byte."""

from __future__ import annotations

import bz2
import shutil
import subprocess
from pathlib import Path

import pytest

from data_pipeline import multistream
from data_pipeline.readers import BadInputLog, read_documents
from tests import multistream_dump
from tests.preprocess_utils import REPO, kill_when_done, preprocess_cmd, same_shards

TINY = "0.000001"  # --multistream-unit-mb: one stream per unit


@pytest.fixture(scope="module")
def dump(corpus, tmp_path_factory) -> Path:
    src = corpus / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    if not src.is_file():
        pytest.skip(f"{src} not in the corpus")
    return multistream_dump.build(src, tmp_path_factory.mktemp("ms"), per_stream=10)


def _docs(spec: str) -> list[str]:
    log = BadInputLog()
    docs = [d.texts["text"] for d in read_documents(spec, "auto", ["text"], log)]
    assert log.total == 0, log.format()
    return docs


def test_units_read_only_their_streams_and_together_the_whole_dump(dump):
    whole = _docs(str(dump))
    assert len(whole) == 106  # the sample's articles (its redirects are skipped)
    for unit_bytes in (1, 60_000, 500_000):
        units = multistream.split_dump(str(dump), unit_bytes)
        assert [d for u in units for d in _docs(u)] == whole
    units = multistream.split_dump(str(dump), 1)
    assert len(units) == 21  # 206 pages, 10 per stream; the header and closing streams belong to no unit
    path, start, end = multistream.parse_unit(units[1])
    assert (path, end) == (str(dump), multistream.parse_unit(units[2])[1])
    assert multistream.split_dump(str(dump), 0) == [str(dump)]


def test_index_naming_and_bad_indexes(dump, tmp_path):
    assert multistream.index_path(str(dump)) == str(dump).replace(".xml.bz2", "-index.txt.bz2")
    part = tmp_path / "enwiki-2024-pages-articles-multistream3.xml-p151574p311329.bz2"
    part.write_bytes(b"")
    idx = tmp_path / "enwiki-2024-pages-articles-multistream-index3.txt-p151574p311329.bz2"
    assert multistream.index_path(str(part)) is None  # no index beside it: one unit
    idx.write_bytes(bz2.compress(b"600:12:Anarchism\n"))
    assert multistream.index_path(str(part)) == str(idx)
    with pytest.raises(ValueError, match="not this dump's index"):
        multistream.split_dump(str(part), 1)  # offset 600 past an empty file
    idx.write_bytes(bz2.compress(b"600:12:Anarchism\nnot an index line\n"))
    with pytest.raises(ValueError, match="line 2"):
        multistream.split_dump(str(part), 1)


def test_a_range_that_ends_inside_a_stream_is_reported(dump):
    path, start, end = multistream.parse_unit(multistream.split_dump(str(dump), 1)[3])
    log = BadInputLog()
    docs = list(read_documents(f"{path}#streams={start}-{end - 10}", "auto", ["text"], log))
    assert docs == [] and "truncated_file" in log.format()


@pytest.fixture(scope="module")
def one_unit(dump, bert_uncased_vocab, tmp_path_factory) -> Path:
    """The reference: one process reading the whole dump as one unit."""
    ref = tmp_path_factory.mktemp("ref") / "ref"
    cmd = preprocess_cmd(dump, ref, bert_uncased_vocab, "--multistream-unit-mb", "0", "--workers", "1")
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, timeout=300)
    return ref


@pytest.mark.timeout(300)
def test_units_over_workers_write_the_bytes_of_one_unit(dump, one_unit, bert_uncased_vocab, tmp_path):
    out = tmp_path / "units"
    r = subprocess.run(
        preprocess_cmd(dump, out, bert_uncased_vocab, "--multistream-unit-mb", TINY, "--workers", "2"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert same_shards(out, one_unit)


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_units_over_two_mpi_ranks_write_the_bytes_of_one_unit(dump, one_unit, bert_uncased_vocab, tmp_path):
    if shutil.which("mpirun") is None:
        pytest.skip("mpirun not installed (run_scripts/setup_env.sh installs openmpi)")
    out = tmp_path / "two"
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
    r = subprocess.run(
        mpirun + preprocess_cmd(dump, out, bert_uncased_vocab, "--multistream-unit-mb", TINY, "--workers", "1"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "rank 1/2" in r.stderr
    assert same_shards(out, one_unit)


@pytest.mark.timeout(300)
def test_sigkill_then_resume_per_unit_is_byte_identical(dump, one_unit, bert_uncased_vocab, tmp_path):
    out = tmp_path / "run"
    cmd = preprocess_cmd(dump, out, bert_uncased_vocab, "--multistream-unit-mb", TINY, "--workers", "1")
    done = kill_when_done(cmd, out, 3, timeout=200)
    assert 3 <= done < 21
    r = subprocess.run(cmd + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert f"{done} of 21 input file(s) already done, skipped" in r.stderr
    assert same_shards(out, one_unit)
