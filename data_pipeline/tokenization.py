"""Tokenizers behind one small interface, built by Megatron's ``--tokenizer-type`` names.

Every tokenizer exposes its special-token ids (``cls_id``, ``sep_id``, ``pad_id``, ``mask_id``,
``unk_id``), so nothing downstream hard-codes BERT's 101/102/103, and ``word_start_mask()`` for
whole-word masking (WordPiece ``##`` continuation pieces, SentencePiece ``▁`` word starts).

WordPiece uses Hugging Face ``tokenizers`` through ``transformers.BertTokenizerFast`` so ids are
identical to ``BertTokenizerFast(vocab_file)(text, add_special_tokens=False)``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from common.errors import UserError

TOKENIZER_TYPES = ("BertWordPieceLowerCase", "BertWordPieceCase", "SentencePieceTokenizer", "HuggingFaceTokenizer")

#: Candidate spellings of each special token, first match wins (BERT style, then SentencePiece style).
_SPECIAL_SPELLINGS = {
    "cls": ("[CLS]", "<cls>", "<s>"),
    "sep": ("[SEP]", "<sep>", "</s>"),
    "pad": ("[PAD]", "<pad>"),
    "mask": ("[MASK]", "<mask>"),
    "unk": ("[UNK]", "<unk>"),
}


class TokenizerError(UserError, ValueError):
    """A tokenizer file is missing or lacks a required special token."""


@dataclass
class SpecialIds:
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    unk_id: int


class Tokenizer:
    """Base class: subclasses set ``vocab_size``, the special ids and ``_backend`` methods."""

    name: str
    vocab_size: int
    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    unk_id: int

    def _set_special(self, sp: SpecialIds) -> None:
        """The special ids a vocabulary gave (``_find_special``), as this tokenizer's attributes."""
        self.cls_id, self.sep_id, self.pad_id, self.mask_id, self.unk_id = (
            sp.cls_id,
            sp.sep_id,
            sp.pad_id,
            sp.mask_id,
            sp.unk_id,
        )

    # -- to implement --------------------------------------------------------------------------

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:  # pragma: no cover - abstract
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def id_to_token(self, i: int) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def save(self, directory: str | os.PathLike) -> list[str]:  # pragma: no cover - abstract
        """Write the files a Hugging Face tokenizer needs into ``directory``; return their names."""
        raise NotImplementedError

    def encode_batch_with_starts(self, texts: Sequence[str]) -> list[tuple[list[int], np.ndarray]] | None:
        """Ids and each token's start character offset, or None if this tokenizer cannot give offsets.
        Lets a caller tokenise a document once and map character positions (e.g. sentence starts) to tokens."""
        return None

    # -- shared --------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return self.encode_batch([text])[0]

    @property
    def eod_id(self) -> int:
        """Id appended by ``--append-eod`` (Megatron's BERT tokenizers use [SEP])."""
        return self.sep_id

    @property
    def special_ids(self) -> np.ndarray:
        return np.array(sorted({self.cls_id, self.sep_id, self.pad_id, self.mask_id, self.unk_id}), dtype=np.int64)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.id_to_token(int(i)) for i in ids]

    def fingerprint(self) -> str:
        """16 hex digits of sha256 over the tokens in id order: what ties shards to the vocabulary they were made
        with (preprocess records it in the report; training and tools.inspect_dataset compare it). The same ids
        give the same fingerprint whatever file they came from."""
        h = hashlib.sha256()
        for i in range(self.vocab_size):
            h.update(str(self.id_to_token(i)).encode("utf-8", "surrogatepass") + b"\0")
        return h.hexdigest()[:16]

    def word_start_mask(self) -> np.ndarray:  # pragma: no cover - abstract
        """Boolean ``[vocab_size]``: True where a token begins a new word."""
        raise NotImplementedError


def _find_special(lookup, vocab_desc: str) -> SpecialIds:
    found = {}
    for key, spellings in _SPECIAL_SPELLINGS.items():
        for s in spellings:
            i = lookup(s)
            if i is not None:
                found[key] = i
                break
        else:
            raise TokenizerError(
                f"{vocab_desc}: no {key.upper()} token (looked for {', '.join(spellings)}); "
                f"train one with `python -m data_pipeline.train_tokenizer`, which adds them"
            )
    return SpecialIds(found["cls"], found["sep"], found["pad"], found["mask"], found["unk"])


class HFTokenizer(Tokenizer):
    """Any Hugging Face fast tokenizer (WordPiece vocab.txt or tokenizer.json / tokenizer directory).

    Encoding runs on the ``tokenizers`` backend. The ``transformers`` object (``.hf``, used for
    ``save_pretrained``) is built lazily: importing transformers costs seconds per process, which would
    dominate short preprocessing runs and every worker's start-up.
    """

    def __init__(self, backend, name: str, source: str, hf_tokenizer=None, hf_factory=None) -> None:
        self._hf = hf_tokenizer
        self._hf_factory = hf_factory
        self.name = name
        self.source = source
        self._fast = backend
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size = len(hf_tokenizer) if hf_tokenizer is not None else len(vocab)
        sp = _find_special(vocab.get, source)
        self._set_special(sp)
        self._id_to_token = [""] * self.vocab_size
        for tok, i in vocab.items():
            if i < self.vocab_size:
                self._id_to_token[i] = tok
        self._is_wordpiece = type(self._fast.model).__name__ == "WordPiece"
        self._encode = getattr(self._fast, "encode_batch_fast", self._fast.encode_batch)

    @property
    def hf(self):
        """The ``transformers`` tokenizer (built on first use)."""
        if self._hf is None:
            self._hf = self._hf_factory()
        return self._hf

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # encode_batch_fast (tokenizers >= 0.20) skips offset tracking: same ids, ~20% faster
        encs = self._encode(list(texts), add_special_tokens=False)
        return [e.ids for e in encs]

    def encode_batch_with_starts(self, texts: Sequence[str]) -> list[tuple[list[int], np.ndarray]]:
        encs = self._fast.encode_batch(list(texts), add_special_tokens=False)
        out = []
        for e in encs:
            offs = np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2)
            out.append((e.ids, offs[:, 0]))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        return self._fast.decode([int(i) for i in ids], skip_special_tokens=False)

    def id_to_token(self, i: int) -> str:
        return self._id_to_token[i]

    def word_start_mask(self) -> np.ndarray:
        if self._is_wordpiece:
            return np.array([not t.startswith("##") for t in self._id_to_token], dtype=bool)
        # byte-level BPE / unigram / metaspace: a word starts with the marker
        return np.array([t.startswith(("▁", "Ġ")) or t.startswith("[") for t in self._id_to_token], dtype=bool)

    def save(self, directory: str | os.PathLike) -> list[str]:
        return list(self.hf.save_pretrained(str(directory)))


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model (unigram or BPE) with BERT-style special pieces."""

    def __init__(self, model_file: str) -> None:
        import sentencepiece as spm

        if not model_file or not os.path.isfile(model_file):
            raise TokenizerError(f"--tokenizer-model {model_file!r}: SentencePiece model file not found")
        self.model_file = model_file
        self.name = "SentencePieceTokenizer"
        self.sp = spm.SentencePieceProcessor(model_file=model_file)
        self.vocab_size = self.sp.get_piece_size()

        def lookup(piece: str):
            i = self.sp.piece_to_id(piece)
            return i if self.sp.id_to_piece(i) == piece else None

        sp = _find_special(lookup, model_file)
        self._set_special(sp)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        return self.sp.decode([int(i) for i in ids])

    def id_to_token(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def word_start_mask(self) -> np.ndarray:
        mask = np.zeros(self.vocab_size, dtype=bool)
        for i in range(self.vocab_size):
            p = self.sp.id_to_piece(i)
            mask[i] = p.startswith("▁") or self.sp.is_control(i) or self.sp.is_unknown(i) or p.startswith("[")
        return mask

    def save(self, directory: str | os.PathLike) -> list[str]:
        import shutil

        Path(directory).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.model_file, Path(directory) / "spm.model")
        return ["spm.model"]


def build_tokenizer(
    tokenizer_type: str, vocab_file: str | None = None, tokenizer_model: str | None = None
) -> Tokenizer:
    """Build a tokenizer from Megatron-style arguments (``--tokenizer-type`` and its file flag)."""
    if tokenizer_type in ("BertWordPieceLowerCase", "BertWordPieceCase"):
        if not vocab_file or not os.path.isfile(vocab_file):
            raise TokenizerError(
                f"--tokenizer-type {tokenizer_type} needs --vocab-file (a WordPiece vocab.txt); "
                f"got {vocab_file!r}, "
                + ("which is a directory" if vocab_file and os.path.isdir(vocab_file) else "which does not exist")
            )
        from tokenizers import BertWordPieceTokenizer

        lower = tokenizer_type == "BertWordPieceLowerCase"
        try:
            with open(vocab_file, encoding="utf-8") as f:
                entries = [line.rstrip("\n") for line in f]
        except UnicodeDecodeError as e:
            raise TokenizerError(
                f"--vocab-file {vocab_file}: not a text file (byte {e.start} is not UTF-8); give a WordPiece "
                "vocab.txt, one token per line (a SentencePiece .model goes to --tokenizer-model)"
            ) from None
        missing = [t for t in ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]") if t not in set(entries)]
        if missing:
            raise TokenizerError(
                f"--vocab-file {vocab_file}: no {', '.join(missing)} entry; a BERT WordPiece "
                f"vocab.txt lists them (train one with `python -m data_pipeline.train_tokenizer`)"
            )
        # exactly the pipeline BertTokenizerFast(vocab, do_lower_case=lower) builds (parity is tested)
        backend = BertWordPieceTokenizer(
            vocab_file, clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lower
        )._tokenizer
        if backend.get_vocab_size(with_added_tokens=True) != len(entries):
            raise TokenizerError(
                f"--vocab-file {vocab_file}: loaded {backend.get_vocab_size()} tokens from "
                f"{len(entries)} lines; duplicate lines or not a WordPiece vocab.txt"
            )

        def make_hf():
            from transformers import BertTokenizerFast

            # transformers 5 takes the vocab as ``vocab=``; ``vocab_file=`` is silently ignored there and
            # yields a 5-token tokenizer that maps every word to [UNK] (tested in test_tokenization.py).
            return BertTokenizerFast(vocab=vocab_file, do_lower_case=lower)

        return HFTokenizer(backend, tokenizer_type, vocab_file, hf_factory=make_hf)
    if tokenizer_type == "SentencePieceTokenizer":
        return SentencePieceTokenizer(tokenizer_model)
    if tokenizer_type == "HuggingFaceTokenizer":
        if not tokenizer_model or not os.path.exists(tokenizer_model):
            raise TokenizerError(
                f"--tokenizer-type HuggingFaceTokenizer needs --tokenizer-model (a local "
                f"tokenizer directory or tokenizer.json); got {tokenizer_model!r}"
            )
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        if os.path.isdir(tokenizer_model):
            hf = AutoTokenizer.from_pretrained(tokenizer_model, use_fast=True, local_files_only=True)
        else:
            hf = PreTrainedTokenizerFast(tokenizer_file=tokenizer_model)
        return HFTokenizer(hf.backend_tokenizer, tokenizer_type, tokenizer_model, hf_tokenizer=hf)
    raise TokenizerError(f"unknown --tokenizer-type {tokenizer_type!r}; choose one of {', '.join(TOKENIZER_TYPES)}")
