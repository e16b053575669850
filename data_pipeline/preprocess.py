"""``python -m data_pipeline.preprocess``: raw corpora -> Megatron-compatible ``.bin``/``.idx`` shards.

Flags mirror Megatron-LM's ``tools/preprocess_data.py`` (``--input --output-prefix --json-keys
--split-sentences --keep-newlines --tokenizer-type --vocab-file --tokenizer-model --append-eod
--workers``) and add input formats, resume, a bad-input report, and several ranks under mpirun or srun.
See docs/data_pipeline.md.

Flow: inputs are expanded and sorted; the reader of each file (parent) cuts documents into pieces,
batches them into chunks; workers tokenise chunks (bounded, ordered map); the parent appends results
to one *part* shard per input file; at the end part shards are merged in input order. Output bytes
therefore do not depend on ``--workers``, the chunk size, or the number of ranks (``mpirun -np K`` or
``srun -n K``: data_pipeline/coordination.py).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

from common.cli import HelpFormatter, add_flags, cli
from common.error_exit import run_entry
from common.errors import UserError
from common.outputs import check_fresh, check_not_input
from common.process import exit_process
from data_pipeline import coordination, multistream
from data_pipeline import resume as rs
from data_pipeline.encode import Chunk, ChunkResult, EncodeSettings, Piece, encode_chunk, init_worker
from data_pipeline.indexed import IndexedDataset, IndexedDatasetBuilder, best_dtype
from data_pipeline.readers import KIND_LINES, READERS, BadInputLog, expand_inputs, formats, read_documents
from data_pipeline.text import chunk_text
from data_pipeline.tokenization import TOKENIZER_TYPES, Tokenizer, build_tokenizer

#: Big documents are cut into pieces of about this many characters (at paragraph breaks). A constant,
#: not a flag: with --split-sentences a paragraph longer than this is cut, which changes sentence
#: boundaries, so it is part of the output's definition (and of the resume settings hash).
PIECE_CHARS = 1 << 16


@dataclass
class PreprocessConfig:
    """Everything one preprocessing run needs; validated on construction."""

    input: list[str]
    """Files, directories (recursive) and globs to read."""
    output_prefix: str
    """Output files are ``{prefix}_{key}_{sentence|document}.bin/.idx``."""
    tokenizer_type: str = field(metadata=cli(choices=lambda: TOKENIZER_TYPES))
    """One of BertWordPieceLowerCase, BertWordPieceCase, SentencePieceTokenizer, HuggingFaceTokenizer."""
    vocab_file: str | None = None
    """WordPiece vocab.txt (BertWordPiece*)."""
    tokenizer_model: str | None = None
    """SentencePiece .model, or a Hugging Face tokenizer directory / tokenizer.json."""
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    """JSON / parquet fields to tokenise, one output shard each (other formats have only ``text``)."""
    input_format: str = field(default="auto", metadata=cli(choices=formats))
    """auto (detected per file from content), mediawiki, wikiextractor, jsonl, text, parquet."""
    split_sentences: bool = False
    """One sequence per sentence (blingfire) instead of per document."""
    keep_newlines: bool = False
    """With --split-sentences, keep the newline that ends a paragraph on its last sentence."""
    append_eod: bool = False
    """Append the end-of-document id (the tokenizer's [SEP]) to every document, like Megatron."""
    workers: int = 1
    """Tokenising processes per rank (1 = in-process)."""
    chunk_chars: int = 1 << 20
    """Characters of text per task sent to a worker (affects speed only, never the output)."""
    max_document_chars: int = 8_000_000
    """Documents longer than this are reported as ``oversized_document`` (still processed, in pieces)."""
    multistream_unit_mb: float = 64.0
    """A Wikimedia multistream dump with its index beside it (``...-multistream-index.txt.bz2``) is split into
    units of whole bz2 streams, about this many MB of the dump each, spread over workers, ranks and tasks like input
    files (each reads only its own streams; resume is per unit). 0: one unit per dump. Never changes the output."""
    resume: bool = False
    """Continue an interrupted run, skipping input files (or dump units) already finished."""
    strict: bool = False
    """Exit non-zero, writing no final shards, if any bad input was found."""
    overwrite: bool = False
    """Replace the shards (and report) an earlier run wrote under this --output-prefix; without it they are kept and
    the run is refused."""
    progress: bool | None = None
    """Progress bar; default: only when stderr is a terminal."""

    def __post_init__(self) -> None:
        if not self.input:
            raise ValueError("--input: give at least one file, directory or glob")
        if self.tokenizer_type not in TOKENIZER_TYPES:
            raise ValueError(f"--tokenizer-type {self.tokenizer_type!r}: choose one of {', '.join(TOKENIZER_TYPES)}")
        if self.input_format not in formats():
            raise ValueError(f"--input-format {self.input_format!r}: choose one of {', '.join(formats())}")
        if not self.multistream_unit_mb >= 0:
            raise ValueError(f"--multistream-unit-mb must be >= 0, got {self.multistream_unit_mb}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.chunk_chars < 1:
            raise ValueError(f"--chunk-chars must be >= 1, got {self.chunk_chars}")
        if not self.json_keys or len(set(self.json_keys)) != len(self.json_keys):
            raise ValueError(f"--json-keys must be distinct names, got {self.json_keys}")
        several = [name for name, r in READERS.items() if r.several_keys]
        if self.input_format != "auto" and not READERS[self.input_format].several_keys and len(self.json_keys) > 1:
            raise ValueError(f"--json-keys {self.json_keys}: several keys need {' or '.join(several)} input")
        if self.keep_newlines and not self.split_sentences:
            raise ValueError("--keep-newlines only applies with --split-sentences")

    @property
    def level(self) -> str:
        return "sentence" if self.split_sentences else "document"

    def output_settings(self) -> dict:
        """What defines the output bytes (the resume hash): not workers, chunk size or progress."""
        return {
            "tokenizer_type": self.tokenizer_type,
            "vocab": rs.file_digest(self.vocab_file),
            "model": rs.file_digest(self.tokenizer_model),
            "json_keys": self.json_keys,
            "input_format": self.input_format,
            "split_sentences": self.split_sentences,
            "keep_newlines": self.keep_newlines,
            "append_eod": self.append_eod,
            "max_document_chars": self.max_document_chars,
            "piece_chars": PIECE_CHARS,
            "format_version": 1,
        }


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`PreprocessConfig` field (name, type, default, choices, docstring as help), plus two of
    Megatron's flags that are accepted and not needed."""
    p = argparse.ArgumentParser(
        prog="python -m data_pipeline.preprocess",
        description=__doc__.split("\n\n")[0],
        formatter_class=HelpFormatter,
    )
    add_flags(p, PreprocessConfig)
    g = p.add_argument_group("accepted for Megatron command lines")
    g.add_argument(
        "--tokenizer-hf-no-include-special-tokens",
        action="store_true",
        help="accepted for Megatron compatibility; we never wrap sentences in [CLS]/[SEP]",
    )
    g.add_argument(
        "--log-interval",
        type=int,
        default=0,
        help="accepted for Megatron command lines; progress is shown by --progress instead",
    )
    return p


def config_from_args(argv: Sequence[str] | None = None) -> PreprocessConfig:
    ns = vars(build_parser().parse_args(argv))
    ns.pop("tokenizer_hf_no_include_special_tokens")  # Megatron flags we accept and do not need
    ns.pop("log_interval")
    return PreprocessConfig(**ns)


# -- parent: reading into chunks ------------------------------------------------------------------
def chunk_stream(cfg: PreprocessConfig, files: Sequence[tuple[int, str]]) -> Iterator[Chunk]:
    """Chunks of pieces for each (part index, path); the last chunk of a file carries its reader log."""
    for idx, path in files:
        log = BadInputLog()
        pieces: list[Piece] = []
        nchars = 0
        for doc in read_documents(path, cfg.input_format, cfg.json_keys, log):
            size = max(len(t) for t in doc.texts.values()) if doc.texts else 0
            if size > cfg.max_document_chars:
                log.add(
                    "oversized_document",
                    path,
                    doc.where,
                    f"{size:,} characters > --max-document-chars {cfg.max_document_chars:,}; kept, in pieces",
                )
            if doc.kind == KIND_LINES and len(doc.texts) == 1 and size > PIECE_CHARS:
                ((key, text),) = doc.texts.items()
                parts = chunk_text(text, PIECE_CHARS)
                new = [Piece({key: t}, doc.kind, i == len(parts) - 1, doc.where) for i, t in enumerate(parts)]
            else:
                new = [Piece(doc.texts, doc.kind, True, doc.where)]
            for pc in new:
                pieces.append(pc)
                nchars += sum(len(t) for t in pc.texts.values())
                if nchars >= cfg.chunk_chars:
                    yield Chunk(idx, pieces, nchars=nchars)
                    pieces, nchars = [], 0
        yield Chunk(idx, pieces, last=True, reader_log=log.to_dict(), nchars=nchars)


def ordered_map(pool, fn, items: Iterable, window: int) -> Iterator:
    """Like ``Pool.imap`` but with at most ``window`` tasks in flight, so reading never runs ahead of
    tokenising (``imap`` drains its input eagerly: memory would grow with the corpus)."""
    q: deque = deque()
    for item in items:
        q.append(pool.apply_async(fn, (item,)))
        if len(q) >= window:
            yield q.popleft().get()
    while q:
        yield q.popleft().get()


# -- parent: writing one part shard ---------------------------------------------------------------
class _KeyWriter:
    """Turns piece results of one key into documents of one shard; documents may span chunks."""

    def __init__(
        self,
        prefix: str,
        dtype: np.dtype,
        split: bool,
        eod: int | None,
        path: str,
        log: BadInputLog,
        key: str,
        unk: int,
    ) -> None:
        self.b = IndexedDatasetBuilder(prefix, dtype)
        self.split, self.eod, self.path, self.log, self.key, self.unk = split, eod, path, log, key, unk
        self.unk_tokens = 0
        self.pending: np.ndarray | None = None  # last sentence of the open document (eod may join it)
        self.doc_units = 0
        self.doc_tokens = 0

    def add(self, tokens: np.ndarray, lengths: np.ndarray, doc_end: bool, where: str) -> None:
        self.unk_tokens += int(np.count_nonzero(tokens == self.unk))
        if len(lengths):
            if self.split:
                if self.pending is not None:
                    self.b.add_item(self.pending)
                head = int(lengths[:-1].sum())
                if len(lengths) > 1:
                    self.b.add_raw(tokens[:head], lengths[:-1], [])
                self.pending = tokens[head:]
            else:
                self.b.append_tokens(tokens)
            self.doc_units += len(lengths)
            self.doc_tokens += int(lengths.sum())
        if doc_end:
            if self.doc_units == 0:  # kept as a document of no sequences, as Megatron's add_document does
                self.log.add(
                    "empty_document",
                    self.path,
                    where,
                    "no text left after cleaning; kept as a zero-length document"
                    + (f" (key {self.key!r})" if self.key != "text" else ""),
                )
                self.b.end_document()
            else:
                if self.split:
                    last = self.pending
                    if self.eod is not None:
                        last = np.concatenate([last, np.asarray([self.eod], dtype=last.dtype)])
                    self.b.add_item(last)
                    self.pending = None
                else:
                    if self.eod is not None:
                        self.b.append_tokens(np.asarray([self.eod]))
                    self.b.end_item()
                self.b.end_document()
            self.doc_units = self.doc_tokens = 0


class PartWriter:
    """All keys' shards of one input file."""

    def __init__(
        self,
        cfg: PreprocessConfig,
        layout: rs.RunLayout,
        idx: int,
        path: str,
        dtype: np.dtype,
        eod: int | None,
        unk: int,
    ) -> None:
        self.cfg, self.layout, self.idx, self.path = cfg, layout, idx, path
        self.stamp = rs.input_stamp(path)  # before reading: a file changed mid-run is redone on resume
        self.log = BadInputLog()
        self.writers = {
            k: _KeyWriter(
                layout.part_prefix(idx, k, cfg.level), dtype, cfg.split_sentences, eod, path, self.log, k, unk
            )
            for k in cfg.json_keys
        }
        self.nchars = 0
        self.t0 = time.time()

    def add(self, res: ChunkResult) -> None:
        self.nchars += res.nchars
        for key, kr in res.keys.items():
            w = self.writers[key]
            t0 = u0 = 0
            for i in range(res.npieces):
                n = int(kr.units_per_piece[i])
                lens = kr.lengths[u0 : u0 + n]
                t1 = t0 + int(lens.sum())
                w.add(kr.tokens[t0:t1], lens, res.doc_ends[i], res.wheres[i])
                t0, u0 = t1, u0 + n
        if res.reader_log:
            self.log.merge(res.reader_log)

    def finalize(self, shash: str) -> dict:
        stats = {}
        for key, w in self.writers.items():
            w.b.finalize()
            stats[key] = {
                "documents": w.b.num_documents,
                "sequences": w.b.num_sequences,
                "tokens": w.b.num_tokens,
                "unk_tokens": w.unk_tokens,
            }
        marker = {
            "settings_hash": shash,
            "input": self.stamp,
            "stats": stats,
            "chars": self.nchars,
            "bad_input": self.log.to_dict(),
            "seconds": round(time.time() - self.t0, 3),
        }
        rs.write_json_atomic(self.layout.part_marker(self.idx), marker)
        return marker

    def abort(self) -> None:
        for w in self.writers.values():
            w.b.abort()


# -- orchestration --------------------------------------------------------------------------------
class _Progress:
    """tqdm bar on a terminal; one line per finished input file otherwise (quiet in logs)."""

    def __init__(self, enabled: bool, nfiles: int, rank_tag: str) -> None:
        self.bar = None
        self.nfiles, self.tag = nfiles, rank_tag
        self.t0 = time.time()
        self.docs = self.tokens = self.chars = 0
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(unit="B", unit_scale=True, desc="preprocess", file=sys.stderr, dynamic_ncols=True)

    def chunk(self, res: ChunkResult) -> None:
        self.chars += res.nchars
        self.docs += sum(res.doc_ends)
        self.tokens += sum(int(k.lengths.sum()) for k in res.keys.values())
        if self.bar is not None:
            dt = max(time.time() - self.t0, 1e-9)
            self.bar.update(res.nchars)
            self.bar.set_postfix_str(f"{self.docs / dt:,.0f} docs/s {self.tokens / dt:,.0f} tok/s", refresh=False)

    def part_done(self, done: int, path: str, marker: dict, skipped: bool = False) -> None:
        if self.bar is None:
            what = (
                "skipped (already done)"
                if skipped
                else (
                    f"{sum(s['documents'] for s in marker['stats'].values()):,} docs, "
                    f"{sum(s['tokens'] for s in marker['stats'].values()):,} tokens"
                )
            )
            print(
                f"[preprocess{self.tag}] {done}/{self.nfiles} {os.path.basename(path)}: {what}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _process_parts(
    cfg: PreprocessConfig,
    layout: rs.RunLayout,
    todo: list[tuple[int, str]],
    tokenizer: Tokenizer,
    settings: EncodeSettings,
    shash: str,
    progress: _Progress,
    done_before: int,
    use_spawn: bool,
) -> None:
    dtype = np.dtype(settings.dtype)
    eod = tokenizer.eod_id if cfg.append_eod else None
    if not todo:
        return
    paths = dict(todo)
    stream = chunk_stream(cfg, todo)
    pool = None
    if cfg.workers == 1:
        init_worker(settings, tokenizer)
        results = map(encode_chunk, stream)
    else:
        ctx = multiprocessing.get_context("spawn" if use_spawn else "fork")
        pool = ctx.Pool(cfg.workers, initializer=init_worker, initargs=(settings,))
        results = ordered_map(pool, encode_chunk, stream, window=2 * cfg.workers + 1)
    current: PartWriter | None = None
    done = done_before
    try:
        for res in results:
            if current is None or current.idx != res.file_idx:
                current = PartWriter(cfg, layout, res.file_idx, paths[res.file_idx], dtype, eod, tokenizer.unk_id)
            current.add(res)
            progress.chunk(res)
            if res.last:
                marker = current.finalize(shash)
                done += 1
                progress.part_done(done, current.path, marker)
                current = None
    except BaseException:
        if current is not None:
            current.abort()
        if pool is not None:
            pool.terminate()
        raise
    if pool is not None:
        pool.close()
        pool.join()


def run(cfg: PreprocessConfig) -> int:
    """Run the whole pipeline; returns the process exit code (0 ok, 1 bad input with --strict, 2 error)."""
    comm = coordination.detect(cfg.output_prefix)
    rank, size = (comm.rank, comm.size) if comm else (0, 1)
    tag = f" rank {rank}/{size}" if comm else ""
    try:
        code = _run(cfg, comm, rank, size, tag)
    except BaseException:
        if comm is not None:
            comm.close(ok=False)
        raise
    if comm is not None:
        comm.close()
    return code


def _run(cfg: PreprocessConfig, comm, rank: int, size: int, tag: str) -> int:
    layout = rs.RunLayout(cfg.output_prefix)

    expand_log = BadInputLog()
    files = expand_inputs(cfg.input, expand_log)
    tokenizer = build_tokenizer(cfg.tokenizer_type, cfg.vocab_file, cfg.tokenizer_model)
    dtype = best_dtype(tokenizer.vocab_size)
    settings = EncodeSettings(
        cfg.tokenizer_type,
        cfg.vocab_file,
        cfg.tokenizer_model,
        tuple(cfg.json_keys),
        cfg.split_sentences,
        cfg.keep_newlines,
        dtype.str,
    )
    shash = rs.settings_hash(cfg.output_settings())
    vocab = {
        "tokenizer_type": cfg.tokenizer_type,
        "vocab_file": cfg.vocab_file and os.path.abspath(cfg.vocab_file),
        "tokenizer_model": cfg.tokenizer_model and os.path.abspath(cfg.tokenizer_model),
        "vocab_size": tokenizer.vocab_size,
        "fingerprint": tokenizer.fingerprint(),
    }

    # rank 0 checks / creates the manifest; everyone learns the outcome
    err = None
    if rank == 0:
        if not files:
            err = f"no input files found in --input {' '.join(cfg.input)}\n{expand_log.format()}"
        else:
            try:  # multistream dumps with an index -> units of streams (rank 0 reads the indexes, once)
                check_outputs(cfg, layout, files)
                unit_bytes = int(cfg.multistream_unit_mb * (1 << 20))
                files = [u for f in files for u in multistream.split_dump(f, unit_bytes)]
                resuming = rs.prepare(layout, shash, files, cfg.resume)
                if resuming:
                    print(f"[preprocess] resuming from {layout.manifest}", file=sys.stderr)
            except (UserError, ValueError) as e:
                err = str(e)
    if comm:
        err, files = comm.bcast((err, files))
    if err:
        if rank == 0:
            print(f"data_pipeline.preprocess: error: {err}", file=sys.stderr)
        return 2

    mine = [(i, p) for i, p in enumerate(files) if i % size == rank]
    todo, skipped = [], 0
    for i, p in mine:
        if cfg.resume and rs.completed_marker(layout, i, p, shash, cfg.json_keys, cfg.level) is not None:
            skipped += 1
        else:
            todo.append((i, p))
    show = cfg.progress if cfg.progress is not None else sys.stderr.isatty()
    progress = _Progress(bool(show) and rank == 0, len(mine), tag)
    if skipped:
        print(
            f"[preprocess{tag}] --resume: {skipped} of {len(mine)} input file(s) already done, skipped", file=sys.stderr
        )
    t0 = time.time()
    local_err = None
    try:
        _process_parts(
            cfg, layout, todo, tokenizer, settings, shash, progress, skipped, use_spawn=comm is not None
        )  # no fork after MPI_Init or with gloo threads running
    except Exception as e:  # reported below, after the other ranks are told
        local_err = f"rank {rank}: {type(e).__name__}: {e}"
        if comm is None:
            progress.close()
            raise
    progress.close()
    if comm:
        errs = comm.gather(local_err)
        code = 0
        if rank == 0:
            errs = [e for e in errs if e]
            code = _finish(cfg, layout, files, shash, expand_log, t0, vocab) if not errs else 2
            for e in errs:
                print(f"data_pipeline.preprocess: error: {e}", file=sys.stderr)
        return comm.bcast(code)
    return _finish(cfg, layout, files, shash, expand_log, t0, vocab)


def check_outputs(cfg: PreprocessConfig, layout: rs.RunLayout, files: list[str]) -> None:
    """The output guard (common/outputs.py): no output is an input; shards of an earlier run under this prefix are
    kept unless --overwrite (or --resume continues an interrupted run). The shards themselves are written to
    temporary names and renamed when complete (IndexedDatasetBuilder)."""
    outs = [layout.final_prefix(k, cfg.level) + e for k in cfg.json_keys for e in (".bin", ".idx")]
    for out in [*outs, layout.report]:
        check_not_input(out, "--output-prefix", [("--input", f) for f in files])
    if not (cfg.resume and os.path.exists(layout.manifest)):
        check_fresh(outs, "--output-prefix", cfg.overwrite)


def _refusal(cfg: PreprocessConfig, totals: dict, vocab: dict) -> str | None:
    """Why the finished run must not become shards: no documents or no tokens (every line malformed, a parquet
    file without the --json-keys column), or only [UNK] tokens (a vocabulary that does not cover the text)."""
    docs = sum(t["documents"] for t in totals.values())
    tokens = sum(t["tokens"] for t in totals.values())
    unk = sum(t.get("unk_tokens", 0) for t in totals.values())
    where = f"--input {' '.join(cfg.input)}"
    if docs == 0 or tokens == 0:
        return (
            f"{where}: {docs} documents, {tokens} tokens: no text was read (see the bad-input report above); check "
            f"--input, --input-format and --json-keys ({' '.join(cfg.json_keys)})"
        )
    if unk == tokens:
        src = cfg.vocab_file or cfg.tokenizer_model
        return (
            f"{where}: all {tokens:,} tokens are [UNK] with {src} ({vocab['vocab_size']} entries): the vocabulary "
            "does not cover this text (special tokens only, or made for another corpus); train one on it with "
            "`python -m data_pipeline.train_tokenizer`"
        )
    return None


def _finish(
    cfg: PreprocessConfig,
    layout: rs.RunLayout,
    files: list[str],
    shash: str,
    expand_log: BadInputLog,
    t0: float,
    vocab: dict,
) -> int:
    """Rank 0: gather part markers, write the report, merge parts in input order (or refuse: --strict with bad
    input, no text, only [UNK]). The report records the vocabulary's fingerprint, which training and
    tools.inspect_dataset compare with the tokenizer they are given."""
    log = BadInputLog()
    log.merge(expand_log)
    totals = {k: {"documents": 0, "sequences": 0, "tokens": 0, "unk_tokens": 0} for k in cfg.json_keys}
    chars = 0
    for i, p in enumerate(files):
        marker = rs.completed_marker(layout, i, p, shash, cfg.json_keys, cfg.level)
        if marker is None:
            print(f"error: part {i} ({p}) is missing or stale after processing; rerun with --resume", file=sys.stderr)
            return 2
        log.merge(marker["bad_input"])
        chars += marker["chars"]
        for k, s in marker["stats"].items():
            for f, v in s.items():
                totals[k][f] += v
    outputs = {k: layout.final_prefix(k, cfg.level) for k in cfg.json_keys}
    report = {
        "inputs": len(files),
        "outputs": outputs,
        "totals": totals,
        "characters": chars,
        "bad_input": log.to_dict(),
        "strict": cfg.strict,
        "seconds": round(time.time() - t0, 3),
        "tokenizer": vocab,
    }
    failed = cfg.strict and log.total > 0
    refused = _refusal(cfg, totals, vocab)
    report["status"] = (
        "failed: bad input with --strict, no shards written"
        if failed
        else (f"failed: {refused}; no shards written" if refused else "ok")
    )
    os.makedirs(os.path.dirname(layout.report) or ".", exist_ok=True)
    rs.write_json_atomic(layout.report, report)
    print(log.format(), file=sys.stderr)
    if refused and not failed:
        rs.finish(layout)
        print(f"data_pipeline.preprocess: error: {refused}; no shards written", file=sys.stderr)
        return 2
    if failed:
        rs.finish(layout)
        print(
            f"error: --strict: {log.total} bad input problem(s); no shards written (report: {layout.report})",
            file=sys.stderr,
        )
        return 1
    dtype = None
    for k, prefix in outputs.items():
        parts = [layout.part_prefix(i, k, cfg.level) for i in range(len(files))]

        dtype = dtype or IndexedDataset(parts[0]).dtype
        with IndexedDatasetBuilder(prefix, dtype) as b:
            for p in parts:
                b.merge_file(p)
    rs.finish(layout)
    dt = time.time() - t0
    for k, t in totals.items():
        print(
            f"[preprocess] {outputs[k]}.bin/.idx: {t['documents']:,} documents, {t['sequences']:,} "
            f"{cfg.level}s, {t['tokens']:,} tokens ({chars / 1e6 / max(dt, 1e-9):.2f} MB/s, "
            f"{t['tokens'] / max(dt, 1e-9):,.0f} tokens/s); report: {layout.report}",
            file=sys.stderr,
        )
    return 0


class PreprocessArgsError(UserError, ValueError):
    """A bad flag value (the message names it)."""


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("data_pipeline.preprocess", _main, argv)


def _main(argv: Sequence[str]) -> int:
    try:
        cfg = config_from_args(argv)
    except ValueError as e:
        raise PreprocessArgsError(str(e)) from None
    return run(cfg)


if __name__ == "__main__":
    exit_process(main())  # no interpreter finalization under srun's gloo group (see exit_process)
