"""Wikitext -> plain text with mwparserfromhell (a real parser; regexes only for left-over entities).

What goes: templates/infoboxes, tables, references, comments, file/image/category/interwiki links,
galleries, math and code blocks. What stays: prose, link labels, list items, headings (as their own
line, like WikiExtractor does). Runs inside the workers: it is the expensive part of reading a dump.
"""

from __future__ import annotations

import html
import re

import mwparserfromhell
from mwparserfromhell.nodes import Comment, ExternalLink, Heading, Tag, Template, Wikilink

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
        code = mwparserfromhell.parse(wikitext)
    except Exception:  # the parser is robust, but never let one page stop a dump
        return ""
    _prune(code)
    text = code.strip_code(normalize=True, collapse=False, keep_template_params=False)
    text = html.unescape(text)
    lines = []
    for line in text.split("\n"):
        line = _EMPTY_PARENS.sub("", _MULTISPACE.sub(" ", line)).strip()
        line = line.lstrip("*#:;").strip()
        if line and not line.startswith(("{|", "|", "!")):
            lines.append(line)
    return "\n".join(lines)


def _prune(code) -> None:
    for node in list(code.nodes):
        if isinstance(node, (Template, Comment)):
            _remove(code, node)
        elif isinstance(node, Tag):
            tag = str(node.tag).strip().lower()
            if tag in _DROP_TAGS or tag == "table" or node.wiki_markup == "{|":
                _remove(code, node)
            elif node.contents is not None:
                _prune(node.contents)
        elif isinstance(node, Wikilink):
            title = str(node.title).strip().lower()
            if title.startswith(_DROP_LINK_PREFIXES) or (_INTERWIKI.match(title) and not node.text):
                _remove(code, node)
            elif node.text is not None:
                _prune(node.text)
        elif isinstance(node, ExternalLink):
            if node.title is None:
                _remove(code, node)
        elif isinstance(node, Heading):
            # "== History ==" -> "History" on its own line
            title = node.title.strip_code().strip()
            try:
                code.replace(node, title + "\n" if title else "")
            except ValueError:
                pass


def _remove(code, node) -> None:
    try:
        code.remove(node)
    except ValueError:
        pass
