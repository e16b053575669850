"""Test helper: a Wikimedia-style multistream dump and its index, built from a plain pages-articles dump.

Streams as Wikimedia writes them: the header (``<mediawiki>`` + ``<siteinfo>``) alone, then ``per_stream`` pages per
stream, then ``</mediawiki>`` alone; the index has an ``offset:page_id:title`` line per page.
"""

from __future__ import annotations

import bz2
import re
from pathlib import Path


def build(src: Path, out_dir: Path, per_stream: int = 10, name: str = "enwiki-test") -> Path:
    data = bz2.open(src, "rb").read()
    first, end = data.index(b"  <page>"), data.rindex(b"</mediawiki>")
    pages = re.findall(rb"  <page>.*?</page>\n", data[first:end], flags=re.S)
    assert b"".join(pages) == data[first:end], "the pages do not tile the dump's body"
    groups = [pages[i : i + per_stream] for i in range(0, len(pages), per_stream)]
    out_dir.mkdir(parents=True, exist_ok=True)
    dump = out_dir / f"{name}-pages-articles-multistream.xml.bz2"
    index = []
    with open(dump, "wb") as f:
        f.write(bz2.compress(data[:first]))
        for group in groups:
            off = f.tell()
            for pg in group:
                pid = re.search(rb"<id>(\d+)</id>", pg).group(1).decode()
                title = re.search(rb"<title>(.*?)</title>", pg).group(1).decode()
                index.append(f"{off}:{pid}:{title}\n")
            f.write(bz2.compress(b"".join(group)))
        f.write(bz2.compress(data[end:]))
    (out_dir / f"{name}-pages-articles-multistream-index.txt.bz2").write_bytes(bz2.compress("".join(index).encode()))
    return dump
