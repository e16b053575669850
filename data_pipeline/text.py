"""Text cleaning and sentence splitting.

Everything here works on plain ``str`` and keeps one invariant the token-parity guarantee rests on:
the pipeline only ever cuts a document at whitespace. WordPiece (and SentencePiece with whitespace
normalisation) tokenises whitespace-separated words independently, so the tokens of the pieces,
concatenated, equal the tokens of the whole document. Sentence boundaries from blingfire that do not
fall on whitespace (``"left!Next"``) are merged away rather than trusted.

Paragraphs are separated by ``"\\n"`` in every cleaned document; sentences never span paragraphs.
"""

from __future__ import annotations

import ctypes
import re

import blingfire
import numpy as np

# Project Gutenberg markers vary: "*** START OF THIS PROJECT GUTENBERG EBOOK X ***",
# "***START OF THE PROJECT GUTENBERG EBOOK X***", indented variants, old "*END*THE SMALL PRINT".
_PG_START = re.compile(r"^\s*\*{3}\s*START OF (THIS|THE) PROJECT GUTENBERG E-?BOOK.*$", re.I | re.M)
_PG_END = re.compile(r"^\s*\*{3}\s*END OF (THIS|THE) PROJECT GUTENBERG E-?BOOK.*$", re.I | re.M)
_PG_END_OLD = re.compile(r"^\s*End of (the )?Project Gutenberg'?s? .*$", re.I | re.M)
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n\s*")
# Deleted before any split: control characters BERT's normaliser deletes. Those Python's str.split() would take for
# whitespace (VT, FF, FS..US, NEL U+0085) must go here, or "alpha\x85beta" would become two words where BERT sees
# one; the others (C1 controls, format characters) are left for the tokenizer, which deletes them itself.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x85]")


def trim_gutenberg(text: str) -> tuple[str, bool]:
    """Cut a Project Gutenberg header (up to the START marker) and footer/licence (from the END marker).

    Returns the body and whether any marker was found (books without markers pass through whole).
    """
    found = False
    m = _PG_START.search(text)
    if m:
        text = text[m.end() :]
        found = True
    # "End of the Project Gutenberg EBook of X" often precedes the "*** END OF ..." marker: cut at the first
    ends = [m.start() for m in (_PG_END.search(text), _PG_END_OLD.search(text)) if m]
    if ends:
        text = text[: min(ends)]
        found = True
    return text, found


def normalize_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def clean_line(line: str) -> str:
    """Delete control characters, collapse runs of spaces, strip. Tokens do not change: BERT's
    normaliser deletes the same control characters and treats these spaces as whitespace."""
    return " ".join(_CONTROL.sub("", line).split())


def unwrap_paragraphs(text: str) -> list[str]:
    """Hard-wrapped prose (books): blank lines separate paragraphs; lines inside one are joined."""
    text = normalize_newlines(text)
    paras = []
    for block in _BLANK_LINES.split(text):
        p = clean_line(block.replace("\n", " "))
        if p:
            paras.append(p)
    return paras


def split_lines(text: str) -> list[str]:
    """Text whose lines are already paragraphs (Wikipedia, JSON): clean, split, drop empty lines.
    (The regexes run once over the whole text: per-line calls cost more than the scan.)"""
    text = _CONTROL.sub("", normalize_newlines(text))
    # str.split() collapses every Unicode space (NBSP, tabs, ...) at C speed; BERT treats them all alike
    return [p for p in (" ".join(line.split()) for line in text.split("\n")) if p]


def split_sentences(paragraph: str) -> list[str]:
    """Sentences of one paragraph with blingfire (fast, abbreviation-aware).

    The paragraph is cut at the start of each sentence blingfire finds, but only where the character
    before is whitespace, so the sentences cover the paragraph completely and, tokenised separately,
    give exactly the paragraph's tokens (``"left!Next"`` stays one sentence).
    """
    if not paragraph or paragraph.isspace():
        return []
    _, offsets = blingfire.text_to_sentences_and_offsets(paragraph)
    cuts = [0]
    for start, _ in offsets[1:]:
        if 0 < start < len(paragraph) and paragraph[start - 1].isspace() and start > cuts[-1]:
            cuts.append(start)
    cuts.append(len(paragraph))
    out = []
    for a, b in zip(cuts[:-1], cuts[1:]):
        piece = paragraph[a:b].strip()
        if piece:
            out.append(piece)
    return out


def sentence_starts(doc: str) -> np.ndarray:
    """Character offsets (> 0) where a new sentence begins in ``doc``: blingfire's sentence starts plus
    every paragraph start (after each ``"\\n"``), sorted and unique.

    Calls blingfire's C ``TextToSentencesWithOffsets`` with numpy buffers: its Python wrapper maps UTF-8
    byte offsets to characters in a per-byte Python loop, which is slower than tokenising.
    """
    data = doc.encode("utf-8")
    n = len(data)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    cap = 2 * n + 16
    out = ctypes.create_string_buffer(cap)
    starts = np.zeros(cap, dtype=np.int32)
    ends = np.zeros(cap, dtype=np.int32)
    o_len = _BF_SENT_OFFSETS(
        data,
        n,
        out,
        starts.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        ends.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
        cap,
    )
    if o_len < 0 or o_len > cap:
        bstarts = np.zeros(0, dtype=np.int64)
    else:
        num = out.value.count(b"\n") + 1
        bstarts = starts[1:num].astype(np.int64)
    raw = np.frombuffer(data, dtype=np.uint8)
    cuts = np.union1d(bstarts, np.flatnonzero(raw == 10) + 1)  # paragraph starts
    cuts = cuts[(cuts > 0) & (cuts < n)]
    if n != len(doc):  # non-ASCII: byte offset -> character offset
        char_of_byte = np.cumsum((raw & 0xC0) != 0x80) - 1
        cuts = char_of_byte[cuts]
    return cuts


_BF_SENT_OFFSETS = blingfire.blingfire.TextToSentencesWithOffsets


def chunk_text(text: str, max_chars: int) -> list[str]:
    """Cut ``text`` into pieces of at most ~``max_chars`` at paragraph breaks, else at whitespace.

    Used to spread one huge document over workers and to bound memory; concatenating the pieces'
    tokens gives the document's tokens because every cut is at whitespace. A run of ``max_chars``
    without any whitespace is kept whole (it is one "word" to the tokenizer anyway).
    """
    if len(text) <= max_chars:
        return [text]
    pieces = []
    start = 0
    n = len(text)
    while start < n:
        end = min(start + max_chars, n)
        if end < n:
            cut = text.rfind("\n", start + max_chars // 2, end)
            if cut < 0:
                cut = _rfind_space(text, start + 1, end)
            if cut < 0:
                m = re.compile(r"\s").search(text, end)
                cut = m.start() if m else n
            end = cut
        pieces.append(text[start:end])
        start = end
    return pieces


def _rfind_space(text: str, lo: int, hi: int) -> int:
    for i in range(hi - 1, lo - 1, -1):
        if text[i].isspace():
            return i
    return -1
