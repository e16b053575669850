"""The fast wikitext reader (text rendered straight from mwparserfromhell's token stream, regions that go skipped
there, no node tree; the tree path for the shapes it leaves alone) gives exactly the text of the straightforward
one: the full mwparserfromhell tree, pruned node by node with Wikicode.remove (the slow reference, quadratic in a
page's nodes)."""

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


# one construct (or an awkward mix) per case: the renderer mirrors Builder + _prune + strip_code for each
FAST_CASES = [
    "Plain '''bold''' and ''italic'' text.\n\nSecond paragraph.",
    "A [[link]], a [[target|label with ''style'']], [[File:x.jpg|thumb|a caption]] and [[Category:Things]].",
    "[[fr:Chose]] interwiki dropped, [[de:Ding|kept label]] kept, [[wikt:word]] dropped, [[:Category:C|seen]].",
    "[[fr:Chose|]] empty label, [[fr:Chose|{{tmpl}}]] label only a template.",
    "External [http://example.org titled link], bare [http://example.org], free http://example.org/x text.",
    "== Heading with [[link|label]] and [[File:in heading.png]] ==\nBody.\n=== <span>Tagged</span> ===",
    "Entities: &amp; &nbsp; &#931; &#x3a3; &eacute; &lt;b&gt;",
    "Refs<ref name=a>one {{cite|x=1}}</ref> and<ref name=a /> gone. <references/>",
    "<!-- comment --> {{Infobox|a=[[b]]|c={{d|e}}}} text {{{arg|default [[x|y]]}}} {{{bare}}} end",
    '<div class="x" style="a:b">div [[kept|text]]</div> <span title="[[not|shown]]">span</span> <br/> x',
    "<math>x^2</math> <gallery>a.jpg</gallery> <section begin=s /> <categorytree>C</categorytree> after",
    '{| class="wikitable"\n|-\n| cell || cell\n|}\nAfter the table.',
    "* list item [[a|b]]\n# numbered\n; term : definition\n----\nend",
    "<blockquote>Quoted [http://q.example quote] ''text''</blockquote> <small>small <sup>sup</sup></small>",
    "[[link with [[nested]] inside]] and [[a|b|c]] and [[ unclosed",
    "''unbalanced italic <ref>in a ref</ref> and [[File:f.png|thumb|''cap]] here",
    "{{unclosed template [[link]] text",
    "</div> stray close and <nowiki>[[not a link]]</nowiki> and <pre>code</pre> and <code>c</code>",
    "Parens ( ) and (; ) and ( , ) dropped, (kept) kept;\tspaces   folded.",
]
FALLBACK_CASES = [
    "[[Foo&nbsp;bar|label]] entity in a link title.",
    "[[Category:{{PAGENAME}}]] and [[''styled'' title]].",
]


@pytest.mark.parametrize("case", range(len(FAST_CASES) + len(FALLBACK_CASES)))
def test_renderer_equals_the_reference_construct_by_construct(case, monkeypatch):
    cases = FAST_CASES + FALLBACK_CASES
    text = cases[case]
    used_tree = []
    tree_text = W.tree_text
    monkeypatch.setattr(W, "tree_text", lambda tokens: used_tree.append(1) or tree_text(tokens))
    assert W.wikitext_to_text(text) == _reference(text)
    assert bool(used_tree) == (case >= len(FAST_CASES)), "the renderer (not the tree path) handles the fast cases"


def test_unparsed_references_and_file_links_are_dropped(corpus):
    """On some pages an unbalanced '' makes the tokenizer give up on a <ref> or [[File:]] and emit its markup as
    text (10 lines of the shared dump's 106 articles); that markup is dropped after rendering."""
    assert W.finish_text("a<ref>x</ref> b<REF name=y/> c\n[[File:z.png|thumb|cap\nd") == "a b c\nd"
    dump = corpus / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    page = next(p for p in _pages(dump, 10**6) if "insisting there be no invasion.<ref>" in p)
    assert "invasion.<ref>Allan Nevins" in _plain_strip(page)  # the parser leaves this reference as text
    out = W.wikitext_to_text(page)
    assert "insisting there be no invasion." in out and "<ref" not in out
    assert "invasion. Allan Nevins" not in out and "invasion.Allan Nevins" not in out


def _plain_strip(text: str) -> str:
    return mwparserfromhell.parse(text).strip_code(normalize=True, collapse=False)


def test_fast_reader_equals_the_tree_path_on_every_page(corpus):
    """All pages of the shared dump (the reference above is quadratic, so it sees the first 40 of each dump)."""
    from mwparserfromhell.parser import CTokenizer

    pages = _pages(corpus / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2", 10**6)
    assert len(pages) > 100
    for i, page in enumerate(pages):
        assert W.wikitext_to_text(page) == W.tree_text(CTokenizer().tokenize(page, 0, False)), f"page {i}"
