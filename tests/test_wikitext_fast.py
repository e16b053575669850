"""The fast wikitext reader (regions that go are skipped in the token stream, never built into nodes; one pass
over each node list) gives exactly the text of the straightforward one: the full mwparserfromhell tree, pruned
node by node with Wikicode.remove (the slow reference, quadratic in a page's nodes)."""

from __future__ import annotations

import bz2
import xml.etree.ElementTree as ET
from pathlib import Path

import mwparserfromhell
import pytest

from data_pipeline import wikitext as W

REPO = Path(__file__).resolve().parents[1]
DUMPS = [
    REPO / "run_scripts/sample_data/corpus/wiki/sample-pages-articles.xml.bz2",
    REPO.parent / "shared/corpus/wiki/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    REPO.parent / "shared/corpus/wiki/enwiki-table-markup.xml.bz2",
]


def _reference(wikitext: str) -> str:
    code = mwparserfromhell.parse(wikitext)
    _reference_prune(code)
    text = code.strip_code(normalize=True, collapse=False, keep_template_params=False)
    return W.finish_text(text)


def _reference_prune(code) -> None:
    for node in list(code.nodes):
        drop = isinstance(node, (W.Template, W.Comment))
        if isinstance(node, W.Tag):
            drop = str(node.tag).strip().lower() in W._DROP_TAGS or node.wiki_markup == "{|"
            if not drop and node.contents is not None:
                _reference_prune(node.contents)
        elif isinstance(node, W.Wikilink):
            title = str(node.title).strip().lower()
            drop = title.startswith(W._DROP_LINK_PREFIXES) or bool(W._INTERWIKI.match(title) and not node.text)
            if not drop and node.text is not None:
                _reference_prune(node.text)
        elif isinstance(node, W.ExternalLink):
            drop = node.title is None
        elif isinstance(node, W.Heading):
            title = node.title.strip_code().strip()
            code.replace(node, title + "\n" if title else "")
        if drop:
            code.remove(node)


def _pages(path: Path, limit: int) -> list[str]:
    out = []
    for _, el in ET.iterparse(bz2.open(path)):
        if el.tag.endswith("}text") and el.text:
            out.append(el.text)
            if len(out) == limit:
                break
    return out


@pytest.mark.parametrize("dump", DUMPS, ids=lambda p: p.name[:30])
def test_fast_reader_equals_the_full_tree_reference(dump):
    if not dump.is_file():
        pytest.skip(f"{dump} not present (the shared corpus, see shared/corpus/SOURCES.md)")
    pages = _pages(dump, 40)
    assert pages
    for i, page in enumerate(pages):
        assert W.wikitext_to_text(page) == _reference(page), f"page {i} of {dump.name}"
