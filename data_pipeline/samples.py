"""The sample index: which tokens of a shard form each pretraining sample.

A shard (Megatron ``.bin``/``.idx``) stores one sequence per sentence, documents as runs of sentences,
all tokens back to back. Every sample we build is one or two *contiguous token ranges* of that flat
array, so the index is a small int64 table, one row per sample::

    a_start, a_end, b_start, b_end, nsp_label      (b_* = 0 and label = -1 outside nsp mode)

Modes (the tokens around the ranges are added at batch time):

- ``doc-sentences``: ``[CLS] A [SEP]``, A = consecutive sentences of one document packed up to N - 2
  tokens (RoBERTa's DOC-SENTENCES, used by BlockBERT and DIET; see ``cut_fraction`` below).
- ``full-sentences``: like doc-sentences but packing continues into the next document; a [SEP] is
  inserted at each document boundary and counted in the budget (RoBERTa's FULL-SENTENCES).
- ``nsp``: ``[CLS] A [SEP] B [SEP]`` with BERT's recipe: pack up to N - 3, cut at a random sentence,
  B is the rest (label 0) or, half the time, sentences from a random other document (label 1; the
  unused sentences go back and start the next sample); a random B is trimmed to fit, A never is.
- ``packed-docs``: ``[CLS] D1 [SEP] [CLS] D2 [SEP] ...``: several whole documents, or whole-sentence pieces of
  long ones, packed into one sequence by a greedy best-fit packer (:func:`_pack_documents`); the batch carries
  per-token document ids and the model keeps attention inside each document. Here every index row is one piece
  (``a_start, a_end``) and ``b_start`` holds the sample the piece belongs to (:data:`PACK_SAMPLE`); a sample is
  the run of rows with the same number. ``short_seq_prob`` and ``cut_fraction`` do not apply.

Sentences longer than the budget are split into budget-sized pieces (nsp: half-budget pieces), never
dropped. With probability
``short_seq_prob`` a sample's budget is drawn uniformly from [2, budget] (BERT). Empty sentences are skipped.

Packing is greedy but vectorized. The end of a sample that starts at a given token is one ``searchsorted``
on the sentence boundaries (doc/full-sentences: on a virtual token axis with a [SEP] slot before every
document; nsp: on the running token count of sentence pieces). Samples are then walked from every chain
start at once (chains = documents, or runs across documents in full-sentences mode, also cut every
~CHAIN_SAMPLES budgets), so the Python loop runs a few hundred steps whatever the corpus size, each step
a handful of numpy calls over all chains. Random budgets are hashes of (seed, chain, step): order-free.

When the next whole sentence does not fit and more than ``cut_fraction`` of the budget would stay empty,
doc/full-sentences cut that sentence (the tail opens the next sample, nothing is dropped): whole-sentence
packing alone leaves ~13% of N=128 empty on books (greedy is optimal for contiguous whole sentences).

The index is cached next to the shard as ``{prefix}_samples_{hash}.npy`` (+ ``.json`` describing it),
where the hash covers every parameter that changes it. One process builds it while the others wait on a
file lock; it is written to a temp file and renamed, so no rank ever sees a partial file; it is
memory-mapped when reused.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import json
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from common.errors import UserError
from data_pipeline.indexed import IndexedDataset, data_file_path, index_file_path
from data_pipeline.masking import sample_keys

MODES = ("doc-sentences", "full-sentences", "nsp", "packed-docs")
INDEX_VERSION = 2
#: the packing walk runs over chains in parallel; chains (documents, or runs of sentences crossing them in
#: full-sentences mode) are also cut at a sentence start about every this many samples' worth of tokens,
#: so a long book costs few steps (at most one shorter sample per chain: < 0.2% of the fill)
CHAIN_SAMPLES = 256
A_START, A_END, B_START, B_END, NSP_LABEL = range(5)
PACK_SAMPLE = B_START
"""packed-docs: the column holding the sample number of each piece row."""
PACKED = "packed-docs"
#: packed-docs: how many whole short documents and how many long documents (streams of sentences) the packer
#: keeps open at once; documents enter in a seeded order, so any window is a deterministic function of the seed
PACK_WINDOW_DOCS = 512
PACK_WINDOW_STREAMS = 64
#: packed-docs: a long document opening a sample may give up to this many - 1 of its last sentences (to the next
#: sample) when the gap left is then filled tighter
PACK_OPENER_TRIES = 4


class SampleIndexError(UserError, ValueError):
    """Bad settings or data for building samples; the message names the setting or file."""


@dataclass
class SampleIndexConfig:
    """Everything that changes a sample index (and therefore its cache name)."""

    seq_length: int = 512
    """Maximum tokens per sample N, special tokens included (at least 8)."""
    sample_mode: str = "doc-sentences"
    """doc-sentences (RoBERTa-1seq), full-sentences (crosses documents), nsp (segment pair + label), or packed-docs
    (whole documents / whole-sentence pieces packed by best fit; attention kept inside each document)."""
    seed: int = 1234
    """Seeds sample packing, epoch shuffles and masks: the global order depends only on it and the position."""
    short_seq_prob: float = 0.1
    """Probability of a shorter random budget per sample, as BERT's --short_seq_prob."""
    cut_fraction: float = 0.1
    """doc/full-sentences: cut the sentence that does not fit when more than this fraction of N would stay empty (its
    head fills the sample, its tail opens the next one; nothing is dropped). 1.0 = whole sentences only (strict
    RoBERTa packing: fill ~0.87 at N=128 on books); 0.0 = every sample filled to the budget. Ignored in nsp mode
    (segments are whole sentences)."""

    def __post_init__(self) -> None:
        if self.sample_mode not in MODES:
            raise SampleIndexError(f"sample_mode {self.sample_mode!r}: choose one of {', '.join(MODES)}")
        if int(self.seq_length) < 8:
            raise SampleIndexError(f"seq_length={self.seq_length}: must be at least 8")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise SampleIndexError(f"short_seq_prob={self.short_seq_prob}: must be within [0, 1]")
        if not 0.0 <= self.cut_fraction <= 1.0:
            raise SampleIndexError(f"cut_fraction={self.cut_fraction}: must be within [0, 1]")

    @property
    def budget(self) -> int:
        """Tokens available to the text of a sample: N minus its [CLS]/[SEP] tokens."""
        return self.seq_length - (3 if self.sample_mode == "nsp" else 2)


# ---------------------------------------------------------------------------------------------------------
# building
# ---------------------------------------------------------------------------------------------------------
def _units(ds: IndexedDataset, doc_lo: int, doc_hi: int, budget: int):
    """Sentence pieces of documents [doc_lo, doc_hi): (token start [U], length [U], document [U])."""
    s_lo, s_hi = int(ds.document_indices[doc_lo]), int(ds.document_indices[doc_hi])
    lengths = np.asarray(ds.sequence_lengths[s_lo:s_hi], dtype=np.int64)
    starts = np.asarray(ds.sequence_pointers[s_lo:s_hi], dtype=np.int64) // ds.dtype.itemsize
    docs_of_seq = np.repeat(
        np.arange(doc_lo, doc_hi, dtype=np.int64),
        np.diff(np.asarray(ds.document_indices[doc_lo : doc_hi + 1], dtype=np.int64)),
    )
    keep = lengths > 0
    lengths, starts, docs_of_seq = lengths[keep], starts[keep], docs_of_seq[keep]
    pieces = (lengths + budget - 1) // budget
    total = int(pieces.sum())
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    piece = np.arange(total, dtype=np.int64) - first
    u_start = np.repeat(starts, pieces) + piece * budget
    u_len = np.minimum(np.repeat(lengths, pieces) - piece * budget, budget)
    u_doc = np.repeat(docs_of_seq, pieces)
    return u_start, u_len, u_doc


def _walk(nxt: np.ndarray, chain_starts: np.ndarray, chain_ends: np.ndarray) -> np.ndarray:
    """All nodes on the orbits ``s, next[s], next[next[s]], ...`` (< chain end) of every chain, sorted."""
    out = []
    cur, end = chain_starts.copy(), chain_ends.copy()
    while cur.size:
        out.append(cur)
        cur = nxt[cur]
        alive = cur < end
        cur, end = cur[alive], end[alive]
    return np.sort(np.concatenate(out)) if out else np.zeros(0, dtype=np.int64)


def _short_targets(config: SampleIndexConfig, keys: np.ndarray, salt: int) -> np.ndarray:
    """Budget of a sample starting at ``keys`` (positions): the full budget, or with probability
    short_seq_prob a uniform one in [2, budget]; a hash of (seed, position), so order-free."""
    L = config.budget
    h = sample_keys(config.seed, keys, salt)
    target = np.full(len(keys), L, dtype=np.int64)
    if config.short_seq_prob > 0:
        short = (h & np.uint64(0xFFFFFF)).astype(np.int64) < int(round(config.short_seq_prob * (1 << 24)))
        target[short] = 2 + ((h[short] >> np.uint64(24)) % np.uint64(L - 1)).astype(np.int64)
    return target


def _chain_open(u_start: np.ndarray, doc_first: np.ndarray, config: SampleIndexConfig) -> np.ndarray:
    """Pieces that open a chain of the walk: every ~CHAIN_SAMPLES budgets, plus document starts
    (except in full-sentences mode, where packing runs across documents)."""
    bucket = u_start // (CHAIN_SAMPLES * config.budget)
    opens = np.r_[True, bucket[1:] != bucket[:-1]]
    return opens if config.sample_mode == "full-sentences" else opens | doc_first


def _pack_tokens(
    u_start: np.ndarray, u_len: np.ndarray, doc_first: np.ndarray, config: SampleIndexConfig
) -> np.ndarray:
    """doc-sentences / full-sentences packing on a virtual token axis (full-sentences: one [SEP] slot
    before every document start), walked for all chains at once; returns ``[S, 5]``."""
    L = config.budget
    U = len(u_len)
    full = config.sample_mode == "full-sentences"
    k = np.cumsum(doc_first) if full else np.zeros(U, dtype=np.int64)
    vs = u_start + k  # virtual start of every piece
    sep_v = (vs[doc_first] - 1) if full else np.zeros(0, dtype=np.int64)
    ve = vs + u_len  # virtual end of every piece
    starts_u = np.flatnonzero(_chain_open(u_start, doc_first, config))
    chain_v0 = vs[starts_u]
    chain_v1 = ve[np.r_[starts_u[1:], U] - 1]
    bnd = np.sort(np.concatenate([vs, chain_v1]))  # where a sample may end without a cut
    cut = int(np.floor(config.cut_fraction * L))
    rec_lo, rec_hi = [], []
    cur, end, cid = chain_v0.copy(), chain_v1.copy(), np.arange(len(chain_v0), dtype=np.int64)
    n_chains, step, block = len(chain_v0), 0, 64
    while cur.size:
        if step % block == 0:  # budgets of the next `block` samples of every chain, keyed by (chain, step)
            keys = (np.arange(n_chains, dtype=np.int64)[:, None] << 32) + step + np.arange(block)[None, :]
            targets = _short_targets(config, keys.ravel(), 1).reshape(n_chains, block)
        lim = np.minimum(cur + targets[cid, step % block], end)
        step += 1
        e = bnd[np.searchsorted(bnd, lim, side="right") - 1]
        nxt_b = bnd[np.minimum(np.searchsorted(bnd, cur, side="right"), len(bnd) - 1)]
        e = np.where(e > cur, e, np.minimum(nxt_b, end))  # a short budget still takes one piece
        if config.cut_fraction < 1.0:
            e = np.where((lim - e > cut) & (lim > cur), lim, e)
        rec_lo.append(cur)
        rec_hi.append(e)
        alive = e < end
        cur, end, cid = e[alive], end[alive], cid[alive]
    v0, v1 = np.concatenate(rec_lo), np.concatenate(rec_hi)
    order = np.argsort(v0, kind="stable")
    v0, v1 = v0[order], v1[order]
    out = np.zeros((len(v0), 5), dtype=np.int64)
    out[:, A_START] = v0 - np.searchsorted(sep_v, v0, side="left")
    out[:, A_END] = v1 - np.searchsorted(sep_v, v1, side="left")
    out[:, NSP_LABEL] = -1
    keep = out[:, A_END] > out[:, A_START]  # a sample that would hold only a [SEP] slot
    return out[keep]


class _Packer:
    """The state of :func:`_pack_documents`' greedy best-fit packer over sentence units (``u_len`` tokens each,
    of document ``u_doc``), and its steps: top up the open pools, open a sample with the oldest open item, fill the
    rest by best fit, retire finished streams. Each sample is a list of pieces (first unit, end unit, sample)."""

    def __init__(self, u_len: np.ndarray, u_doc: np.ndarray, config: SampleIndexConfig) -> None:
        self.N = int(config.seq_length)
        self.doc_first = np.flatnonzero(np.r_[True, u_doc[1:] != u_doc[:-1]])
        self.doc_end = np.r_[self.doc_first[1:], len(u_len)]
        self.cum = np.r_[0, np.cumsum(u_len)]
        self.doc_tokens = self.cum[self.doc_end] - self.cum[self.doc_first]
        seed = [config.seed, MODES.index(PACKED), self.N, INDEX_VERSION]
        self.order = np.random.default_rng(seed).permutation(len(self.doc_first))
        self.pieces: list[tuple[int, int, int]] = []  # (first unit, end unit, sample)
        self.short: list[tuple[int, int]] = []  # sorted (size, document) of open short documents
        self.arrivals: deque = deque()  # open items, oldest first: (is_stream, document)
        self.used_short: set[int] = set()
        self.s_doc: list[int] = []  # open streams: document, next unit
        self.s_pos: list[int] = []
        self.nxt = 0

    def pack(self) -> list[tuple[int, int, int]]:
        """Every sample's pieces, in order, until no open item is left."""
        sample = 0
        while True:
            self.top_up()
            opener = self.open_sample(sample)
            if opener is None:
                return self.pieces
            if opener < 0:  # a short document opened the sample
                first, end, _ = self.pieces[-1]
                actions, _ = self.plan_fill(self.N - int(self.cum[end] - self.cum[first]) - 2)
            else:
                actions = self.open_with_stream(opener, sample)
            self.apply(actions, sample)
            self.retire_finished_streams()
            sample += 1

    def top_up(self) -> None:
        """Open the next documents of the seeded order: both pools are topped up, but short documents never pile
        up beyond 4 windows while long ones are scarce (the pool's sorted insert would grow with the corpus)."""
        while (
            self.nxt < len(self.order)
            and len(self.short) < 4 * PACK_WINDOW_DOCS
            and (len(self.short) < PACK_WINDOW_DOCS or len(self.s_doc) < PACK_WINDOW_STREAMS)
        ):
            d = int(self.order[self.nxt])
            self.nxt += 1
            if self.doc_tokens[d] + 2 <= self.N:
                bisect.insort(self.short, (int(self.doc_tokens[d]) + 2, d))
                self.arrivals.append((False, d))
            else:
                self.s_doc.append(d)
                self.s_pos.append(int(self.doc_first[d]))
                self.arrivals.append((True, d))

    def take_short(self, d: int, size: int, sample: int) -> None:
        """Short document ``d`` (``size`` = its tokens + 2) goes whole into ``sample``."""
        self.short.pop(bisect.bisect_left(self.short, (size, d)))
        self.used_short.add(d)
        self.pieces.append((int(self.doc_first[d]), int(self.doc_end[d]), sample))

    def open_sample(self, sample: int) -> int | None:
        """The oldest open item opens the sample: a short document goes in whole (returns -1), a stream's index is
        returned for :meth:`open_with_stream`; None when nothing is left. Items already used are dropped."""
        while self.arrivals:
            is_stream, d = self.arrivals[0]
            if is_stream and d in self.s_doc:
                return self.s_doc.index(d)
            self.arrivals.popleft()
            if not is_stream and d not in self.used_short:
                self.take_short(d, int(self.doc_tokens[d]) + 2, sample)
                return -1
        return None

    def stream_run(self, i: int, room: int) -> int:
        """End unit of the longest run of whole units of stream i within ``room`` tokens (its start if none)."""
        p, e = self.s_pos[i], int(self.doc_end[self.s_doc[i]])
        return min(int(np.searchsorted(self.cum, self.cum[p] + room, side="right")) - 1, e)

    def open_with_stream(self, opener: int, sample: int) -> list[tuple]:
        """The opener stream's longest whole-sentence run, or up to PACK_OPENER_TRIES - 1 sentences less when the
        rest then packs tighter; returns the fill actions for the room it leaves."""
        p0 = self.s_pos[opener]
        end0 = max(self.stream_run(opener, self.N - 2), p0 + 1)
        best = None
        for end in range(end0, max(end0 - PACK_OPENER_TRIES, p0), -1):
            room = self.N - int(self.cum[end] - self.cum[p0]) - 2
            actions, left = self.plan_fill(room, opener)
            if best is None or left < best[2]:
                best = (end, actions, left)
            if left < 3:
                break
        end, actions, _ = best
        self.pieces.append((p0, end, sample))
        self.s_pos[opener] = end
        return actions

    def plan_fill(self, room: int, opener: int = -1) -> tuple[list[tuple], int]:
        """Best-fit choices for ``room`` tokens without changing the pools (the opener stream, if any, is left
        out: its next sentences would have been part of its own piece); returns the actions and the room left."""
        actions: list[tuple] = []
        taken: set[int] = set()
        short, cum = self.short, self.cum
        pos = np.asarray(self.s_pos, dtype=np.int64)
        ends_cap = self.doc_end[np.asarray(self.s_doc, dtype=np.int64)] if self.s_doc else None
        if opener >= 0:
            pos[opener] = ends_cap[opener]  # exhausted for this sample
        while room >= 3:
            k = bisect.bisect_right(short, (room, 1 << 62)) - 1  # the largest short document that fits
            while k >= 0 and short[k][1] in taken:
                k -= 1
            best_short = short[k][0] if k >= 0 else 0
            best_stream = best_i = best_end = 0
            if self.s_doc:
                ends = np.minimum(np.searchsorted(cum, cum[pos] + room - 2, side="right") - 1, ends_cap)
                got = cum[ends] - cum[pos]
                best_i = int(np.argmax(got))
                if got[best_i] > 0:
                    best_stream, best_end = int(got[best_i]) + 2, int(ends[best_i])
            if best_short == 0 and best_stream == 0:
                break
            if best_short >= best_stream:
                taken.add(short[k][1])
                actions.append((False, short[k][1], short[k][0]))
                room -= best_short
            else:
                actions.append((True, best_i, int(pos[best_i]), best_end))
                pos[best_i] = best_end
                room -= best_stream
        return actions, room

    def apply(self, actions: list[tuple], sample: int) -> None:
        """Put the planned pieces into ``sample``: stream runs advance their stream, short documents leave the pool."""
        for act in actions:
            if act[0]:
                _, i, lo, hi = act
                self.pieces.append((lo, hi, sample))
                self.s_pos[i] = hi
            else:
                _, d, size = act
                self.take_short(d, size, sample)

    def retire_finished_streams(self) -> None:
        gone = [i for i in range(len(self.s_doc)) if self.s_pos[i] >= self.doc_end[self.s_doc[i]]]
        for i in reversed(gone):
            del self.s_doc[i], self.s_pos[i]


def _pack_documents(u_start: np.ndarray, u_len: np.ndarray, u_doc: np.ndarray, config: SampleIndexConfig) -> np.ndarray:
    """packed-docs: greedy best-fit packing of documents into sequences of N tokens; returns piece rows ``[P, 5]``.

    A piece costs its tokens + 2 ([CLS] ... [SEP]). Documents enter in a seeded random order. One that fits in N
    is a whole item in a pool of short documents; a longer one is a stream of sentence units. Each sample opens
    with the oldest open item (the oldest short document, or the longest whole-sentence run of the oldest stream;
    up to PACK_OPENER_TRIES - 1 sentences less when the rest then fills tighter), so nothing waits for ever; then,
    while at least 3 tokens are left, the best fit among all candidates goes in: the largest short document that
    fits, or the longest run of whole sentences that fits from any other open stream. (A stream is never picked
    twice for one sample: its next sentence did not fit.) Pieces of long documents therefore start at a sentence
    start (except the budget-sized pieces of sentences longer than N - 2), and the gaps that whole-sentence cutting
    leaves are filled by other documents instead of padding. ModernBERT reports >99% fill from greedy best-fit
    packing of whole (truncated) sequences; NeoBERT measured that packing without a document mask costs GLUE.
    """
    pieces = _Packer(u_len, u_doc, config).pack()
    out = np.zeros((len(pieces), 5), dtype=np.int64)
    if pieces:
        arr = np.asarray(pieces, dtype=np.int64)
        out[:, A_START] = u_start[arr[:, 0]]
        out[:, A_END] = u_start[arr[:, 1] - 1] + u_len[arr[:, 1] - 1]
        out[:, PACK_SAMPLE] = arr[:, 2]
    out[:, NSP_LABEL] = -1
    return out


def packed_sample_rows(index: np.ndarray) -> np.ndarray:
    """packed-docs: ``[S + 1]`` row offsets; sample s is index rows ``[rows[s], rows[s + 1])``."""
    col = np.asarray(index[:, PACK_SAMPLE])
    return np.r_[np.flatnonzero(np.r_[True, col[1:] != col[:-1]]), len(col)] if len(col) else np.zeros(1, np.int64)


def build_sample_index(ds: IndexedDataset, doc_range: tuple[int, int], config: SampleIndexConfig) -> np.ndarray:
    """Build the ``[S, 5]`` int64 index of the documents ``doc_range`` of ``ds`` (no caching; packed-docs: one row
    per piece, see :data:`PACK_SAMPLE`)."""
    doc_lo, doc_hi = doc_range
    L = config.budget
    # nsp: pieces of at most half the budget, so a chunk holds two pieces and B can truly follow A
    # (a shard of whole documents, one sequence each, would otherwise only make random pairs)
    u_start, u_len, u_doc = _units(ds, doc_lo, doc_hi, max(L // 2, 1) if config.sample_mode == "nsp" else L)
    U = len(u_len)
    if U == 0:
        return np.zeros((0, 5), dtype=np.int64)
    if config.sample_mode == PACKED:
        return _pack_documents(u_start, u_len, u_doc, config)
    doc_first = np.r_[True, u_doc[1:] != u_doc[:-1]]  # piece opens a document
    if config.sample_mode != "nsp":
        return _pack_tokens(u_start, u_len, doc_first, config)

    idx = np.arange(U, dtype=np.int64)
    rng = np.random.default_rng([config.seed, MODES.index(config.sample_mode), config.seq_length, INDEX_VERSION])
    target = _short_targets(config, idx, 2)
    doc_start_units = np.flatnonzero(doc_first)
    doc_end_units = np.r_[doc_start_units[1:], U]
    doc_ord = np.cumsum(doc_first) - 1  # rank of the piece's document among non-empty ones
    opens = _chain_open(u_start, doc_first, config)
    chain_starts = np.flatnonzero(opens)
    chain_ends = np.r_[chain_starts[1:], U]
    unit_chain_end = chain_ends[np.cumsum(opens) - 1]
    cum = np.r_[0, np.cumsum(u_len)]
    pack_end = np.searchsorted(cum, cum[:-1] + target, side="right") - 1
    pack_end = np.clip(pack_end, idx + 1, unit_chain_end)

    # ---- nsp: split point, random-next decision and random segment, all drawn per piece --------------
    n_docs = len(doc_start_units)
    if n_docs < 2:
        raise SampleIndexError(
            f"{ds.prefix}: nsp mode needs at least 2 non-empty documents in the split "
            f"(documents {doc_lo}..{doc_hi - 1} have {n_docs})"
        )
    k = pack_end - idx
    split = idx + 1 + np.floor(rng.random(U) * np.maximum(k - 1, 1)).astype(np.int64)
    split = np.minimum(split, pack_end)
    is_random = (rng.random(U) < 0.5) | (k == 1)
    u_other, u_first = rng.random(U), rng.random(U)  # drawn per piece: order-free, like the rest
    nxt = np.where(is_random, split, pack_end)  # random B: the unused sentences go back

    starts = _walk(nxt, chain_starts, chain_ends)
    s, r = split[starts], is_random[starts]
    # the random segment: any other document, from a random sentence, up to the budget A leaves
    other = np.floor(u_other[starts] * (n_docs - 1)).astype(np.int64)
    other += other >= doc_ord[starts]
    o_first, o_end = doc_start_units[other], doc_end_units[other]
    b_first = o_first + np.floor(u_first[starts] * (o_end - o_first)).astype(np.int64)
    b_budget = np.maximum(target[starts] - (cum[s] - cum[starts]), 1)
    b_end = np.searchsorted(cum, cum[b_first] + b_budget, side="right") - 1
    b_end = np.clip(b_end, b_first + 1, o_end)
    b_lo = np.where(r, b_first, s)
    b_hi = np.where(r, b_end, pack_end[starts])
    a0 = u_start[starts]
    a1 = u_start[s - 1] + u_len[s - 1]
    b0 = u_start[b_lo]
    b1 = u_start[b_hi - 1] + u_len[b_hi - 1]
    # only a random B can overflow (A and a true B were packed within the budget); trim B's tail, so A,
    # and with it every token of the corpus, is never cut (BERT's truncate_seq_pair would cut A too)
    la, lb = a1 - a0, b1 - b0
    lb = np.minimum(lb, L - la)
    out = np.empty((len(starts), 5), dtype=np.int64)
    out[:, A_START], out[:, A_END] = a0, a0 + la
    out[:, B_START], out[:, B_END] = b0, b0 + lb
    out[:, NSP_LABEL] = r.astype(np.int64)
    return out


# ---------------------------------------------------------------------------------------------------------
# caching
# ---------------------------------------------------------------------------------------------------------
def _shard_identity(prefix: str) -> dict:
    out = {}
    for p in (index_file_path(prefix), data_file_path(prefix)):
        st = os.stat(p)
        out[os.path.basename(p)] = [st.st_size, st.st_mtime_ns]
    return out


def cache_identity(config: SampleIndexConfig) -> dict:
    """The settings hashed into a cache name, under the names they had when the cache format was fixed
    (``sample_mode`` is stored as ``mode``), so renaming a field never orphans existing caches."""
    d = asdict(config)
    d["mode"] = d.pop("sample_mode")
    return d


def index_cache_path(
    prefix: str, doc_range: tuple[int, int], config: SampleIndexConfig, cache_dir: str | None = None
) -> tuple[Path, dict]:
    """Where the index for these parameters lives, and the description hashed into its name."""
    desc = {
        "version": INDEX_VERSION,
        "shard": _shard_identity(prefix),
        "doc_range": list(map(int, doc_range)),
        **cache_identity(config),
    }
    digest = hashlib.sha1(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]
    return cache_base(prefix, cache_dir).with_name(f"{Path(prefix).name}_samples_{digest}.npy"), desc


def cache_base(prefix: str, cache_dir: str | None = None) -> Path:
    """``{cache_dir}/{name}``, by default ``{shard dir}/cache/{name}``: a sub-directory (as Megatron's default
    ``cache/``), so the shard directory holds only .bin/.idx pairs and Megatron's tools/merge_datasets.py --input
    still takes it."""
    p = Path(prefix)
    return (p.parent / "cache" if cache_dir is None else Path(cache_dir)) / p.name


def _atomic_save(path: Path, writer) -> None:
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}.{os.urandom(4).hex()}")  # unique across hosts too
    try:
        with open(tmp, "wb") as f:
            writer(f)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _try_load(path: Path) -> np.ndarray | None:
    if path.is_file():
        try:
            arr = np.load(path, mmap_mode="r")
            if arr.ndim == 2 and arr.shape[1] == 5 and arr.dtype == np.int64:
                return arr
        except (ValueError, OSError):
            pass  # unreadable: rebuild
    return None


@contextlib.contextmanager
def _build_lock(path: Path):
    """One builder per index at a time (ranks of a node, or of a cluster on a file system with locks);
    the others wait here, then find the cache. Without a usable lock everyone builds (atomic rename
    still keeps the cache whole). The lock file is removed by the builder once the cache is in place,
    so anyone arriving later finds the cache before looking for a lock."""
    lock_path = path.with_name(path.name + ".lock")
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(lock_path, "a")
        fcntl.flock(fh, fcntl.LOCK_EX)
    except (OSError, ImportError):
        yield lambda: None
        return
    try:
        yield lambda: lock_path.unlink(missing_ok=True)
    finally:
        fh.close()


def load_or_build_index(
    ds: IndexedDataset,
    doc_range: tuple[int, int],
    config: SampleIndexConfig,
    cache_dir: str | None = None,
    verbose: bool = False,
) -> np.ndarray:
    """The cached index (memory-mapped) if present, else build it, save it atomically and return it."""
    path, desc = index_cache_path(ds.prefix, doc_range, config, cache_dir)
    arr = _try_load(path)
    if arr is not None:
        return arr
    with _build_lock(path) as release:
        arr = _try_load(path)  # built by another rank while we waited
        if arr is not None:
            return arr
        t0 = time.perf_counter()
        arr = build_sample_index(ds, doc_range, config)
        seconds = time.perf_counter() - t0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_save(path, lambda f: np.save(f, arr))
            desc.update(num_samples=int(len(arr)), build_seconds=round(seconds, 4))
            _atomic_save(path.with_suffix(".json"), lambda f: f.write(json.dumps(desc, indent=1).encode()))
            release()
        except OSError as e:
            if verbose:
                print(
                    f"[samples] could not cache the index at {path} ({e}); set cache_dir to a writable folder",
                    file=sys.stderr,
                )
            return arr
    if verbose:
        print(
            f"[samples] built {len(arr)} samples for {ds.prefix} documents {doc_range} in {seconds:.3f}s -> {path}",
            file=sys.stderr,
        )
    return np.load(path, mmap_mode="r")


def shard_max_token_id(ds: IndexedDataset, cache_dir: str | None = None) -> int:
    """Largest token id in the shard, scanned in chunks once and cached with the sample indices (keyed by
    size/mtime); an unwritable cache only costs the scan next time."""
    ident = _shard_identity(ds.prefix)
    digest = hashlib.sha1(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_base(ds.prefix, cache_dir).with_name(f"{Path(ds.prefix).name}_maxid_{digest}.json")
    try:
        return int(json.loads(path.read_text())["max_token_id"])
    except (OSError, ValueError, KeyError):
        pass
    tokens = ds.tokens
    m = -1
    step = 1 << 24
    for i in range(0, len(tokens), step):
        m = max(m, int(np.asarray(tokens[i : i + step]).max()))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _atomic_save(path, lambda f: f.write(json.dumps({"max_token_id": m, "shard": ident}).encode()))
    except OSError:
        pass
    return m
