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
import sys
from dataclasses import asdict, dataclass, field
from typing import Iterator, Sequence

from data_pipeline.readers import FORMATS, KIND_WIKITEXT, BadInputLog, expand_inputs, read_documents
from data_pipeline.text import split_lines
from data_pipeline.wikitext import wikitext_to_text

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
MODEL_TYPES = ("wordpiece", "unigram", "bpe")


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

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"--model-type {self.model_type!r}: choose one of {', '.join(MODEL_TYPES)}")
        if self.vocab_size <= len(SPECIAL_TOKENS):
            raise ValueError(f"--vocab-size {self.vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens")
        if self.input_format not in FORMATS:
            raise ValueError(f"--input-format {self.input_format!r}: choose one of {', '.join(FORMATS)}")
        if not 0 < self.character_coverage <= 1:
            raise ValueError("--character-coverage must be in (0, 1]")


def iter_paragraphs(cfg: TrainTokenizerConfig, log: BadInputLog) -> Iterator[str]:
    """Cleaned paragraphs of every document, in input order (what the tokenizer trains on)."""
    n = 0
    for path in expand_inputs(cfg.input, log):
        for doc in read_documents(path, cfg.input_format, cfg.json_keys, log):
            for text in doc.texts.values():
                if doc.kind == KIND_WIKITEXT:
                    text = wikitext_to_text(text)
                for p in split_lines(text):
                    yield p
                    n += 1
                    if cfg.max_lines and n >= cfg.max_lines:
                        return


def train_wordpiece(cfg: TrainTokenizerConfig, texts: Iterator[str]) -> str:
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(
        lowercase=cfg.lowercase, strip_accents=cfg.lowercase or None, clean_text=True, handle_chinese_chars=True
    )
    tok.train_from_iterator(
        texts,
        vocab_size=cfg.vocab_size,
        min_frequency=cfg.min_frequency,
        special_tokens=SPECIAL_TOKENS,
        limit_alphabet=1000,
        wordpieces_prefix="##",
    )
    os.makedirs(cfg.output_dir, exist_ok=True)
    tok.save_model(cfg.output_dir)  # vocab.txt, one token per line in id order
    return os.path.join(cfg.output_dir, "vocab.txt")


def train_sentencepiece(cfg: TrainTokenizerConfig, texts: Iterator[str]) -> str:
    import sentencepiece as spm

    os.makedirs(cfg.output_dir, exist_ok=True)
    prefix = os.path.join(cfg.output_dir, "spm")
    spm.SentencePieceTrainer.train(
        sentence_iterator=texts,
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
    return prefix + ".model"


def train(cfg: TrainTokenizerConfig) -> str:
    """Train and write the tokenizer; returns the path to pass as --vocab-file / --tokenizer-model."""
    log = BadInputLog()
    texts = iter_paragraphs(cfg, log)
    out = train_wordpiece(cfg, texts) if cfg.model_type == "wordpiece" else train_sentencepiece(cfg, texts)
    meta = {
        "config": asdict(cfg),
        "file": os.path.basename(out),
        "bad_input": log.to_dict(),
        "use_with": (
            "--tokenizer-type "
            + ("BertWordPieceLowerCase" if cfg.lowercase else "BertWordPieceCase")
            + f" --vocab-file {out}"
        )
        if cfg.model_type == "wordpiece"
        else f"--tokenizer-type SentencePieceTokenizer --tokenizer-model {out}",
    }
    with open(os.path.join(cfg.output_dir, "tokenizer_meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    if log.total:
        print(log.format(), file=sys.stderr)
    return out


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
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = TrainTokenizerConfig(**vars(build_parser().parse_args(argv)))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = train(cfg)
    print(f"[train_tokenizer] wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
