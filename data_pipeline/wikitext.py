"""Wikitext -> plain text with mwparserfromhell (a real parser; regexes only on the rendered text: spaces, empty
parentheses, and the few references / file links the parser leaves as text).

What goes: templates/infoboxes, tables, references, comments, file/image/category/interwiki links,
galleries, math and code blocks. What stays: prose, link labels, list items, headings (as their own
line, like WikiExtractor does). Runs inside the workers: it is the expensive part of reading a dump.
"""

from __future__ import annotations

import gc
import html
import re

from mwparserfromhell.definitions import INVISIBLE_TAGS
from mwparserfromhell.nodes import Comment, ExternalLink, Heading, HTMLEntity, Tag, Template, Text, Wikilink
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
_MULTISPACE = re.compile(r" [ \t]+|\t[ \t]*")  # = [ \t]+ -> " ", without replacing every single space
# What the parser leaves as text when an unbalanced '' or ''' inside breaks the construct around it (the tokenizer
# then gives up on the <ref> or [[File:...]] and emits its markup as text): the reference, or the file link's line.
_UNPARSED_REF = re.compile(r"<ref(?:\s[^<>]*)?/>|<ref(?:\s[^<>]*)?>.*?</ref\s*>", re.IGNORECASE)
_UNPARSED_FILE = re.compile(r"\[\[\s*(?:file|image)\s*:", re.IGNORECASE)
_EMPTY_PARENS = re.compile(r"\([^\S\n]*[,;]?[^\S\n]*\)")  # within a line (finish_text runs it on the whole text)


def wikitext_to_text(wikitext: str) -> str:
    """Plain text of one article; paragraphs (and headings, list items) on their own lines.

    The text is rendered straight from mwparserfromhell's token stream (``_seq``), never built into a node
    tree; a page whose tokens take a shape the renderer leaves alone (a link title or tag name that is more than
    text) goes through the tree instead (``tree_text``), which gives the same text for every page."""
    # The tokens are thousands of small dicts per page that refcounting frees; with the cyclic collector on, their
    # allocation alone set off collections that cost ~15% of this function (none of them finds a cycle here).
    collect = gc.isenabled()
    gc.disable()
    try:
        try:
            tokens = (CTokenizer or Tokenizer)().tokenize(wikitext, 0, False)
        except Exception:  # the parser is robust, but never let one page stop a dump
            return ""
        out: list[str] = []
        try:
            _seq(tokens, list(map(type, tokens)), 0, True, out, _NO_STOP)
        except Exception:  # _Fallback, or a token stream the tree builder would refuse too
            return tree_text(tokens)
    finally:
        if collect:
            gc.enable()
    return finish_text("".join(out))


def tree_text(tokens: list) -> str:
    """The same text through mwparserfromhell's node tree: regions that go skipped in the token stream, the
    tree built from the rest (``Builder``), pruned in one pass and stripped with ``strip_code``."""
    try:
        code = Builder().build(_drop_regions(tokens))
    except Exception:
        return ""
    _prune(code)
    return finish_text(code.strip_code(normalize=True, collapse=False, keep_template_params=False))


def finish_text(text: str) -> str:
    """Entities decoded, spaces folded, empty parentheses and list markers and table rows dropped, one line each."""
    # the two substitutions run over the whole text: neither pattern can match a newline, so they find what they
    # would line by line (one C call instead of two per line)
    text = _EMPTY_PARENS.sub("", _MULTISPACE.sub(" ", html.unescape(text)))
    if "<ref" in text or "<REF" in text or "<Ref" in text:
        text = _UNPARSED_REF.sub("", text)
    lines = []
    for line in text.split("\n"):
        line = line.strip().lstrip("*#:;").strip()
        if line and not line.startswith(("{|", "|", "!")) and not _UNPARSED_FILE.match(line):
            lines.append(line)
    return "\n".join(lines)


def _drop_regions(tokens: list) -> list:
    """The parser's token stream without the templates, comments and dropped tags (tables too): those regions are
    never built into nodes, only skipped. ``_prune`` still runs on the tree (links, headings, and anything this
    pass leaves)."""
    kinds = list(map(type, tokens))
    out = []
    i, n = 0, len(tokens)
    while i < n:
        kind = kinds[i]
        if kind is T.TemplateOpen or kind is T.CommentStart or (kind is T.TagOpenOpen and _dropped_tag(tokens, i)):
            i = _skip(kinds, i)
        else:
            out.append(tokens[i])
            i += 1
    return out


def _dropped_tag(tokens: list, i: int) -> bool:
    if tokens[i].get("wiki_markup") == "{|":
        return True
    name = tokens[i + 1] if i + 1 < len(tokens) else None
    return type(name) is T.Text and name["text"].strip().lower() in _DROP_TAGS


def _skip(kinds: list, i: int) -> int:
    """Index after the token that closes the template, comment or tag opened at ``i`` (nested regions of the same
    kind counted). ``kinds`` holds the tokens' types: the closers are found with ``list.index`` and the openers
    between them counted on slices, at C speed (a loop over every token of an infobox cost 10% of the reader)."""
    opener = kinds[i]
    closer, closer2 = _CLOSERS[opener]
    n = len(kinds)
    depth, j = 1, i + 1
    next2 = -1
    while True:
        try:
            c = kinds.index(closer, j)
        except ValueError:
            c = n
        if closer2 is not None:
            if next2 < j:
                try:
                    next2 = kinds.index(closer2, j)
                except ValueError:
                    next2 = n
            c = min(c, next2)
        if c >= n:
            return n
        depth += kinds[j:c].count(opener) - 1
        if depth == 0:
            return c + 1
        j = c + 1


_CLOSERS = {
    T.TemplateOpen: (T.TemplateClose, None),
    T.CommentStart: (T.CommentEnd, None),
    T.TagOpenOpen: (T.TagCloseClose, T.TagCloseSelfclose),
}


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


# -- rendering straight from the token stream --------------------------------------------------------------------
# The tree path above spends most of its time building nodes (mwparserfromhell's Builder wraps every value in
# ``parse_anything``) only to walk them once with ``_prune`` and ``strip_code``. ``_seq`` walks the tokens
# instead, the way Builder does (each construct consumed by its handler, nested ones by recursion), and writes
# what ``_prune`` + ``strip_code(normalize=True, collapse=False)`` would give for the node. ``prune`` says
# whether ``_prune`` reaches the node list being rendered: it does at the top, in kept tags' contents and in
# kept links' labels, not in heading titles, external-link titles or argument defaults.


class _Fallback(Exception):
    """A token shape the renderer leaves to the tree path (a link title or tag name that is not plain text)."""


_NO_STOP: frozenset = frozenset()
_TAG_PHASE_STOPS = frozenset((T.TagAttrStart, T.TagCloseOpen, T.TagOpenClose, T.TagCloseSelfclose, T.TagCloseClose))
_ATTR_STOPS = frozenset((T.TagAttrStart, T.TagCloseOpen, T.TagCloseSelfclose))
_ATTR_PARTS = _ATTR_STOPS | {T.TagAttrEquals, T.TagAttrQuote}
_LINK_STOPS = frozenset((T.WikilinkSeparator, T.WikilinkClose))
_EXT_STOPS = frozenset((T.ExternalLinkSeparator, T.ExternalLinkClose))
_ARG_STOPS = frozenset((T.ArgumentSeparator, T.ArgumentClose))
_HEADING_STOP = frozenset((T.HeadingEnd,))
_INVISIBLE = frozenset(INVISIBLE_TAGS)
_entities: dict[tuple, str] = {}


def _seq(tokens: list, kinds: list, i: int, prune: bool, out: list, stops: frozenset) -> tuple[int, int]:
    """Render the node list starting at ``tokens[i]`` into ``out``, up to the first token whose type is in
    ``stops`` (not consumed; the end of the tokens when ``stops`` is empty). Returns that index and how many
    nodes other than text the tree would hold there (dropped regions are no nodes: ``_drop_regions`` takes them
    out first), -1 when it would hold no node at all."""
    n = len(tokens)
    nodes = -1
    while i < n:
        kind = kinds[i]
        if kind is T.Text:
            out.append(tokens[i]["text"])
            i += 1
            if nodes < 0:
                nodes = 0
            continue
        elif kind in stops:
            return i, nodes
        elif kind is T.TemplateOpen:
            i = _skip(kinds, i)
            continue
        elif kind is T.CommentStart:
            i = _skip(kinds, i)
            continue
        elif kind is T.TagOpenOpen:
            if _dropped_tag(tokens, i):
                i = _skip(kinds, i)
                continue
            i = _tag(tokens, kinds, i, prune, out)
        elif kind is T.WikilinkOpen:
            i = _wikilink(tokens, kinds, i, prune, out)
        elif kind is T.ExternalLinkOpen:
            i = _external_link(tokens, kinds, i, prune, out)
        elif kind is T.HeadingStart:
            i = _heading(tokens, kinds, i, prune, out)
        elif kind is T.HTMLEntityStart:
            i = _entity(tokens, kinds, i, out)
        elif kind is T.ArgumentOpen:
            i = _argument(tokens, kinds, i, out)
        else:  # the tree builder raises here too
            raise ValueError(f"unexpected {kind.__name__}")
        nodes = 1 if nodes < 0 else nodes + 1
    if stops:
        raise ValueError("missed a close token")
    return i, nodes


def _tag(tokens: list, kinds: list, i: int, prune: bool, out: list) -> int:
    """A kept tag (dropped ones never get here): its contents, when it has some and they are visible."""
    name: list[str] = []
    contents: list[str] | None = None
    phase = 0  # 0 name, 1 contents, 2 closing name
    i += 1
    while True:
        if phase == 0:  # the name: only plain text is rendered here (its string decides the tag's fate)
            tok = tokens[i]
            kind = type(tok)
            if kind is T.Text:
                name.append(tok["text"])
                i += 1
                continue
            if kind not in _TAG_PHASE_STOPS:
                raise _Fallback("tag name is not plain text")
            if len(name) > 1 and prune and "".join(name).strip().lower() in _DROP_TAGS:
                raise _Fallback("tag name in pieces")  # _dropped_tag saw only the first; _prune sees them all
        else:
            i, _ = _seq(tokens, kinds, i, prune and phase == 1, contents if phase == 1 else [], _TAG_PHASE_STOPS)
        kind = type(tokens[i])
        i += 1
        if kind is T.TagAttrStart:  # attributes are never shown: consumed like Builder._handle_attribute does
            while True:
                i, _ = _seq(tokens, kinds, i, False, [], _ATTR_PARTS)
                if type(tokens[i]) in _ATTR_STOPS:
                    break
                i += 1
        elif kind is T.TagCloseOpen:
            phase, contents = 1, []
        elif kind is T.TagOpenClose:
            phase = 2
        else:  # TagCloseSelfclose, TagCloseClose
            if contents and "".join(name).lower() not in _INVISIBLE:
                out.extend(contents)
            return i


def _wikilink(tokens: list, kinds: list, i: int, prune: bool, out: list) -> int:
    """``[[title|text]]``: the text (pruned where the link's node list is), else the title; file, category and
    bare interwiki links dropped where ``_prune`` reaches."""
    title: list[str] = []
    i, title_nodes = _seq(tokens, kinds, i + 1, False, title, _LINK_STOPS)
    text: list[str] | None = None
    text_nodes = -1
    if type(tokens[i]) is T.WikilinkSeparator:
        text = []
        i, text_nodes = _seq(tokens, kinds, i + 1, prune, text, _LINK_STOPS)
        if type(tokens[i]) is T.WikilinkSeparator:  # Builder would make this text the title; never seen
            raise _Fallback("second link separator")
    if prune:
        if title_nodes > 0:  # the title's string (what _prune tests) is no longer what is rendered
            raise _Fallback("link title is not plain text")
        t = "".join(title).strip().lower()
        if t.startswith(_DROP_LINK_PREFIXES) or (_INTERWIKI.match(t) and text_nodes < 0):
            return i + 1
    out.extend(title if text is None else text)
    return i + 1


def _external_link(tokens: list, kinds: list, i: int, prune: bool, out: list) -> int:
    """``[url title]``: the title; a bare or untitled link is dropped where ``_prune`` reaches, else its url."""
    brackets = tokens[i].get("brackets")
    url: list[str] = []
    i, _ = _seq(tokens, kinds, i + 1, False, url, _EXT_STOPS)
    title: list[str] | None = None
    if type(tokens[i]) is T.ExternalLinkSeparator:
        title = []
        i, _ = _seq(tokens, kinds, i + 1, False, title, _EXT_STOPS)
        if type(tokens[i]) is T.ExternalLinkSeparator:
            raise _Fallback("second external-link separator")
    if prune and title is None:
        return i + 1
    if brackets:
        if title:
            out.extend(title)
    else:
        out.extend(url)
    return i + 1


def _heading(tokens: list, kinds: list, i: int, prune: bool, out: list) -> int:
    """``== Title ==``: where ``_prune`` reaches, the title stripped on its own line (as ``_prune`` does);
    elsewhere what ``Heading.__strip__`` gives."""
    title: list[str] = []
    i, _ = _seq(tokens, kinds, i + 1, False, title, _HEADING_STOP)
    text = "".join(title)
    if prune:
        text = text.strip("\n")  # strip_code()'s defaults there: collapse=True
        while "\n\n\n" in text:
            text = text.replace("\n\n\n", "\n\n")
        text = text.strip()
        if text:
            out.append(text + "\n")
    else:
        out.append(text)
    return i + 1


def _entity(tokens: list, kinds: list, i: int, out: list) -> int:
    """``&amp;``, ``&#38;``, ``&#x26;``: the character (``HTMLEntity.normalize``)."""
    tok = tokens[i + 1]
    if type(tok) is T.HTMLEntityNumeric:
        tok = tokens[i + 2]
        if type(tok) is T.HTMLEntityHex:
            key, end = (tokens[i + 3]["text"], False, True, tok.get("char")), i + 5
        else:
            key, end = (tok["text"], False, False, "x"), i + 4
    else:
        key, end = (tok["text"], True, False, "x"), i + 3
    char = _entities.get(key)
    if char is None:
        char = _entities[key] = HTMLEntity(key[0], named=key[1], hexadecimal=key[2], hex_char=key[3]).normalize()
    out.append(char)
    return end


def _argument(tokens: list, kinds: list, i: int, out: list) -> int:
    """``{{{name|default}}}``: the default, unpruned (``_prune`` does not look inside arguments)."""
    i, _ = _seq(tokens, kinds, i + 1, False, [], _ARG_STOPS)
    if type(tokens[i]) is T.ArgumentSeparator:
        default: list[str] = []
        i, _ = _seq(tokens, kinds, i + 1, False, default, _ARG_STOPS)
        if type(tokens[i]) is T.ArgumentSeparator:
            raise _Fallback("second argument separator")
        out.extend(default)
    return i + 1
