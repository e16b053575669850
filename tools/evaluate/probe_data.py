"""Two probe tasks in GLUE's file format, made from the documents a pretraining run held out (its validation split):
can fine-tuning tell a model that learned the language from one that did not?

    python -m tools.evaluate.probe_data --corpus run_scripts/sample_data/corpus --output-dir out/probe \
        --data-path out/quickstart/data/sample_text_sentence

writes ``probe_pair/{train,dev}.tsv`` (MRPC's layout) and ``probe_single/{train,dev}.tsv`` (SST-2's layout) under
``--output-dir``, and ``probe_data.json`` (which documents went where, the counts).

- The documents: the corpus read exactly as ``data_pipeline.preprocess`` reads it (same file order, same readers,
  same cleaning and sentence cuts), so document k here is document k of the shard; the held-out ones are the
  pretraining ``--split``'s validation range (contiguous, as the trainer computes it: the trainer samples only the
  train range). ``--data-path`` checks this against the shard itself (document count, sentences per held-out
  document). Those documents are then divided, whole, into the probes' train and dev documents (disjoint).
- probe_pair (label 1: ``#1 String`` is the sentence as written and ``#2 String`` the same sentence with its inner
  words permuted; label 0: the other way round): a minimal pair, as BLiMP (Warstadt et al., 2020) scores language
  models, in MRPC's layout. Each sentence gives both rows, so every string occurs once under each label and once on
  each side, and both sides hold the same words: only word order, judged on both sides, tells the label. (A "does B
  follow A in its document" pair task was tried first: on the quickstart's templated sample text a random-init
  model learned it as well as the pretrained one, docs/troubleshooting.md.)
- probe_single (label 1: the sentence as written; 0: its inner words permuted, all of them by default, or ``window``
  consecutive ones): each sentence of at least ``min_words`` words appears once intact and once shuffled (the first
  and the last word stay in place, so capitals and the final punctuation give nothing away). The two have the same
  words and length: only word order tells them apart. All inner words by default: a 3-word window was too subtle for
  the quickstart's 2-layer, 300-step model to show in a few seconds of fine-tuning (about 53% against 50% for
  random-init); a full shuffle breaks every local word order the masked-LM objective learned. Given enough
  fine-tuning steps a random-init model learns this too on the templated sample text: what pretraining buys at the
  quickstart's budget is learning it in fewer steps (measurements: docs/troubleshooting.md).
Sentences of the dev documents that occur verbatim in the train documents are left out of probe_single's dev set (a
model could recall them rather than judge them); the same holds for probe_pair. The two tasks shuffle each sentence
independently (separate draws).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from common.cli import HelpFormatter, add_flags
from common.error_exit import run_entry
from common.errors import UserError, write_errors
from common.outputs import atomic_dir, atomic_file, check_fresh
from data_pipeline.data_config import parse_split, split_document_ranges
from data_pipeline.encode import _sentences, doc_text  # the shards' own cleaning and sentence cuts
from data_pipeline.readers import BadInputLog, expand_inputs, read_documents

PAIR_DIR, SINGLE_DIR = "probe_pair", "probe_single"
"""Directory names under --output-dir: the registry keys of tools/evaluate/tasks.py, as its TSV reader looks them
up."""
PAIR_HEADER = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")
"""MRPC's train.tsv / dev.tsv columns (Quality 1 = B follows A)."""
SINGLE_HEADER = ("sentence", "label")
"""SST-2's train.tsv / dev.tsv columns (label 1 = the sentence as written)."""
SPLIT_FILES = {"train": "train.tsv", "dev": "dev.tsv"}


class ProbeDataError(UserError):
    """The corpus does not give the probe tasks (no held-out documents, a shard that does not match)."""


@dataclass
class ProbeDataConfig:
    """Where the held-out documents come from and how the probe tasks are cut from them."""

    corpus: list[str]
    """The pretraining text as given to data_pipeline.preprocess --input (files, directories, globs; same order)."""
    output_dir: str
    """Where probe_pair/ and probe_single/ (train.tsv, dev.tsv) and probe_data.json go."""
    split: str = "949,50,1"
    """The pretraining run's --split: its validation documents (never trained on) are the probes' text."""
    data_path: str | None = None
    """The shard prefix the model pretrained on (preprocess --output-prefix + _text_sentence): checks that document
    k here is document k there (count, sentences per held-out document) before anything is written."""
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    """preprocess --json-keys: the key whose shard was pretrained on comes first (only it is read)."""
    dev_fraction: float = 0.34
    """Share of the held-out documents (whole documents) that become the dev set; the rest train."""
    window: int | None = None
    """Both tasks: consecutive inner words permuted in a shuffled sentence; None = all of them (the first and the
    last word stay)."""
    min_words: int = 6
    """Both tasks: shorter sentences (headings such as "History.") are left out."""
    seed: int = 1234
    """Seed of the train/dev documents, the negatives' order and the shuffles (same seed, same files)."""
    overwrite: bool = False
    """Replace probe_pair/ and probe_single/ if they exist."""

    def __post_init__(self) -> None:
        if not self.corpus:
            raise ValueError("--corpus: give the pretraining text (files, directories or globs)")
        parse_split(self.split)  # raises on a malformed split
        if not 0 < self.dev_fraction < 1:
            raise ValueError(f"--dev-fraction must be in (0, 1), got {self.dev_fraction}")
        if self.window is not None and self.window < 2:
            raise ValueError(f"--window must be at least 2 (words permuted), got {self.window}")
        least = (self.window or 2) + 2
        if self.min_words < least:
            raise ValueError(f"--min-words must be at least {least} (the words permuted + the first and the last), "
                             f"got {self.min_words}")  # fmt: skip


@dataclass
class HeldOutDoc:
    """One held-out document: its index in the shard, where the reader found it, its sentences."""

    index: int
    where: str
    sentences: list[str]


def read_corpus(corpus: Sequence[str], key: str = "text") -> list[tuple[str, list[str]]]:
    """Every document of the corpus as preprocess sees it: (file and place, sentences), in shard order. A document
    that cleans to nothing is kept (as an empty one), as the shard keeps it."""
    log = BadInputLog()
    files = expand_inputs(list(corpus), log)
    docs = []
    for path in files:
        for raw in read_documents(path, "auto", [key], log):
            text = raw.texts.get(key, "")
            docs.append((f"{path}: {raw.where}", _sentences(doc_text(text, raw.kind), False) if text else []))
    if "missing_input" in log.counts:
        raise ProbeDataError(f"--corpus: {log.format()}")
    return docs


def held_out_documents(cfg: ProbeDataConfig) -> tuple[list[HeldOutDoc], int]:
    """The validation documents of ``cfg.split`` (and the corpus's document count), checked against the shard."""
    docs = read_corpus(cfg.corpus, cfg.json_keys[0])
    _, (v0, v1), _ = split_document_ranges(len(docs), cfg.split)
    if v1 - v0 < 2:
        raise ProbeDataError(
            f"--split {cfg.split}: {v1 - v0} validation document(s) among the corpus's {len(docs)}; the probes need "
            "at least 2 (one to train on, one to score): give a split with a larger validation share"
        )
    held = [HeldOutDoc(k, docs[k][0], docs[k][1]) for k in range(v0, v1)]
    if cfg.data_path is not None:
        _check_shard(cfg.data_path, len(docs), held)
    return held, len(docs)


def _check_shard(prefix: str, num_documents: int, held: Sequence[HeldOutDoc]) -> None:
    from data_pipeline.indexed import IndexedDataset

    try:
        ds = IndexedDataset(prefix)
    except (OSError, ValueError) as e:
        raise ProbeDataError(f"--data-path {prefix}: cannot read the shard ({e})") from None
    if ds.num_documents != num_documents:
        raise ProbeDataError(
            f"--data-path {prefix} holds {ds.num_documents} documents, --corpus gives {num_documents}: the shard was "
            "not made from this corpus (give the --input of its preprocess run, in the same order)"
        )
    for doc in held:
        n = int(ds.document_indices[doc.index + 1] - ds.document_indices[doc.index])
        if n != len(doc.sentences):
            raise ProbeDataError(
                f"--data-path {prefix}: document {doc.index} ({doc.where}) has {n} sentences there and "
                f"{len(doc.sentences)} here: the shard was not made from this corpus with --split-sentences"
            )


def split_documents(held: Sequence[HeldOutDoc], dev_fraction: float, rng: random.Random) -> tuple[list, list]:
    """Whole documents, drawn at random: (train documents, dev documents), each in shard order, never empty."""
    order = list(range(len(held)))
    rng.shuffle(order)
    n_dev = min(len(held) - 1, max(1, round(dev_fraction * len(held))))
    dev = set(order[:n_dev])
    return [d for i, d in enumerate(held) if i not in dev], [d for i, d in enumerate(held) if i in dev]


def pair_rows(
    docs: Sequence[HeldOutDoc], window: int | None, min_words: int, rng: random.Random, exclude: set[str] = frozenset()
) -> list[tuple[str, str, str, str, str]]:
    """MRPC rows (Quality, #1 ID, #2 ID, #1 String, #2 String): each long enough sentence and its shuffled twin, in
    both orders (Quality 1 when #1 is the sentence as written)."""
    rows = []
    for d in docs:
        for i, s in enumerate(d.sentences):
            if len(s.split()) < min_words or s in exclude:
                continue
            shuffled = shuffle_words(s, window, rng)
            if shuffled is None:
                continue
            intact, twin = f"d{d.index}s{i}", f"d{d.index}s{i}x"
            rows += [("1", intact, twin, s, shuffled), ("0", twin, intact, shuffled, s)]
    rng.shuffle(rows)
    return rows


def shuffle_words(sentence: str, window: int | None, rng: random.Random) -> str | None:
    """The sentence with ``window`` consecutive inner words (None: all inner words; never the first or the last)
    permuted so that the text changes; None when no window of it can change (e.g. repeated words)."""
    words = sentence.split()
    if window is None:
        window = len(words) - 2
    starts = list(range(1, len(words) - window))
    rng.shuffle(starts)
    for a in starts:
        piece = words[a : a + window]
        if len(set(piece)) < 2:
            continue
        while True:
            perm = rng.sample(piece, len(piece))
            if perm != piece:
                return " ".join(words[:a] + perm + words[a + window :])
    return None


def single_rows(
    docs: Sequence[HeldOutDoc], window: int | None, min_words: int, rng: random.Random, exclude: set[str] = frozenset()
) -> list[tuple[str, str]]:
    """SST-2 rows (sentence, label): each long enough sentence intact (1) and with a window of words permuted (0)."""
    rows = []
    for d in docs:
        for s in d.sentences:
            if len(s.split()) < min_words or s in exclude:
                continue
            shuffled = shuffle_words(s, window, rng)
            if shuffled is not None:
                rows += [(s, "1"), (shuffled, "0")]
    rng.shuffle(rows)
    return rows


def _write_tsv(path: Path, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    for r in rows:
        for cell in r:
            if "\t" in cell or "\n" in cell:  # sentences come from cleaned lines: whitespace is single spaces
                raise ProbeDataError(f"{path}: a sentence holds a tab or newline ({cell[:60]!r})")
    # GLUE's TSVs quote nothing (quotes are text); the readers use csv with QUOTE_NONE
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.writelines("\t".join(r) + "\n" for r in [tuple(header), *rows])


def make_probes(cfg: ProbeDataConfig) -> dict[str, Any]:
    """Read the held-out documents, cut both tasks, write them (each task directory in one rename); returns the
    manifest also written to probe_data.json."""
    out = Path(cfg.output_dir)
    check_fresh([out / PAIR_DIR, out / SINGLE_DIR], "--output-dir", cfg.overwrite)
    held, total = held_out_documents(cfg)
    rng = random.Random(cfg.seed)
    train_docs, dev_docs = split_documents(held, cfg.dev_fraction, rng)
    seen = {s for d in train_docs for s in d.sentences}
    tables = {
        PAIR_DIR: (
            PAIR_HEADER,
            {
                "train": pair_rows(train_docs, cfg.window, cfg.min_words, rng),
                "dev": pair_rows(dev_docs, cfg.window, cfg.min_words, rng, exclude=seen),
            },
        ),
        SINGLE_DIR: (
            SINGLE_HEADER,
            {
                "train": single_rows(train_docs, cfg.window, cfg.min_words, rng),
                "dev": single_rows(dev_docs, cfg.window, cfg.min_words, rng, exclude=seen),
            },
        ),
    }
    for task, (_, splits) in tables.items():
        for split, rows in splits.items():
            if not rows:
                raise ProbeDataError(
                    f"--corpus: the {split} documents give no {task} examples (too few or too short sentences); "
                    "hold out more documents (--split) or lower --min-words"
                )
    manifest = {
        "config": asdict(cfg),
        "corpus_documents": total,
        "held_out_documents": [held[0].index, held[-1].index + 1],
        "train_documents": [d.index for d in train_docs],
        "dev_documents": [d.index for d in dev_docs],
        "examples": {
            task: {
                split: {"total": len(rows), "label_1": sum(r[0 if task == PAIR_DIR else 1] == "1" for r in rows)}
                for split, rows in splits.items()
            }
            for task, (_, splits) in tables.items()
        },  # fmt: skip
    }
    with write_errors(f"--output-dir {out}", out):
        for task, (header, splits) in tables.items():
            with atomic_dir(out / task) as tmp:
                for split, rows in splits.items():
                    _write_tsv(tmp / SPLIT_FILES[split], header, rows)
        with atomic_file(out / "probe_data.json") as tmp:
            tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def build_parser() -> argparse.ArgumentParser:
    """One flag per :class:`ProbeDataConfig` field."""
    p = argparse.ArgumentParser(
        prog="python -m tools.evaluate.probe_data", description=__doc__, formatter_class=HelpFormatter
    )
    add_flags(p, ProbeDataConfig)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2."""
    return run_entry("tools.evaluate.probe_data", _main, argv)


def _main(argv: Sequence[str]) -> int:
    ns = build_parser().parse_args(argv)
    try:
        cfg = ProbeDataConfig(**vars(ns))
    except ValueError as e:
        raise UserError(str(e)) from None
    m = make_probes(cfg)
    ex = m["examples"]
    print(
        f"[probe_data] held-out documents {m['held_out_documents'][0]}..{m['held_out_documents'][1] - 1} of "
        f"{m['corpus_documents']} ({len(m['train_documents'])} train, {len(m['dev_documents'])} dev) -> "
        f"{cfg.output_dir}: {PAIR_DIR} {ex[PAIR_DIR]['train']['total']}/{ex[PAIR_DIR]['dev']['total']}, "
        f"{SINGLE_DIR} {ex[SINGLE_DIR]['train']['total']}/{ex[SINGLE_DIR]['dev']['total']} train/dev examples"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
