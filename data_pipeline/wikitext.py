"""Wikitext -> plain text with mwparserfromhell (a real parser; regexes only for left-over entities).

What goes: templates/infoboxes, tables, references, comments, file/image/category/interwiki links,
galleries, math and code blocks. What stays: prose, link labels, list items, headings (as their own
line, like WikiExtractor does). Runs inside the workers: it is the expensive part of reading a dump.
"""

from __future__ import annotations

import html
import re

from mwparserfromhell.nodes import Comment, ExternalLink, Heading, Tag, Template, Text, Wikilink
from mwparserfromhell.parser import CTokenizer
from mwparserfromhell.parser import tokens as T
from mwparserfromhell.parser.builder import Builder
from mwparserfromhell.parser.tokenizer import Tokenizer

_DROP_TAGS = {
    "ref",
    "references",
    "table",
    "gallery",
    "math",
    "timeline",
    "imagemap",
    "syntaxhighlight",
    "source",
    "score",
    "graph",
    "templatedata",
    "noinclude",
    "code",
    "pre",
    "chem",
}
_DROP_LINK_PREFIXES = ("file:", "image:", "category:", "media:", "wikt:", "wiktionary:", ":category:")
_INTERWIKI = re.compile(r"^[a-z]{2,3}(-[a-z]+)?:")
_MULTISPACE = re.compile(r"[ \t]+")
_EMPTY_PARENS = re.compile(r"\(\s*[,;]?\s*\)")


def wikitext_to_text(wikitext: str) -> str:
    """Plain text of one article; paragraphs (and headings, list items) on their own lines."""
    try:
        tokens = (CTokenizer or Tokenizer)().tokenize(wikitext, 0, False)
        code = Builder().build(_drop_regions(tokens))
    except Exception:  # the parser is robust, but never let one page stop a dump
        return ""
    _prune(code)
    return finish_text(code.strip_code(normalize=True, collapse=False, keep_template_params=False))


def finish_text(text: str) -> str:
    """Entities decoded, spaces folded, empty parentheses and list markers and table rows dropped, one line each."""
    text = html.unescape(text)
    lines = []
    for line in text.split("\n"):
        line = _EMPTY_PARENS.sub("", _MULTISPACE.sub(" ", line)).strip()
        line = line.lstrip("*#:;").strip()
        if line and not line.startswith(("{|", "|", "!")):
            lines.append(line)
    return "\n".join(lines)


def _drop_regions(tokens: list) -> list:
    """The parser's token stream without the templates, comments and dropped tags (tables too): those regions are
    never built into nodes, only skipped. Building the node tree was ~85% of the time after the tokenizer; most of
    a page's nodes sit in infobox templates, references and tables that go anyway. ``_prune`` still runs on the
    tree (links, headings, and anything this pass leaves)."""
    out = []
    i, n = 0, len(tokens)
    while i < n:
        tok = tokens[i]
        if isinstance(tok, T.TemplateOpen):
            i = _skip(tokens, i, T.TemplateOpen, (T.TemplateClose,))
        elif isinstance(tok, T.CommentStart):
            i = _skip(tokens, i, T.CommentStart, (T.CommentEnd,))
        elif isinstance(tok, T.TagOpenOpen) and _dropped_tag(tokens, i):
            i = _skip(tokens, i, T.TagOpenOpen, (T.TagCloseClose, T.TagCloseSelfclose))
        else:
            out.append(tok)
            i += 1
    return out


def _dropped_tag(tokens: list, i: int) -> bool:
    if getattr(tokens[i], "wiki_markup", None) == "{|":
        return True
    name = tokens[i + 1] if i + 1 < len(tokens) else None
    return isinstance(name, T.Text) and name.text.strip().lower() in _DROP_TAGS


def _skip(tokens: list, i: int, opener: type, closers: tuple[type, ...]) -> int:
    """Index after the token that closes the region opened at ``i`` (nested regions of the same kind counted)."""
    depth = 0
    for j in range(i, len(tokens)):
        if isinstance(tokens[j], opener):
            depth += 1
        elif isinstance(tokens[j], closers):
            depth -= 1
            if depth == 0:
                return j + 1
    return len(tokens)


def _prune(code) -> None:
    """Drop what goes and flatten headings, in one pass over each node list: the kept nodes are collected and set
    at once. (Removing nodes one by one with ``Wikicode.remove`` searched the tree again for every node, quadratic
    in the nodes of a page: 75% of the reader's time on real dumps.)"""
    kept = []
    for node in code.nodes:
        if isinstance(node, (Template, Comment)):
            continue
        if isinstance(node, Tag):
            tag = str(node.tag).strip().lower()
            if tag in _DROP_TAGS or node.wiki_markup == "{|":
                continue
            if node.contents is not None:
                _prune(node.contents)
        elif isinstance(node, Wikilink):
            title = str(node.title).strip().lower()
            if title.startswith(_DROP_LINK_PREFIXES) or (_INTERWIKI.match(title) and not node.text):
                continue
            if node.text is not None:
                _prune(node.text)
        elif isinstance(node, ExternalLink):
            if node.title is None:
                continue
        elif isinstance(node, Heading):  # "== History ==" -> "History" on its own line
            title = node.title.strip_code().strip()
            if title:
                kept.append(Text(title + "\n"))
            continue
        kept.append(node)
    code.nodes = kept
