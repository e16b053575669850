"""Wikimedia multistream dumps as many units of work: one dump split by its index into ranges of bz2 streams.

A ``pages-articles-multistream.xml.bz2`` dump is a concatenation of independent bz2 streams: the first holds the
``<mediawiki>`` header and ``<siteinfo>``, each following one about 100 ``<page>`` elements, the last the closing
``</mediawiki>``. Its index (``...-multistream-index.txt.bz2``; lines ``offset:page_id:title``) gives the byte offset
of the stream holding each page. A stream decompresses on its own, so a range of streams can be read without the
rest of the file: each range is a unit of work (a part of the run, with its own resume marker), and units spread
over workers, MPI ranks and Slurm tasks like input files do. Parts are merged in unit order, so the shards equal one
process's reading the whole dump.

A unit is named ``DUMP#streams=START-END`` (byte offsets; END is the next unit's START or the file size). A dump
without an index, or a bz2 file that is not multistream, stays one unit: a plain bz2 file is one stream whose
blocks cannot be decoded exactly without decoding the stream from its start, so it cannot be split by bytes.
"""

from __future__ import annotations

import bz2
import os
import re
from typing import Iterator

_UNIT = re.compile(r"^(?P<path>.+)#streams=(?P<start>\d+)-(?P<end>\d+)$")


def index_path(dump: str) -> str | None:
    """The index that Wikimedia publishes beside a multistream dump, if it is there.

    ``X-pages-articles-multistream.xml.bz2`` -> ``X-pages-articles-multistream-index.txt.bz2``; the split files
    ``X-pages-articles-multistream3.xml-p151574p311329.bz2`` ->
    ``X-pages-articles-multistream-index3.txt-p151574p311329.bz2``.
    """
    d, name = os.path.split(dump)
    m = re.match(r"^(?P<stem>.*-multistream)(?P<n>\d*)\.xml(?P<rest>(-p\d+p\d+)?)\.bz2$", name)
    if m is None:
        return None
    index = os.path.join(d, f"{m['stem']}-index{m['n']}.txt{m['rest']}.bz2")
    return index if os.path.isfile(index) else None


def stream_offsets(index: str) -> list[int]:
    """Sorted distinct stream offsets of an index file (``offset:page_id:title`` lines, bz2 or plain)."""
    offsets = set()
    opener = bz2.open if open(index, "rb").read(3) == b"BZh" else open
    with opener(index, "rb") as f:
        for n, line in enumerate(f, 1):
            head = line.split(b":", 1)[0]
            if not head.strip():
                continue
            if not head.isdigit():
                raise ValueError(f"{index}, line {n}: not 'offset:page_id:title': {line[:80]!r}")
            offsets.add(int(head))
    return sorted(offsets)


def split_dump(dump: str, unit_bytes: int) -> list[str]:
    """The units of ``dump``: consecutive streams grouped until each holds at least ``unit_bytes`` of bz2; the whole
    dump (one unit, its own path) without an index or with ``unit_bytes <= 0``."""
    index = index_path(dump)
    if index is None or unit_bytes <= 0:
        return [dump]
    offsets = stream_offsets(index)
    size = os.path.getsize(dump)
    if not offsets or offsets[-1] >= size:
        raise ValueError(f"{index}: its offsets do not fit {dump} ({size:,} bytes): not this dump's index")
    starts = [offsets[0]]
    for off in offsets[1:]:
        if off - starts[-1] >= unit_bytes:
            starts.append(off)
    ends = starts[1:] + [size]
    return [f"{dump}#streams={s}-{e}" for s, e in zip(starts, ends)]


def parse_unit(spec: str) -> tuple[str, int, int] | None:
    """(dump, start, end) of a unit name, None for a plain path."""
    m = _UNIT.match(spec)
    return None if m is None else (m["path"], int(m["start"]), int(m["end"]))


def unit_file(spec: str) -> str:
    """The file a unit (or a plain path) reads."""
    unit = parse_unit(spec)
    return spec if unit is None else unit[0]


def read_streams(path: str, start: int, end: int, block: int = 1 << 20) -> Iterator[bytes]:
    """The decompressed bytes of each bz2 stream in ``[start, end)`` of ``path``, one stream at a time.

    Raises EOFError when the range ends inside a stream (a truncated file or an index of another dump)."""
    with open(path, "rb") as f:
        f.seek(start)
        left = end - start
        dec, out, pending = bz2.BZ2Decompressor(), [], b""
        while True:
            if not pending:
                pending = f.read(min(block, left)) if left > 0 else b""
                left -= len(pending)
                if not pending:
                    break
            out.append(dec.decompress(pending))
            pending = b""
            if dec.eof:
                yield b"".join(out)
                pending, dec, out = dec.unused_data, bz2.BZ2Decompressor(), []
        if out:  # data went into a stream that never ended
            raise EOFError(f"{path}: bytes {start}-{end} end inside a bz2 stream")
