"""Shared fixtures: where the reference corpus lives, tiny temp dirs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _corpus_dir() -> Path:
    env = os.environ.get("SPARSEBERT_CORPUS")
    return Path(env) if env else REPO.parent / "shared" / "corpus"


CORPUS = _corpus_dir()


@pytest.fixture(scope="session")
def corpus() -> Path:
    """The shared reference corpus (../shared/corpus or $SPARSEBERT_CORPUS); skips when absent."""
    if not (CORPUS / "SOURCES.md").is_file():
        pytest.skip(f"reference corpus not found at {CORPUS} (set SPARSEBERT_CORPUS to its path)")
    return CORPUS


@pytest.fixture(scope="session")
def bert_uncased_vocab(corpus: Path) -> Path:
    p = corpus / "vocab" / "bert-base-uncased" / "vocab.txt"
    if not p.is_file():
        pytest.skip(f"BERT uncased vocab not found at {p}")
    return p
