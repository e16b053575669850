"""Readers: format detection, each format, and bad input reported with file and line/offset."""

from __future__ import annotations

import bz2
import json
import re
from pathlib import Path

import pytest

from data_pipeline.readers import BadInputLog, detect_format, expand_inputs, read_documents

SAMPLE = Path(__file__).resolve().parents[1] / "run_scripts" / "sample_data" / "corpus"


def _docs(path, fmt="auto", keys=("text",)):
    log = BadInputLog()
    return list(read_documents(str(path), fmt, list(keys), log)), log


def test_detect_format_from_content(tmp_path):
    assert detect_format(str(SAMPLE / "wiki" / "sample-pages-articles.xml.bz2")) == "mediawiki"
    assert detect_format(str(SAMPLE / "wikiextractor" / "AA" / "wiki_00")) == "wikiextractor"
    assert detect_format(str(SAMPLE / "jsonl" / "articles.jsonl")) == "jsonl"
    assert detect_format(str(next((SAMPLE / "books").glob("*.txt")))) == "text"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "x.data")  # no telling extension
    assert detect_format(str(tmp_path / "x.data")) == "parquet"


def test_mediawiki_skips_redirects_and_other_namespaces():
    docs, log = _docs(SAMPLE / "wiki" / "sample-pages-articles.xml.bz2")
    assert len(docs) == 150 and log.total == 0
    titles = [re.search(r"page '(.*)'", d.where).group(1) for d in docs]
    assert "Harrowgate Town" not in titles and not any(t.startswith("Talk:") for t in titles)
    assert docs[0].kind == "wikitext" and "{{Infobox" in docs[0].texts["text"]


def test_real_dump_article_count_matches_an_independent_parse(corpus):
    import xml.etree.ElementTree as ET

    path = corpus / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    expect = 0
    for _, el in ET.iterparse(bz2.open(path)):
        if el.tag.endswith("}page"):
            ns = el.find("{*}ns").text
            redirect = el.find("{*}redirect") is not None
            text = el.find("{*}revision/{*}text").text or ""
            expect += ns == "0" and not redirect and not text.upper().startswith("#REDIRECT")
            el.clear()
    docs, log = _docs(path)
    assert len(docs) == expect > 90 and log.total == 0


def test_truncated_bz2_keeps_pages_read_and_reports(tmp_path):
    # recompressed in 100 kB blocks, so the blocks before the cut can still be decompressed
    raw = bz2.compress(bz2.decompress((SAMPLE / "wiki" / "sample-pages-articles.xml.bz2").read_bytes()), 1)
    cut = tmp_path / "cut.xml.bz2"
    cut.write_bytes(raw[: len(raw) * 2 // 3])
    docs, log = _docs(cut)
    assert 0 < len(docs) < 150
    assert log.counts == {"truncated_file": 1}
    assert log.examples["truncated_file"][0]["file"] == str(cut)


def test_wikiextractor_drops_title_line_and_reports_unterminated(tmp_path):
    p = tmp_path / "wiki_00"
    p.write_text(
        '<doc id="1" url="u" title="Alpha">\nAlpha\n\nAlpha is a letter.\n</doc>\n'
        '<doc id="2" url="u" title="Only Title">\nOnly Title\n</doc>\n'
        '<doc id="3" url="u" title="Cut">\nCut\nno end tag\n',
        encoding="utf-8",
    )
    docs, log = _docs(p)
    assert [d.texts["text"].strip() for d in docs] == ["Alpha is a letter.", ""]
    assert log.counts == {"truncated_file": 1} and "line 9" in log.examples["truncated_file"][0]["where"]


def test_jsonl_bad_lines_reported_by_category_and_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_bytes(
        b'{"text": "good one"}\n{"text": broken\n{"other": "x"}\n'
        b'{"text": "bad \xff byte"}\n[1, 2]\n\n{"text": ["pre", "split"]}\n'
    )
    docs, log = _docs(p)
    assert [d.texts["text"] for d in docs] == ["good one", "bad \ufffd byte", "pre\nsplit"]
    assert log.counts == {"malformed_json": 2, "missing_key": 1, "invalid_utf8": 1}
    assert [e["where"] for e in log.examples["malformed_json"]] == ["line 2", "line 5"]
    assert log.examples["invalid_utf8"][0]["where"] == "line 4"


def test_jsonl_several_keys(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"title": "T", "text": "Body."}) + "\n")
    docs, _ = _docs(p, keys=("title", "text"))
    assert docs[0].texts == {"title": "T", "text": "Body."}


def test_book_is_one_trimmed_unwrapped_document():
    book = next((SAMPLE / "books").glob("book01_*.txt"))
    docs, log = _docs(book)
    assert len(docs) == 1 and log.total == 0
    text = docs[0].texts["text"]
    assert "START OF" not in text and "Licence placeholder" not in text
    assert text.startswith("THE LANTERN OF HARROWGATE\nby Imogen Pell\nCHAPTER 1.\n")
    assert all(len(line) > 0 for line in text.split("\n"))


def test_parquet_streams_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["one", None, "three"], "n": [1, 2, 3]}), tmp_path / "d.parquet")
    docs, log = _docs(tmp_path / "d.parquet")
    assert [d.texts["text"] for d in docs] == ["one", "three"]
    assert log.counts == {"missing_key": 1} and log.examples["missing_key"][0]["where"] == "row 2"
    docs, log = _docs(tmp_path / "d.parquet", keys=("content",))
    assert docs == [] and log.counts == {"missing_key": 1}


def test_expand_inputs_dirs_globs_and_missing(tmp_path):
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "out.parts").mkdir()
    (tmp_path / "d" / "reports").mkdir()
    for name in (
        "d/b.txt",
        "d/a.txt",
        "d/sub/c.txt",
        "d/.hidden",
        "d/out_text_document.idx",
        "d/out.parts/p.bin",
        "d/out.report.json",
        "d/reports/out.report.json",
    ):
        (tmp_path / name).write_text("x")
    log = BadInputLog()
    files = expand_inputs(
        [str(tmp_path / "d"), str(tmp_path / "d" / "*.txt"), str(tmp_path / "nope.txt"), str(tmp_path / "none*.json")],
        log,
    )
    assert [Path(f).relative_to(tmp_path).as_posix() for f in files] == ["d/a.txt", "d/b.txt", "d/sub/c.txt"]
    assert log.counts == {"missing_input": 2}


def test_unreadable_truncated_bz2_is_still_reported_as_its_format(tmp_path):
    raw = (SAMPLE / "wiki" / "sample-pages-articles.xml.bz2").read_bytes()
    cut = tmp_path / "one-block.xml.bz2"
    cut.write_bytes(raw[:200])  # a single 900 kB bz2 block, cut: nothing can be decompressed
    assert detect_format(str(cut)) == "mediawiki"
    docs, log = _docs(cut)
    assert docs == [] and log.counts == {"truncated_file": 1}


def _read_all(f, size: int) -> tuple[bytes, str | None]:
    """Bytes read in ``size`` pieces until the end or an error, and the error's type."""
    got = []
    try:
        while True:
            block = f.read(size)
            if not block:
                return b"".join(got), None
            got.append(block)
    except (EOFError, OSError) as e:
        return b"".join(got), type(e).__name__
    finally:
        f.close()


def test_threaded_bz2_reads_what_bz2_open_reads(tmp_path):
    """The XML reader's bz2 stream is decompressed ahead by a thread; it must give bz2.open's bytes and errors:
    one stream, several streams (pbzip2 / multistream dumps), trailing bytes after the last stream (ignored),
    a file cut inside a stream (EOFError after every decompressible byte: bz2.open loses those of the
    failing read), and a reader that stops early (no hang)."""
    from data_pipeline.readers import open_binary

    xml = bz2.decompress((SAMPLE / "wiki" / "sample-pages-articles.xml.bz2").read_bytes())
    one = bz2.compress(xml, 1)
    cases = {
        "one": one,
        "multi": one + bz2.compress(b"<!-- a second stream -->\n") + one,
        "trailing": one + b"\0\0 not bz2",
        "cut": one[: len(one) * 2 // 3],
    }
    for name, data in cases.items():
        path = tmp_path / f"{name}.xml.bz2"
        path.write_bytes(data)
        for size in (1, 16384, 1 << 20):
            if size == 1 and name != "one":
                continue
            expect = _read_all(bz2.open(path, "rb"), size if size > 1 else 7)
            got = _read_all(open_binary(str(path), prefetch=True), size if size > 1 else 7)
            if name == "cut":  # every byte the stream holds, then the error (bz2.open drops the failing read's)
                assert got == (bz2.BZ2Decompressor().decompress(data), "EOFError")
                assert got[0].startswith(expect[0]) and len(got[0]) > len(expect[0])
            else:
                assert got == expect, name
                assert got[1] is None
    f = open_binary(str(tmp_path / "multi.xml.bz2"), prefetch=True)
    assert f.read(10) == xml[:10]
    f.close()  # the thread is stopped and joined, its queue full or not


def _two_stream_dump(tmp_path: Path, second: bytes, name: str) -> tuple[Path, int]:
    """The sample dump's pages as one bz2 stream (without ``</mediawiki>``), then ``second``; returns the path and
    the number of articles the first stream holds."""
    xml = bz2.decompress((SAMPLE / "wiki" / "sample-pages-articles.xml.bz2").read_bytes())
    body = xml[: xml.rindex(b"</mediawiki>")]
    path = tmp_path / name
    path.write_bytes(bz2.compress(body, 9) + second)
    whole = tmp_path / "whole.xml.bz2"
    whole.write_bytes(bz2.compress(xml, 9))
    return path, len(_docs(whole)[0])


def test_truncated_second_stream_keeps_every_page_of_the_first(tmp_path):
    """The error of a cut stream used to be raised inside a buffered read, dropping the bytes that read had
    gathered: the last ~11 KB of the intact first stream (139 of 150 pages kept)."""
    page = b"<page><title>Extra %d</title><ns>0</ns><revision><text>Words of page %d.</text></revision></page>\n"
    extra = b"".join(page % (i, i) for i in range(2000)) + b"</mediawiki>\n"
    two = bz2.compress(extra, 1)
    path, expect = _two_stream_dump(tmp_path, two[:300], "cut2.xml.bz2")  # cut inside its first block
    docs, log = _docs(path)
    assert expect > 100
    assert [d.where for d in docs[:expect]] == [d.where for d in _docs(tmp_path / "whole.xml.bz2")[0]]
    assert log.counts == {"truncated_file": 1}


def test_bytes_after_the_last_stream_are_reported(tmp_path):
    """Garbage after the last bz2 stream was skipped without a word (bz2.open's behaviour), so --strict passed it;
    it is reported now (every page kept)."""
    path, expect = _two_stream_dump(tmp_path, bz2.compress(b"</mediawiki>\n") + b"\0\0 not bz2 at all", "tail.xml.bz2")
    docs, log = _docs(path)
    assert len(docs) == expect and log.counts == {"trailing_data": 1}
    assert "after the last bz2 stream" in log.examples["trailing_data"][0]["detail"]


# -- the registry (issue 55): one test case per registered format ---------------------------------------------------
def _write_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["Alpha beta.", "Gamma delta."]}), path)


FORMAT_CASES = {
    # format: (write a file of two documents without a telling name, the texts read back)
    "mediawiki": (
        lambda p: p.write_bytes(
            bz2.compress(
                b"<mediawiki><page><title>A</title><ns>0</ns><revision><text>Alpha beta.</text></revision></page>"
                b"<page><title>G</title><ns>0</ns><revision><text>Gamma delta.</text></revision></page></mediawiki>"
            )
        ),
        ["Alpha beta.", "Gamma delta."],
    ),
    "wikiextractor": (
        lambda p: p.write_text(
            '<doc id="1" title="A">\nA\nAlpha beta.\n</doc>\n<doc id="2" title="G">\nGamma delta.\n</doc>\n'
        ),
        ["Alpha beta.\n", "Gamma delta.\n"],
    ),
    "jsonl": (
        lambda p: p.write_text('\ufeff{"text": "Alpha beta."}\n{"text": "Gamma delta."}\n'),
        ["Alpha beta.", "Gamma delta."],
    ),
    "text": (lambda p: p.write_text("Alpha beta.\n\nGamma delta.\n"), ["Alpha beta.\nGamma delta."]),
    "parquet": (_write_parquet, ["Alpha beta.", "Gamma delta."]),
}


def test_every_registered_format_has_a_test_case():
    from data_pipeline.readers import READERS, formats

    assert set(FORMAT_CASES) == set(READERS), "add a FORMAT_CASES entry for each registered reader"
    assert formats() == ("auto", *READERS)


@pytest.mark.parametrize("fmt", sorted(FORMAT_CASES))
def test_each_format_is_detected_and_read(tmp_path, fmt):
    write, texts = FORMAT_CASES[fmt]
    path = tmp_path / "input.data"
    write(path)
    assert detect_format(str(path)) == fmt
    for how in ("auto", fmt):
        docs, log = _docs(path, how)
        got = [d.texts["text"] for d in docs]
        if fmt == "mediawiki":  # raw wikitext: the workers make it text
            got = [t.strip() for t in got]
        assert got == texts and log.total == 0, (how, got, log.format())


def test_a_registered_reader_is_detected_listed_and_offered_by_preprocess(tmp_path):
    """The worked example of docs/architecture.md: one registered function adds a format."""
    from data_pipeline import readers

    saved = dict(readers.READERS)
    try:
        _register_and_use_tsv(tmp_path)
    finally:
        readers.READERS.clear()
        readers.READERS.update(saved)


def _register_and_use_tsv(tmp_path):
    from data_pipeline import readers
    from data_pipeline.preprocess import PreprocessConfig, build_parser
    from data_pipeline.readers import KIND_LINES, RawDoc

    def read_tsv(path, keys, log):
        """Tab-separated id and text, one document a line."""
        for n, line in enumerate(Path(path).read_text().splitlines(), 1):
            _, _, text = line.partition("\t")
            yield RawDoc({keys[0]: text}, KIND_LINES, f"line {n}")

    readers.register_reader("tsv", read_tsv, sniff=lambda s: s.startswith(b"#tsv"))
    p = tmp_path / "x"
    p.write_text("#tsv\t\n1\tAlpha beta.\n")
    assert detect_format(str(p)) == "tsv"
    assert [d.texts["text"] for d in _docs(p)[0]] == ["", "Alpha beta."]
    assert "tsv" in readers.formats()
    action = next(a for a in build_parser()._actions if a.dest == "input_format")
    assert "tsv" in action.choices
    with pytest.raises(ValueError, match="several keys need jsonl or parquet"):
        PreprocessConfig(
            input=["x"],
            output_prefix="o",
            tokenizer_type="BertWordPieceLowerCase",
            vocab_file="v",
            input_format="tsv",
            json_keys=["a", "b"],
        )


def test_register_reader_refuses_a_duplicate_a_second_fallback_and_no_docstring():
    from data_pipeline import readers

    with pytest.raises(ValueError, match="twice"):
        readers.register_reader("jsonl", readers.read_jsonl, sniff=None)
    with pytest.raises(ValueError, match="only one format can be the fallback"):
        readers.register_reader("plain2", readers.read_text, sniff=None)
    with pytest.raises(TypeError, match="docstring"):
        readers.register_reader("nodoc", lambda p, k, log: iter(()), sniff=lambda s: False)


def test_the_formats_table_of_the_docs_is_generated_from_the_registry():
    from data_pipeline.readers import READERS
    from tools import config_docs

    doc = (Path(__file__).resolve().parents[1] / "docs" / "data_pipeline.md").read_text(encoding="utf-8")
    generated = config_docs.generate("docs/data_pipeline.md")
    assert all(f"| `{name}` |" in generated for name in READERS)
    assert config_docs.splice(doc, generated, "docs/data_pipeline.md") == doc, (
        "docs/data_pipeline.md is stale: run `python -m tools.config_docs --write docs/data_pipeline.md`"
    )
