"""``python -m data_pipeline.train_tokenizer``: a WordPiece vocab or a SentencePiece model from raw inputs.

Reads the same inputs, formats and cleaning as ``data_pipeline.preprocess`` (so a user without a
vocabulary can start from the corpus itself) and trains with the libraries that own the algorithms:
Hugging Face ``tokenizers`` (WordPiece, BERT normaliser and pre-tokeniser) or ``sentencepiece``
(unigram / BPE). Special tokens are always [PAD] [UNK] [CLS] [SEP] [MASK], so ``build_tokenizer``
finds them. Output: ``vocab.txt`` (WordPiece, for ``--vocab-file``) or ``spm.model``/``spm.vocab``
(for ``--tokenizer-model``), plus ``tokenizer_meta.json`` saying how it was made.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import unicodedata
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

from common.error_exit import run_entry
from common.errors import UserError
from common.outputs import check_dir_writable, check_fresh, check_not_input
from data_pipeline.readers import FORMATS, KIND_WIKITEXT, BadInputLog, expand_inputs, read_documents
from data_pipeline.text import split_lines
from data_pipeline.wikitext import wikitext_to_text

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MODEL_TYPES = ("wordpiece", "unigram", "bpe")


class TrainTokenizerError(UserError, ValueError):
    """Bad input or output of a tokenizer training run; nothing was written."""


@dataclass
class TrainTokenizerConfig:
    """One tokenizer training run; validated on construction."""

    input: list[str]
    """Files, directories and globs (any format ``preprocess`` reads)."""
    output_dir: str
    """Where vocab.txt / spm.model and tokenizer_meta.json are written."""
    model_type: str = "wordpiece"
    """wordpiece (vocab.txt for BertWordPiece*), unigram or bpe (SentencePiece .model)."""
    vocab_size: int = 30522
    """Target vocabulary size including special tokens (BERT: 30,522)."""
    lowercase: bool = True
    """WordPiece only: lower-case and strip accents (use with BertWordPieceLowerCase)."""
    json_keys: list[str] = field(default_factory=lambda: ["text"])
    """Fields of JSON/parquet inputs to read."""
    input_format: str = "auto"
    """Input format, or auto-detect per file."""
    min_frequency: int = 2
    """WordPiece: minimum count of a merged piece."""
    max_lines: int = 0
    """Stop after this many paragraphs (0 = all); bounds time and memory on big corpora."""
    character_coverage: float = 0.9995
    """SentencePiece: share of characters the model must cover."""
    overwrite: bool = False
    """Replace the vocab.txt / spm.model and tokenizer_meta.json that --output-dir already holds."""

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"--model-type {self.model_type!r}: choose one of {', '.join(MODEL_TYPES)}")
        if self.vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"--vocab-size {self.vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens")
        if self.input_format not in FORMATS:
            raise ValueError(f"--input-format {self.input_format!r}: choose one of {', '.join(FORMATS)}")
        if not 0 < self.character_coverage <= 1:
            raise ValueError("--character-coverage must be in (0, 1]")


def iter_paragraphs(cfg: TrainTokenizerConfig, log: BadInputLog, files: Sequence[str] | None = None) -> Iterator[str]:
    """Cleaned paragraphs of every document, in input order (what the tokenizer trains on). ``files``: the
    expanded inputs (default: expand ``cfg.input``)."""
    n = 0
    for path in expand_inputs(cfg.input, log) if files is None else files:
        for doc in read_documents(path, cfg.input_format, cfg.json_keys, log):
            for text in doc.texts.values():
                if doc.kind == KIND_WIKITEXT:
                    text = wikitext_to_text(text)
                for p in split_lines(text):
                    yield p
                    n += 1
                    if cfg.max_lines and n >= cfg.max_lines:
                        return


def _splits_alone(c: str) -> bool:
    """Whether BERT's pre-tokenizer always makes ``c`` a word of its own (whitespace, punctuation as
    tokenizers' ``is_bert_punc`` defines it, CJK ideographs), so that no ``##c`` piece can occur."""
    cp = ord(c)
    if c.isspace() or (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126):
        return True
    if unicodedata.category(c).startswith("P"):
        return True
    return any(lo <= cp <= hi for lo, hi in _CJK)


#: CJK ideograph blocks that BERT's normaliser surrounds with spaces (handle_chinese_chars).
_CJK = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)


def wordpiece_alphabet(
    cfg: TrainTokenizerConfig, char_counts: Counter, limit: int = 1000
) -> tuple[list[str], list[str]]:
    """The alphabet (the ``limit`` most frequent normalised characters, ties by code point) and its ``##``
    continuation pieces, fixed before training.

    Why: Hugging Face's WordPiece trainer (tokenizers 0.23, huggingface/tokenizers#1794) gives the ``##c`` pieces
    their ids while iterating a hash map of the words, in an order that changes from run to run, and breaks ties
    between equally frequent merges by those ids: the same corpus gave vocabularies differing in 250-320 of 1,528
    ids. Registered up front (after the special tokens, in sorted order), the pieces keep fixed ids and every
    merge is decided the same way. RAYON_NUM_THREADS=1 does not help (the order is the hash map's, not the threads')."""
    chars = sorted((c for c in char_counts if not c.isspace()), key=lambda c: (-char_counts[c], c))[:limit]
    alphabet = sorted(chars)
    return alphabet, ["##" + c for c in alphabet if not _splits_alone(c)]


def train_wordpiece(cfg: TrainTokenizerConfig, texts: Iterator[str], workdir: str) -> tuple[str, int]:
    """Train into ``workdir``; returns (vocab.txt path, paragraphs read). The corpus is written once to a text file
    (one paragraph a line) while its normalised characters are counted, then trained on from that file."""
    from tokenizers import BertWordPieceTokenizer
    from tokenizers.normalizers import BertNormalizer

    strip = cfg.lowercase or None
    norm = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=strip, lowercase=cfg.lowercase)
    counts: Counter = Counter()
    corpus = os.path.join(workdir, "corpus.txt")
    n = 0
    with open(corpus, "w", encoding="utf-8") as f:
        for p in texts:
            f.write(p.replace("\n", " ") + "\n")
            counts.update(norm.normalize_str(p))
            n += 1
    alphabet, pieces = wordpiece_alphabet(cfg, counts)
    if n == 0 or not alphabet:
        return "", n
    tok = BertWordPieceTokenizer(
        lowercase=cfg.lowercase, strip_accents=strip, clean_text=True, handle_chinese_chars=True
    )
    tok.train(
        [corpus],
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        limit_alphabet=len(alphabet),
        initial_alphabet=alphabet,
        special_tokens=SPECIAL_TOKENS + pieces,
        show_progress=False,
        wordpieces_prefix="##",
    )
    os.remove(corpus)
    tok.save_model(workdir)  # vocab.txt, one token per line in id order
    return os.path.join(workdir, "vocab.txt"), n


def train_sentencepiece(cfg: TrainTokenizerConfig, texts: Iterator[str], workdir: str) -> tuple[str, int]:
    """Train into ``workdir``; returns (spm.model path, paragraphs read)."""
    import sentencepiece as spm

    first = next(texts, None)
    if first is None:
        return "", 0
    n = [1]

    def counted() -> Iterator[str]:
        yield first
        for p in texts:
            n[0] += 1
            yield p

    prefix = os.path.join(workdir, "spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=counted(),
        model_prefix=prefix,
        model_type=cfg.model_type,
        vocab_size=cfg.vocab_size,
        character_coverage=cfg.character_coverage,
        pad_id=0,
        unk_id=1,
        bos_id=-1,
        eos_id=-1,
        pad_piece="[PAD]",
        unk_piece="[UNK]",
        control_symbols=["[CLS]", "[SEP]", "[MASK]"],
        hard_vocab_limit=False,
        minloglevel=2,
        num_threads=1,
        max_sentence_length=1 << 16,
    )
    return prefix + ".model", n[0]


def output_files(cfg: TrainTokenizerConfig) -> list[str]:
    """The files a run writes into ``--output-dir``."""
    names = ["vocab.txt"] if cfg.model_type == "wordpiece" else ["spm.model", "spm.vocab"]
    return [os.path.join(cfg.output_dir, n) for n in [*names, "tokenizer_meta.json"]]


def train(cfg: TrainTokenizerConfig) -> str:
    """Train and write the tokenizer; returns the path to pass as --vocab-file / --tokenizer-model.

    Refused (TrainTokenizerError, nothing written): an --input that matches nothing, an output file that is an
    input, existing outputs without --overwrite, a corpus without text. The files are written into a hidden
    directory inside --output-dir and renamed into place at the end (common/outputs.py)."""
    log = BadInputLog()
    files = expand_inputs(cfg.input, log)
    missing = log.examples.get("missing_input", [])
    if missing:
        ex = missing[0]
        raise TrainTokenizerError(
            f"--input {ex['file']}: {ex['detail']} ({log.counts['missing_input']} input(s) not found); "
            "check the spelling"
        )
    outs = output_files(cfg)
    for out in outs:
        check_not_input(out, "--output-dir", [("--input", f) for f in files])
    check_fresh(outs, "--output-dir", cfg.overwrite)
    check_dir_writable(cfg.output_dir, "--output-dir")
    workdir = tempfile.mkdtemp(prefix=".train_tokenizer.", dir=cfg.output_dir)
    try:
        texts = iter_paragraphs(cfg, log, files)
        trainer = train_wordpiece if cfg.model_type == "wordpiece" else train_sentencepiece
        built, paragraphs = trainer(cfg, texts, workdir)
        if log.total:
            print(log.format(), file=sys.stderr)
        if not built:
            seen = "; see the bad-input report above" if log.total else ""
            raise TrainTokenizerError(
                f"--input {' '.join(cfg.input)}: no text found ({paragraphs} paragraphs{seen}); a vocabulary of "
                "special tokens only would map every word to [UNK]. Check --input, --input-format and --json-keys"
            )
        final = os.path.join(cfg.output_dir, os.path.basename(built))
        meta = {
            "config": asdict(cfg),
            "file": os.path.basename(built),
            "paragraphs": paragraphs,
            "bad_input": log.to_dict(),
            "use_with": (
                "--tokenizer-type "
                + ("BertWordPieceLowerCase" if cfg.lowercase else "BertWordPieceCase")
                + f" --vocab-file {final}"
            )
            if cfg.model_type == "wordpiece"
            else f"--tokenizer-type SentencePieceTokenizer --tokenizer-model {final}",
        }
        with open(os.path.join(workdir, "tokenizer_meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        for out in outs:  # the tokenizer files first, the meta file last
            os.replace(os.path.join(workdir, os.path.basename(out)), out)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return final


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m data_pipeline.train_tokenizer",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--input", nargs="+", required=True)
    p.add_argument("--output-dir", required=True)
    p.add_argument("--model-type", default="wordpiece", choices=MODEL_TYPES)
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--cased", dest="lowercase", action="store_false", help="WordPiece: keep case and accents")
    p.add_argument("--json-keys", nargs="+", default=["text"])
    p.add_argument("--input-format", default="auto", choices=FORMATS)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--max-lines", type=int, default=0)
    p.add_argument("--character-coverage", type=float, default=0.9995)
    p.add_argument("--overwrite", action="store_true", help="replace the tokenizer files --output-dir already holds")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("data_pipeline.train_tokenizer", _main, argv)


def _main(argv: Sequence[str]) -> int:
    try:
        cfg = TrainTokenizerConfig(**vars(build_parser().parse_args(argv)))
    except ValueError as e:
        raise TrainTokenizerError(str(e)) from None
    out = train(cfg)
    print(f"[train_tokenizer] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
