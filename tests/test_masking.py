"""Dynamic MLM masking: proportions pinned by binomial bounds, specials never touched, whole words for
WordPiece and SentencePiece, masks keyed by sample (independent of batch, padding and call order)."""

from __future__ import annotations

import numpy as np
import pytest

from data_pipeline.masking import IGNORE_INDEX, MaskingConfig, MLMMasker, sample_keys

VOCAB, CLS, SEP, PAD, MASK, UNK = 1000, 1, 2, 0, 3, 4
SPECIALS = np.array([PAD, CLS, SEP, MASK, UNK])


def sigma_bound(n: int, p: float, k: float = 5.0) -> float:
    return k * np.sqrt(p * (1 - p) / n)


def random_batch(rng, B=64, L=512):
    ids = rng.integers(10, VOCAB, size=(B, L))
    lens = rng.integers(L // 2, L + 1, size=B)
    ids[:, 0] = CLS
    ids[np.arange(B), lens - 1] = SEP
    ids[np.arange(L)[None, :] >= lens[:, None]] = PAD
    ids[:, L // 3] = SEP  # a segment separator in the middle
    return ids


def test_proportions_within_binomial_bounds_and_specials_untouched():
    rng = np.random.default_rng(0)
    masker = MLMMasker(MaskingConfig(), VOCAB, MASK, SPECIALS)
    ids = random_batch(rng)
    out, labels = masker(ids, sample_keys(7, np.arange(len(ids))))
    special = np.isin(ids, SPECIALS)
    chosen = labels != IGNORE_INDEX
    n = int((~special).sum())
    assert not (chosen & special).any(), "a [CLS]/[SEP]/[PAD] was chosen"
    np.testing.assert_array_equal(out[special], ids[special])
    np.testing.assert_array_equal(labels[chosen], ids[chosen])
    np.testing.assert_array_equal(out[~chosen], ids[~chosen])  # unchosen tokens unchanged
    assert abs(chosen.sum() / n - 0.15) < sigma_bound(n, 0.15)
    m = int(chosen.sum())
    is_mask = out[chosen] == MASK
    is_kept = out[chosen] == ids[chosen]
    is_rand = ~is_mask & ~is_kept
    # a random replacement may hit the original token: P = 0.1/(VOCAB-5); negligible within the bound
    assert abs(is_mask.mean() - 0.8) < sigma_bound(m, 0.8)
    assert abs(is_rand.mean() - 0.1) < sigma_bound(m, 0.1)
    assert abs(is_kept.mean() - 0.1) < sigma_bound(m, 0.1)
    assert not np.isin(out[chosen][is_rand], SPECIALS).any(), "random replacement produced a special token"
    # random replacements are spread over the vocabulary
    assert len(np.unique(out[chosen][is_rand])) > 0.5 * min(is_rand.sum(), VOCAB - 5) * 0.8


def test_other_probabilities():
    rng = np.random.default_rng(1)
    masker = MLMMasker(MaskingConfig(mask_prob=0.4, mask_token_prob=0.5, random_prob=0.25), VOCAB, MASK, SPECIALS)
    ids = random_batch(rng)
    out, labels = masker(ids, sample_keys(3, np.arange(len(ids))))
    chosen = labels != IGNORE_INDEX
    n = int((~np.isin(ids, SPECIALS)).sum())
    assert abs(chosen.sum() / n - 0.4) < sigma_bound(n, 0.4)
    assert abs((out[chosen] == MASK).mean() - 0.5) < sigma_bound(int(chosen.sum()), 0.5)


def test_mask_depends_only_on_key():
    rng = np.random.default_rng(2)
    masker = MLMMasker(MaskingConfig(), VOCAB, MASK, SPECIALS)
    ids = random_batch(rng, B=8, L=128)
    keys = sample_keys(11, np.arange(100, 108))
    out, lab = masker(ids, keys)
    # same keys again, rows in another order, and one row alone: identical rows
    perm = rng.permutation(8)
    out2, lab2 = masker(ids[perm], keys[perm])
    np.testing.assert_array_equal(out2, out[perm])
    np.testing.assert_array_equal(lab2, lab[perm])
    o3, l3 = masker(ids[3:4], keys[3:4])
    np.testing.assert_array_equal(o3[0], out[3])
    # more padding does not change the real positions
    wide = np.concatenate([ids, np.full((8, 64), PAD)], axis=1)
    o4, l4 = masker(wide, keys)
    np.testing.assert_array_equal(o4[:, :128], out)
    np.testing.assert_array_equal(l4[:, :128], lab)
    # another key (next epoch's position, or another seed) gives another mask
    o5, l5 = masker(ids, sample_keys(11, np.arange(200, 208)))
    o6, l6 = masker(ids, sample_keys(12, np.arange(100, 108)))
    assert (l5 != lab).any(axis=1).all() and (l6 != lab).any(axis=1).all()


def _assert_whole_words(ids, labels, word_start, specials):
    chosen = labels != IGNORE_INDEX
    n_words = n_chosen_words = 0
    for row in range(ids.shape[0]):
        starts = word_start[ids[row]] | np.isin(ids[row], specials)
        starts[1:] |= np.isin(ids[row, :-1], specials)
        word = np.cumsum(starts)
        for w in np.unique(word[~np.isin(ids[row], specials)]):
            sel = (word == w) & ~np.isin(ids[row], specials)
            c = chosen[row, sel]
            assert c.all() or not c.any(), f"word split by the mask: {ids[row, sel]} {c}"
            n_words += 1
            n_chosen_words += int(c.all())
    return n_words, n_chosen_words


def test_whole_word_masking_wordpiece(bert_uncased_vocab, corpus):
    from data_pipeline.tokenization import build_tokenizer

    tok = build_tokenizer("BertWordPieceLowerCase", str(bert_uncased_vocab))
    text = (corpus / "wiki" / "wikiextractor" / "AA" / "wiki_00").read_text(encoding="utf-8")[:60000]
    flat = np.array(tok.encode(text), dtype=np.int64)
    L = 128
    rows = flat[: (len(flat) // (L - 2)) * (L - 2)].reshape(-1, L - 2)
    ids = np.concatenate([np.full((len(rows), 1), tok.cls_id), rows, np.full((len(rows), 1), tok.sep_id)], axis=1)
    ws = tok.word_start_mask()
    assert (~ws[ids]).sum() > 100, "the text should contain ## continuation pieces"
    masker = MLMMasker.from_tokenizer(tok, MaskingConfig(whole_word_masking=True))
    out, labels = masker(ids, sample_keys(5, np.arange(len(ids))))
    n_words, n_chosen = _assert_whole_words(ids, labels, ws, tok.special_ids)
    assert abs(n_chosen / n_words - 0.15) < sigma_bound(n_words, 0.15)
    assert not (labels[np.isin(ids, tok.special_ids)] != IGNORE_INDEX).any()


def test_whole_word_masking_sentencepiece(tmp_path, corpus):
    """Whole-word masking over a SentencePiece tokenizer trained by data_pipeline/train_tokenizer.py."""
    from data_pipeline.tokenization import build_tokenizer
    from data_pipeline.train_tokenizer import TrainTokenizerConfig, train_sentencepiece

    text = (corpus / "books" / "pg11_alices_adventures_in_wonderland.txt").read_text(encoding="utf-8")
    src = tmp_path / "alice.txt"
    src.write_text("\n".join(ln for ln in text.splitlines() if ln.strip()), encoding="utf-8")
    cfg = TrainTokenizerConfig(input=[str(src)], output_dir=str(tmp_path), model_type="unigram", vocab_size=800)
    model, _ = train_sentencepiece(cfg, iter(src.read_text(encoding="utf-8").splitlines()), str(tmp_path))
    tok = build_tokenizer("SentencePieceTokenizer", tokenizer_model=model)
    assert tok.cls_id not in (101, 102, 103) and tok.mask_id != 103  # ids really come from the model
    flat = np.array(tok.encode(" ".join(text.split()[:20000])), dtype=np.int64)
    L = 64
    rows = flat[: (len(flat) // (L - 2)) * (L - 2)].reshape(-1, L - 2)
    ids = np.concatenate([np.full((len(rows), 1), tok.cls_id), rows, np.full((len(rows), 1), tok.sep_id)], axis=1)
    ws = tok.word_start_mask()
    assert (~ws[ids]).sum() > 100, "the text should contain pieces inside words"
    masker = MLMMasker.from_tokenizer(tok, MaskingConfig(whole_word_masking=True))
    out, labels = masker(ids, sample_keys(9, np.arange(len(ids))))
    n_words, n_chosen = _assert_whole_words(ids, labels, ws, tok.special_ids)
    assert abs(n_chosen / n_words - 0.15) < sigma_bound(n_words, 0.15)
    assert (out == tok.mask_id).sum() > 0


def test_config_validation():
    with pytest.raises(ValueError, match="mask_prob"):
        MaskingConfig(mask_prob=1.5)
    with pytest.raises(ValueError, match="mask_token_prob"):
        MaskingConfig(mask_token_prob=0.95, random_prob=0.1)
    with pytest.raises(ValueError, match="word_start"):
        MLMMasker(MaskingConfig(whole_word_masking=True), VOCAB, MASK, SPECIALS)


@pytest.mark.parametrize("wwm", [False, True])
def test_max_predictions_caps_each_sample_keeping_its_first_choices(wwm):
    """The cap only removes predictions from samples that drew more than it (keeping the smallest selection
    hashes), never splits a whole word, and leaves every other sample bit-identical to the uncapped masking."""
    rng = np.random.default_rng(3)
    ids = random_batch(rng, B=48, L=128)
    word_start = None
    if wwm:
        word_start = np.ones(VOCAB, dtype=bool)
        word_start[500:] = False  # ids >= 500 continue the previous word (like ## pieces)
    keys = sample_keys(11, np.arange(len(ids)))
    free = MLMMasker(MaskingConfig(whole_word_masking=wwm), VOCAB, MASK, SPECIALS, word_start)
    out0, lab0 = free(ids, keys)
    cap = int(np.percentile((lab0 != IGNORE_INDEX).sum(1), 50))  # half the samples exceed it
    capped = MLMMasker(
        MaskingConfig(whole_word_masking=wwm, max_predictions_per_seq=cap), VOCAB, MASK, SPECIALS, word_start
    )
    out1, lab1 = capped(ids, keys)
    n0, n1 = (lab0 != IGNORE_INDEX).sum(1), (lab1 != IGNORE_INDEX).sum(1)
    assert (n1 <= cap).all() and (n0 > cap).sum() >= 10
    under = n0 <= cap
    np.testing.assert_array_equal(lab1[under], lab0[under])
    np.testing.assert_array_equal(out1[under], out0[under])
    over = ~under
    assert ((lab1[over] != IGNORE_INDEX) <= (lab0[over] != IGNORE_INDEX)).all()  # a subset of the free choice
    if not wwm:
        assert (n1[over] == cap).all()  # single tokens fill the cap exactly
    else:
        chosen = lab1 != IGNORE_INDEX
        cont = ids >= 500
        for b in np.flatnonzero(over):  # every dropped word is longer than the room the cap has left
            start = np.maximum.accumulate(np.where(~cont[b] | np.isin(ids[b], SPECIALS), np.arange(len(ids[b])), 0))
            dropped = (lab0[b] != IGNORE_INDEX) & ~chosen[b]
            sizes = np.bincount(start[dropped], minlength=len(ids[b]))
            assert (sizes[sizes > 0] > cap - n1[b]).all()
        # a continuation piece is predicted exactly when the token before it (its word) is
        follows = cont[:, 1:] & ~np.isin(ids[:, :-1], SPECIALS)
        assert (chosen[:, 1:][follows] == chosen[:, :-1][follows]).all()
    # masked/random/kept replacement of the surviving predictions is unchanged
    keep = lab1 != IGNORE_INDEX
    np.testing.assert_array_equal(out1[keep], out0[keep])
    np.testing.assert_array_equal(out1[~keep], ids[~keep])
