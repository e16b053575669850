"""One streaming reader per input format, plus input expansion, format detection and the bad-input log.

Readers run in the parent process and do only cheap work (decompress, split records, validate UTF-8);
turning wikitext into text, sentence splitting and tokenising happen in the workers. Each reader yields
``RawDoc`` records and never raises on bad data: problems go to a ``BadInputLog`` with file and
line/offset, and the reader carries on (or stops cleanly at a truncated stream).
"""

from __future__ import annotations

import bz2
import glob
import gzip
import html
import io
import json
import os
import queue
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from data_pipeline import multistream
from data_pipeline.text import trim_gutenberg, unwrap_paragraphs

#: kind of RawDoc payload: "lines" = paragraphs are lines; "wikitext" = raw MediaWiki markup
KIND_LINES = "lines"
KIND_WIKITEXT = "wikitext"


@dataclass
class RawDoc:
    """One document as read: ``texts`` maps each output key (json key) to its raw text."""

    texts: dict[str, str]
    kind: str
    where: str  # "line 12", "page 'Albedo' (line 4031)", "row 7", "whole file"


class BadInputLog:
    """Bad input counted by category, with the first few examples (file, where, detail)."""

    MAX_EXAMPLES = 5

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.examples: dict[str, list[dict]] = {}

    def add(self, category: str, file: str, where: str, detail: str = "") -> None:
        self.counts[category] = self.counts.get(category, 0) + 1
        ex = self.examples.setdefault(category, [])
        if len(ex) < self.MAX_EXAMPLES:
            ex.append({"file": str(file), "where": where, "detail": detail[:200]})

    def merge(self, other: "BadInputLog | dict") -> None:
        d = other.to_dict() if isinstance(other, BadInputLog) else other
        for cat, info in d.items():
            self.counts[cat] = self.counts.get(cat, 0) + info["count"]
            ex = self.examples.setdefault(cat, [])
            ex.extend(info["examples"][: self.MAX_EXAMPLES - len(ex)])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict:
        return {cat: {"count": self.counts[cat], "examples": self.examples.get(cat, [])} for cat in sorted(self.counts)}

    @classmethod
    def from_dict(cls, d: dict) -> "BadInputLog":
        log = cls()
        log.merge(d)
        return log

    def format(self) -> str:
        if not self.counts:
            return "bad input: none"
        lines = [f"bad input: {self.total} problem(s)"]
        for cat, info in self.to_dict().items():
            lines.append(f"  {cat}: {info['count']}")
            for ex in info["examples"]:
                detail = f" ({ex['detail']})" if ex["detail"] else ""
                lines.append(f"    {ex['file']}: {ex['where']}{detail}")
        return "\n".join(lines)


# -- input expansion ------------------------------------------------------------------------------
def expand_inputs(specs: Sequence[str], log: BadInputLog) -> list[str]:
    """Files, directories (recursive) and globs -> a deterministic, de-duplicated file list.

    Order: the order of ``specs``; inside a directory or glob, sorted paths. Hidden files and our own
    outputs (``.bin``/``.idx``/``.json`` next to them) inside directories are skipped.
    """
    out: list[str] = []
    seen: set[str] = set()

    def push(p: str) -> None:
        rp = os.path.abspath(p)
        if rp not in seen:
            seen.add(rp)
            out.append(rp)

    for spec in specs:
        if os.path.isdir(spec):
            found = []
            for root, dirs, files in os.walk(spec):
                # skip hidden entries and our own outputs (shards, reports, a run's .parts/ bookkeeping)
                dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not d.endswith(".parts"))
                for f in files:
                    if not f.startswith(".") and not f.endswith(
                        (".bin", ".idx", ".progress.json", ".report.json", ".done.json", ".tmp")
                    ):
                        found.append(os.path.join(root, f))
            if not found:
                log.add("missing_input", spec, "directory", "directory holds no input files")
            for f in sorted(found):
                push(f)
        elif os.path.isfile(spec):
            push(spec)
        elif glob.has_magic(spec):
            matches = sorted(m for m in glob.glob(spec, recursive=True) if os.path.isfile(m))
            if not matches:
                log.add("missing_input", spec, "glob", "pattern matches no file")
            for m in matches:
                push(m)
        else:
            log.add("missing_input", spec, "path", "no such file or directory")
    return out


# -- opening and detection -----------------------------------------------------------------------
class _ThreadedBz2Reader(io.RawIOBase):
    """A .bz2 file decompressed by a background thread, a few blocks ahead of the reader.

    ``bz2`` releases the GIL while it decompresses, so the thread runs beside the XML parsing and the in-process
    worker of ``--workers 1`` instead of before them (decompression is ~20% of reading a dump). Multi-stream files
    (pbzip2, ``pages-articles-multistream``) are read through; a stream cut short raises ``EOFError`` and bad data
    ``OSError``, as ``bz2.open`` does, at the point the reader gets to, but only on the read *after* the one that
    returned the last good bytes: raised inside a buffered read, it would drop the bytes that read had gathered (the
    last ~11 KB of the intact first stream, and its pages). Bytes after the last stream that are no bz2 stream are
    skipped as by ``bz2.open``, and said in ``trailing`` for the bad-input report."""

    BLOCK = 1 << 18
    AHEAD = 8

    def __init__(self, path: str) -> None:
        super().__init__()
        self._raw = open(path, "rb")
        self._queue: queue.Queue = queue.Queue(self.AHEAD)
        self._buf = b""
        self._done = False
        self._error: BaseException | None = None  # raised by the next readinto (see the class docstring)
        self.trailing: str | None = None  # set when bytes after the last stream were skipped
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name=f"bz2 {os.path.basename(path)}", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self) -> None:
        try:
            dec = bz2.BZ2Decompressor()
            in_stream = False  # a stream has begun and not ended
            offset = 0
            while not self._stop.is_set():
                data = self._raw.read(self.BLOCK)
                offset += len(data)
                if not data:
                    if in_stream:
                        raise EOFError("Compressed file ended before the end-of-stream marker was reached")
                    break
                while data:
                    if dec.eof:  # the next stream of a multi-stream file
                        dec = bz2.BZ2Decompressor()
                        try:
                            out = dec.decompress(data)
                        except OSError:  # trailing bytes that are no stream: skipped, as bz2.open does
                            at = offset - len(data)
                            size = os.path.getsize(self._raw.name) - at
                            self.trailing = (
                                f"{size:,} byte(s) at offset {at:,} after the last bz2 stream are no bz2 data"
                            )
                            self._put(None)
                            return
                    else:
                        out = dec.decompress(data)
                    in_stream = not dec.eof
                    data = dec.unused_data if dec.eof else b""
                    if out and not self._put(out):
                        return
            self._put(None)
        except Exception as e:  # handed to the reader, raised where it reads
            self._put(e)

    def readable(self) -> bool:
        return True

    @property
    def pending_error(self) -> BaseException | None:
        """The decompression error the next read will raise (the bytes before it were all delivered)."""
        return self._error

    def readinto(self, b) -> int:
        if self._error is not None:
            err, self._error = self._error, None
            raise err
        while not self._buf and not self._done:
            item = self._queue.get()
            if item is None:
                self._done = True
            elif isinstance(item, Exception):
                self._done = True
                self._error = item  # end of the good bytes now; the error on the next read
                return 0
            else:
                self._buf = item
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            self._stop.set()
            self._thread.join()
            self._raw.close()
        super().close()


def open_binary(path: str, prefetch: bool = False):
    """Open plain, .bz2 or .gz files as a binary stream (detected from magic bytes, not the name).
    ``prefetch``: a .bz2 file is decompressed ahead by a thread (``_ThreadedBz2Reader``)."""
    with open(path, "rb") as f:
        magic = f.read(3)
    if magic == b"BZh":
        if prefetch:
            return io.BufferedReader(_ThreadedBz2Reader(path), buffer_size=1 << 16)
        return bz2.open(path, "rb")
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return open(path, "rb")


def detect_format(path: str) -> str:
    """Guess the format from the first bytes of the (decompressed) content: the first registered reader whose
    ``sniff`` accepts them, else the fallback reader; a file whose content cannot be read, by its name."""
    head = b""
    try:
        with open_binary(path) as f:
            while len(head) < 4096:  # small reads: a truncated stream still yields its first bytes
                block = f.read(512)
                if not block:
                    break
                head += block
    except (OSError, EOFError):
        pass
    if not head:  # unreadable (e.g. a truncated one-block .bz2): fall back to the file name
        name = os.path.basename(path).lower()
        for reader in READERS.values():
            if any(marker in name for marker in reader.suffixes):
                return reader.name
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    for reader in READERS.values():
        if reader.sniff is not None and reader.sniff(start):
            return reader.name
    return next(r.name for r in READERS.values() if r.sniff is None)


def _decode(raw: bytes, path: str, where: str, log: BadInputLog) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        log.add("invalid_utf8", path, where, f"byte {e.start}: {raw[e.start : e.start + 4]!r}; replaced with U+FFFD")
        return raw.decode("utf-8", errors="replace")


def _lines(path: str, log: BadInputLog) -> Iterator[tuple[int, str]]:
    """(line number, decoded line) pairs; a truncated compressed stream ends the file with a report."""
    f = open_binary(path)
    lineno = 0
    try:
        for lineno, raw in enumerate(f, start=1):
            yield lineno, _decode(raw, path, f"line {lineno}", log)
    except (EOFError, OSError) as e:
        log.add("truncated_file", path, f"after line {lineno}", f"{type(e).__name__}: {e}; kept what was read")
    finally:
        f.close()


# -- readers --------------------------------------------------------------------------------------
def read_jsonl(path: str, keys: Sequence[str], log: BadInputLog) -> Iterator[RawDoc]:
    """One JSON object per line (Megatron's input), each --json-keys key a text (a list of strings: lines); bad
    lines and missing keys reported by line. A leading BOM (what detection skips) is skipped."""
    for lineno, line in _lines(path, log):
        if lineno == 1:
            line = line.removeprefix("\ufeff")
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            log.add("malformed_json", path, f"line {lineno}", str(e))
            continue
        if not isinstance(obj, dict):
            log.add("malformed_json", path, f"line {lineno}", f"expected an object, got {type(obj).__name__}")
            continue
        texts = {}
        for k in keys:
            v = obj.get(k)
            if v is None:
                log.add("missing_key", path, f"line {lineno}", f"no key {k!r} (keys: {sorted(obj)[:8]})")
                continue
            if isinstance(v, list):  # Megatron accepts pre-split sentences
                v = "\n".join(str(x) for x in v)
            elif not isinstance(v, str):
                log.add("malformed_json", path, f"line {lineno}", f"key {k!r} is {type(v).__name__}, not text")
                continue
            texts[k] = v
        if texts:
            yield RawDoc(texts, KIND_LINES, f"line {lineno}")


def read_wikiextractor(path: str, keys: Sequence[str], log: BadInputLog) -> Iterator[RawDoc]:
    """WikiExtractor ``<doc id= url= title=>`` ... ``</doc>``; the title line repeated as the first body
    line is dropped (a title-only document is then empty and reported as such)."""
    key = keys[0]
    body: list[str] | None = None
    title = ""
    start = 0
    for lineno, line in _lines(path, log):
        s = line.strip()
        if body is None:
            if s.startswith("<doc") and s.endswith(">"):
                body, start = [], lineno
                t = s.find('title="')
                title = s[t + 7 : s.find('"', t + 7)] if t >= 0 else ""
                title = html.unescape(title)
            elif s:
                log.add("malformed_doc", path, f"line {lineno}", "text outside <doc>...</doc>")
            continue
        if s == "</doc>":
            if body and body[0].strip() == title.strip():
                body = body[1:]
            yield RawDoc({key: "".join(body)}, KIND_LINES, f"doc {title!r} (line {start})")
            body = None
        else:
            body.append(line)
    if body is not None:
        log.add("truncated_file", path, f"line {start}", f"<doc title={title!r}> has no </doc>; dropped")


def read_text(path: str, keys: Sequence[str], log: BadInputLog) -> Iterator[RawDoc]:
    """One book per file (BookCorpus / Project Gutenberg): header and licence trimmed, hard-wrapped
    lines joined into paragraphs, one document per file."""
    parts = [line for _, line in _lines(path, log)]
    text, _ = trim_gutenberg("".join(parts))
    yield RawDoc({keys[0]: "\n".join(unwrap_paragraphs(text))}, KIND_LINES, "whole file")


def _pages(events: Iterator[tuple[str, ET.Element]], key: str, counter: list[int]) -> Iterator[RawDoc]:
    """Article pages of a MediaWiki XML event stream (namespace 0, redirects skipped); ``counter[0]`` counts pages."""
    root = None
    for event, elem in events:
        if root is None:
            root = elem
        if event != "end" or not elem.tag.endswith("page"):
            continue
        counter[0] += 1
        ns_tag = title = text = None
        redirect = False
        for child in elem:
            tag = child.tag.rsplit("}", 1)[-1]
            if tag == "ns":
                ns_tag = (child.text or "").strip()
            elif tag == "title":
                title = child.text or ""
            elif tag == "redirect":
                redirect = True
            elif tag == "revision":
                for rc in child:
                    if rc.tag.rsplit("}", 1)[-1] == "text":
                        text = rc.text or ""
        elem.clear()
        root.clear()  # keep memory flat: drop finished pages from the tree
        if ns_tag not in (None, "0") or redirect:
            continue
        if text is None:
            text = ""
        if text.lstrip()[:9].upper() == "#REDIRECT":
            continue
        yield RawDoc({key: text}, KIND_WIKITEXT, f"page {title!r} (#{counter[0]})")


def read_mediawiki(path: str, keys: Sequence[str], log: BadInputLog) -> Iterator[RawDoc]:
    """MediaWiki ``pages-articles`` XML, streamed with iterparse: namespace 0 only, redirects skipped. A unit of a
    multistream dump (``DUMP#streams=START-END``, data_pipeline/multistream.py) reads only its own streams."""
    if multistream.parse_unit(path) is not None:
        yield from _read_mediawiki_unit(path, keys[0], log)
        return
    f = open_binary(path, prefetch=True)
    counter = [0]
    try:
        yield from _pages(ET.iterparse(f, events=("start", "end")), keys[0], counter)
    except ET.ParseError as e:
        cut = getattr(getattr(f, "raw", None), "pending_error", None)  # the XML ended where the bz2 data did
        if cut is not None:
            log.add(
                "truncated_file",
                path,
                f"after page {counter[0]}",
                f"{type(cut).__name__}: {cut}; kept pages read so far",
            )
        else:
            log.add("malformed_xml", path, f"after page {counter[0]}", f"{e}; kept pages read so far")
    except (EOFError, OSError) as e:
        log.add("truncated_file", path, f"after page {counter[0]}", f"{type(e).__name__}: {e}; kept pages read so far")
    finally:
        trailing = getattr(getattr(f, "raw", None), "trailing", None)
        f.close()
    if trailing:
        log.add("trailing_data", path, f"after page {counter[0]}", f"{trailing}; kept every page before them")


def _unit_events(path: str, start: int, end: int) -> Iterator[tuple[str, ET.Element]]:
    """XML events of the ``<page>`` streams in a byte range, parsed under a synthetic root: the dump's own
    ``</mediawiki>`` (the last stream) is dropped, as is a header stream, should a range hold one."""
    parser = ET.XMLPullParser(events=("start", "end"))
    parser.feed(b"<mediawiki>")
    yield from parser.read_events()
    for data in multistream.read_streams(path, start, end):
        body = data.strip()
        if body.startswith(b"<mediawiki"):  # the header stream: <mediawiki ...><siteinfo>...</siteinfo>
            cut = body.find(b"</siteinfo>")
            body = body[cut + len(b"</siteinfo>") :] if cut >= 0 else b""
        if body.endswith(b"</mediawiki>"):
            body = body[: -len(b"</mediawiki>")]
        parser.feed(body)
        yield from parser.read_events()
    parser.feed(b"</mediawiki>")
    yield from parser.read_events()
    parser.close()


def _read_mediawiki_unit(spec: str, key: str, log: BadInputLog) -> Iterator[RawDoc]:
    path, start, end = multistream.parse_unit(spec)
    counter = [0]
    try:
        yield from _pages(_unit_events(path, start, end), key, counter)
    except ET.ParseError as e:
        log.add("malformed_xml", spec, f"after page {counter[0]}", f"{e}; kept pages read so far")
    except (EOFError, OSError) as e:
        log.add("truncated_file", spec, f"after page {counter[0]}", f"{type(e).__name__}: {e}; kept pages read so far")


def read_parquet(path: str, keys: Sequence[str], log: BadInputLog) -> Iterator[RawDoc]:
    """Parquet with a text column (Hugging Face ``datasets`` exports), streamed by record batch."""
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        log.add("malformed_parquet", path, "footer", str(e))
        return
    names = pf.schema_arrow.names
    missing = [k for k in keys if k not in names]
    if missing:
        log.add("missing_key", path, "schema", f"no column(s) {missing}; columns: {names[:10]}")
        return
    row = 0
    for batch in pf.iter_batches(batch_size=1024, columns=list(keys)):
        cols = [batch.column(k).to_pylist() for k in keys]
        for vals in zip(*cols):
            row += 1
            texts = {k: v for k, v in zip(keys, vals) if isinstance(v, str)}
            if len(texts) < len(keys):
                log.add("missing_key", path, f"row {row}", "null or non-text value")
            if texts:
                yield RawDoc(texts, KIND_LINES, f"row {row}")


ReadFn = Callable[[str, Sequence[str], BadInputLog], Iterator[RawDoc]]
"""A reader: (path, output keys, bad-input log) -> documents; bad data goes to the log, never raised."""


@dataclass(frozen=True)
class Reader:
    """A registered input format (:func:`register_reader`)."""

    name: str
    """--input-format's value."""
    read: ReadFn
    """Streams the documents of one file."""
    sniff: Callable[[bytes], bool] | None
    """Whether the first 4 KB of the (decompressed) content, leading BOM and white space stripped, are this format;
    None for the fallback format (plain text): what nothing else claims."""
    suffixes: tuple[str, ...]
    """File-name markers (``.xml``) that name the format when the content cannot be read (a truncated ``.bz2``)."""
    several_keys: bool
    """Reads several --json-keys (one output shard each); the other formats have one text per document."""

    @property
    def doc(self) -> str:
        """The reader's docstring, first paragraph on one line (the docs table)."""
        return " ".join((self.read.__doc__ or "").strip().split("\n\n")[0].split())


READERS: dict[str, Reader] = {}
"""--input-format name -> Reader, in detection order (the flag's choices, the docs table and the tests' parameters
come from here)."""


def register_reader(
    name: str,
    read: ReadFn,
    *,
    sniff: Callable[[bytes], bool] | None,
    suffixes: Sequence[str] = (),
    several_keys: bool = False,
) -> Reader:
    """Add an input format: its reader function (with a docstring: its line in docs/data_pipeline.md), how to
    recognise its content (``sniff``; None for the one fallback) and, optionally, its file names."""
    if name in READERS or name == "auto":
        raise ValueError(f"input format {name!r} is registered twice (or is 'auto', the detection)")
    if not (read.__doc__ or "").strip():
        raise TypeError(f"reader {name!r} needs a docstring (its line in docs/data_pipeline.md)")
    if sniff is None and any(r.sniff is None for r in READERS.values()):
        raise ValueError(f"reader {name!r}: only one format can be the fallback (sniff=None)")
    READERS[name] = Reader(name, read, sniff, tuple(suffixes), several_keys)
    return READERS[name]


register_reader(
    "mediawiki",
    read_mediawiki,
    sniff=lambda s: s.startswith(b"<mediawiki") or (s.startswith(b"<?xml") and b"<mediawiki" in s),
    suffixes=(".xml",),
)
register_reader("wikiextractor", read_wikiextractor, sniff=lambda s: s.startswith((b"<doc ", b"<doc>")))
register_reader(
    "jsonl", read_jsonl, sniff=lambda s: s.startswith(b"{"), suffixes=(".jsonl", ".json"), several_keys=True
)
register_reader("text", read_text, sniff=None)
register_reader(
    "parquet", read_parquet, sniff=lambda s: s.startswith(b"PAR1"), suffixes=(".parquet",), several_keys=True
)


def formats() -> tuple[str, ...]:
    """--input-format's choices: 'auto' (detect per file) and every registered format."""
    return ("auto", *READERS)


FORMATS = formats()
"""The formats registered in this module (:func:`formats` also has ones registered later)."""


def read_documents(path: str, fmt: str, keys: Sequence[str], log: BadInputLog) -> Iterator[RawDoc]:
    """Documents of one file in the given (or detected) format; unreadable files are reported."""
    try:
        if fmt == "auto":
            fmt = "mediawiki" if multistream.parse_unit(path) else detect_format(path)
        yield from READERS[fmt].read(path, keys, log)
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
        log.add("missing_input", path, "open", str(e))
