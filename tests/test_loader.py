"""The data-parallel loader: batch format, exact resume, independence from num_workers, disjoint ranks,
epochs (fresh shuffle, fresh mask), blending proportions, splits, and bad-input errors."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from data_pipeline.batching import build_dataloader
from data_pipeline.data_config import DataConfig, DataConfigError, split_document_ranges
from data_pipeline.datasets import build_datasets
from data_pipeline.indexed import IndexedDataset, IndexedDatasetBuilder
from data_pipeline.samples import MODES, PACKED
from tests.samples_helpers import FIRST_ID, synthetic_shard


class StubTokenizer:
    """The tokenizer interface the loader uses (BERT-like ids), so these tests run without the corpus."""

    vocab_size, pad_id, unk_id, cls_id, sep_id, mask_id = 30522, 0, 100, 101, 102, 103
    special_ids = np.array([0, 100, 101, 102, 103])

    def word_start_mask(self):
        return np.ones(self.vocab_size, dtype=bool)


TOK = StubTokenizer()


def docs(seed, n_docs=60):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 30, size=int(rng.integers(2, 25))).tolist() for _ in range(n_docs)]


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("loader")
    a = synthetic_shard(root / "a", docs(1))
    b = synthetic_shard(root / "b", docs(2, 30))
    return str(a), str(b)


def collect(loader, n=None):
    out = []
    for i, batch in enumerate(loader):
        if n is not None and i >= n:
            break
        out.append(batch)
    return out


def assert_batches_equal(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        assert x.keys() == y.keys()
        for k in x:
            assert torch.equal(x[k], y[k]), k


@pytest.mark.parametrize("mode", MODES)
def test_batch_format(shards, mode):
    cfg = DataConfig(data_path=[shards[0]], split="1,0,0", seq_length=48, sample_mode=mode, seed=1)
    train, valid, test = build_datasets(cfg, TOK)
    assert valid is None and test is None
    batch = next(iter(build_dataloader(train, TOK, cfg, micro_batch_size=8, dp_rank=0, dp_world_size=1, num_workers=0)))
    expect = (
        {"input_ids", "attention_mask", "token_type_ids", "labels"}
        | ({"next_sentence_label"} if mode == "nsp" else set())
        | ({"doc_ids", "cu_seqlens"} if mode == PACKED else set())
    )
    assert set(batch) == expect
    for v in batch.values():
        assert v.dtype == torch.int64
    ids, am, tt, lab = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"]
    assert ids.shape == (8, 48)
    n = am.sum(1)
    assert (ids[:, 0] == TOK.cls_id).all()
    assert (ids[torch.arange(8), n - 1] == TOK.sep_id).all()
    assert (ids[am == 0] == TOK.pad_id).all() and (lab[am == 0] == -100).all()
    assert ((lab == -100) | (lab >= FIRST_ID)).all()  # only real text tokens are predicted
    if mode == "nsp":
        assert set(batch["next_sentence_label"].tolist()) <= {0, 1}
        for r in range(8):  # [CLS] A [SEP] B [SEP]: type 0 up to the first [SEP], 1 after, 0 on padding
            seps = torch.nonzero(ids[r] == TOK.sep_id).flatten()
            first = int(seps[0]) + 1
            assert (tt[r, :first] == 0).all() and (tt[r, first : n[r]] == 1).all() and (tt[r, n[r] :] == 0).all()
    else:
        assert (tt == 0).all()


def test_padding_to_block_multiple(shards):
    cfg = DataConfig(data_path=[shards[0]], split="1,0,0", seq_length=50, pad_to_multiple_of=16)
    train = build_datasets(cfg, TOK)[0]
    b = next(iter(build_dataloader(train, TOK, cfg, 4, 0, 1, num_workers=0)))
    assert b["input_ids"].shape == (4, 64)
    cfg2 = DataConfig(
        data_path=[shards[0]],
        split="1,0,0",
        seq_length=50,
        pad_to_multiple_of=16,
        dynamic_padding=True,
        short_seq_prob=1.0,
    )
    train2 = build_datasets(cfg2, TOK)[0]
    b2 = next(iter(build_dataloader(train2, TOK, cfg2, 4, 0, 1, num_workers=0)))
    L = b2["input_ids"].shape[1]
    assert L % 16 == 0 and L - 16 < int(b2["attention_mask"].sum(1).max()) <= L


@pytest.mark.timeout(180)
def test_resume_equals_uninterrupted_run_whatever_num_workers(shards):
    cfg = DataConfig(data_path=["0.3", shards[0], "0.7", shards[1]], split="1,0,0", seq_length=40, sample_mode="nsp")
    train = build_datasets(cfg, TOK, num_samples=(600, 0, 0))[0]
    mbs, world = 4, 2
    full = {r: collect(build_dataloader(train, TOK, cfg, mbs, r, world, num_workers=0), 12) for r in range(world)}
    k = 5
    for workers in (0, 2):
        for r in range(world):
            resumed = collect(
                build_dataloader(train, TOK, cfg, mbs, r, world, consumed_samples=k * mbs * world, num_workers=workers),
                7,
            )
            assert_batches_equal(resumed, full[r][k:12])
    # a different world size sees the same global stream: ranks' slices of a step = one rank with mbs * world
    single = collect(build_dataloader(train, TOK, cfg, mbs * world, 0, 1, num_workers=0), 12)
    for t in range(12):
        for key in single[t]:
            torch.testing.assert_close(single[t][key], torch.cat([full[0][t][key], full[1][t][key]]))


@pytest.mark.timeout(120)
def test_loader_leaves_torch_global_rng_alone(shards):
    """The model's dropout stream must not depend on when the loader starts (exact resume)."""
    cfg = DataConfig(data_path=[shards[0]], split="1,0,0", seq_length=40, sample_mode="doc-sentences")
    train = build_datasets(cfg, TOK, num_samples=(64, 0, 0))[0]
    for workers in (0, 2):
        torch.manual_seed(123)
        before = torch.get_rng_state()
        collect(build_dataloader(train, TOK, cfg, 4, 0, 1, num_workers=workers), 3)
        assert torch.equal(torch.get_rng_state(), before), f"num_workers={workers} consumed the global RNG"


def test_ranks_disjoint_and_loader_length(shards):
    cfg = DataConfig(data_path=[shards[0]], split="1,0,0", seq_length=40)
    train = build_datasets(cfg, TOK)[0]
    world, mbs = 3, 5
    seen = []
    for r in range(world):
        sampler = build_dataloader(train, TOK, cfg, mbs, r, world, consumed_samples=30, num_workers=0).sampler
        assert len(sampler) == (len(train) - 30) // (mbs * world)
        seen.append([p for batch in sampler for p in batch])
    flat = np.concatenate(seen)
    assert len(np.unique(flat)) == len(flat), "two ranks got the same sample"
    steps = len(seen[0]) // mbs
    np.testing.assert_array_equal(np.sort(flat), np.arange(30, 30 + steps * mbs * world))


def test_epochs_reshuffle_and_remask(shards):
    cfg = DataConfig(data_path=[shards[1]], split="1,0,0", seq_length=40, seed=4)
    train = build_datasets(cfg, TOK)[0]
    S = len(train.components[0])
    ds = build_datasets(cfg, TOK, num_samples=(3 * S, 0, 0))[0]
    comp, rows = ds.locate(np.arange(3 * S))
    assert (comp == 0).all()
    e0, e1 = rows[:S], rows[S : 2 * S]
    np.testing.assert_array_equal(np.sort(e0), np.arange(S))  # every sample once per epoch
    np.testing.assert_array_equal(np.sort(e1), np.arange(S))
    assert (e0 != e1).any(), "epoch 2 was not reshuffled"
    # the same sample in two epochs gets two different masks
    from data_pipeline.collate import Collator

    col = Collator(TOK, cfg)
    s = int(e0[0])
    p1, p2 = 0, S + int(np.flatnonzero(e1 == s)[0])
    b = col(ds.__getitems__([p1, p2]))
    assert torch.equal(b["attention_mask"][0], b["attention_mask"][1])
    assert not torch.equal(b["labels"][0], b["labels"][1])
    # a fixed epoch_seed changes masks, not order
    l0 = collect(build_dataloader(ds, TOK, cfg, 8, 0, 1, num_workers=0), 1)[0]
    l1 = collect(build_dataloader(ds, TOK, cfg, 8, 0, 1, num_workers=0, epoch_seed=5), 1)[0]
    assert torch.equal(l0["attention_mask"], l1["attention_mask"]) and not torch.equal(l0["labels"], l1["labels"])


def test_blending_proportions(shards):
    cfg = DataConfig(data_path=["1", shards[0], "3", shards[1]], split="1,0,0", seq_length=40)
    ds = build_datasets(cfg, TOK, num_samples=(4000, 0, 0))[0]
    comp, _ = ds.locate(np.arange(4000))
    assert abs((comp == 0).sum() - 1000) <= 4
    for lo in (0, 1000, 3000):  # every window close to 1:3
        assert abs((comp[lo : lo + 400] == 0).sum() - 100) <= 8


def test_unweighted_paths_concatenate(shards):
    cfg = DataConfig(data_path=[shards[0], shards[1]], split="1,0,0", seq_length=40)
    ds = build_datasets(cfg, TOK)[0]
    sizes = [len(c) for c in ds.components]
    assert len(ds) == sum(sizes)
    comp, rows = ds.locate(np.arange(len(ds)))
    for k in range(2):  # one pass serves every sample of every shard once (up to the blend's rounding)
        n_k = int((comp == k).sum())
        assert abs(n_k - sizes[k]) <= 4
        first_epoch = rows[comp == k][: sizes[k]]
        assert len(np.unique(first_epoch)) == min(n_k, sizes[k])


def test_splits_are_disjoint_document_ranges(shards):
    assert split_document_ranges(1000, "949,50,1") == [(0, 949), (949, 999), (999, 1000)]
    assert split_document_ranges(10, "80,20") == [(0, 8), (8, 10), (10, 10)]
    cfg = DataConfig(data_path=[shards[0]], split="80,10,10", seq_length=40)
    tr, va, te = build_datasets(cfg, TOK)
    rng = [c.components[0].doc_range for c in (tr, va, te)]
    assert rng == [(0, 48), (48, 54), (54, 60)]
    spans = [(c.components[0].index[:, 0].min(), c.components[0].index[:, 1].max()) for c in (tr, va, te)]
    assert spans[0][1] <= spans[1][0] and spans[1][1] <= spans[2][0]


def test_dataset_pickles_without_token_data(shards):
    cfg = DataConfig(data_path=[shards[0]], split="1,0,0", seq_length=40)
    train = build_datasets(cfg, TOK)[0]
    blob = pickle.dumps(train)
    assert len(blob) < 20_000  # the index is re-memory-mapped in the worker, not copied
    clone = pickle.loads(blob)
    a, b = train.__getitems__([0, 5, 9]), clone.__getitems__([0, 5, 9])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x[0], y[0])


def test_config_errors(shards, tmp_path):
    with pytest.raises(DataConfigError, match="weights do not match paths"):
        DataConfig(data_path=["0.3", shards[0], shards[1]])
    with pytest.raises(DataConfigError, match="weights do not match paths"):
        DataConfig(data_path=[shards[0], "0.5"])
    with pytest.raises(DataConfigError, match="weights do not match paths"):
        DataConfig(data_path=["0.5", shards[0], "0.5"])
    with pytest.raises(DataConfigError, match="seq_length"):
        DataConfig(data_path=[shards[0]], seq_length=4)
    with pytest.raises(DataConfigError, match="split"):
        DataConfig(data_path=[shards[0]], split="a,b")
    with pytest.raises(DataConfigError, match=r"unknown key\(s\) \['seq_len'\] in the data config"):
        DataConfig.from_dict({"data_path": [shards[0]], "seq_len": 128})
    # a uint8 shard cannot hold a 30k vocabulary; ids beyond the vocabulary are caught too
    with IndexedDatasetBuilder(tmp_path / "u8", np.uint8) as b:
        b.add_document([[5, 6]])
    with pytest.raises(DataConfigError, match=r"u8\.idx.*uint8"):
        build_datasets(DataConfig(data_path=[str(tmp_path / "u8")]), TOK)
    with IndexedDatasetBuilder(tmp_path / "big", np.int32) as b:
        b.add_document([[5, 40000]])
    with pytest.raises(DataConfigError, match=r"big\.idx.*40000"):
        build_datasets(DataConfig(data_path=[str(tmp_path / "big")]), TOK)
    # empty train split, empty shard
    with pytest.raises(DataConfigError, match="train split"):
        build_datasets(DataConfig(data_path=[shards[0]], split="0,1,0"), TOK)
    with IndexedDatasetBuilder(tmp_path / "empty", np.uint16) as b:
        b.add_document([[]])
    with pytest.raises(DataConfigError, match=r"empty\.idx.*no tokens"):
        build_datasets(DataConfig(data_path=[str(tmp_path / "empty")]), TOK)
    # nsp needs two non-empty documents per split, checked before any index is built
    synthetic_shard(tmp_path / "onedoc", [[10, 10], [0]])
    with pytest.raises(DataConfigError, match=r"onedoc\.idx.*nsp mode needs at least 2"):
        build_datasets(DataConfig(data_path=[str(tmp_path / "onedoc")], split="1,0,0", sample_mode="nsp"), TOK)
    assert not list(tmp_path.rglob("*_samples_*")), "an index was built before the error"


def test_shards_written_by_megatron(corpus, bert_uncased_vocab, tmp_path):
    """Megatron's own shards (read-only folder): sentence shard and one-sequence-per-document shard."""
    from data_pipeline.tokenization import build_tokenizer

    tok = build_tokenizer("BertWordPieceLowerCase", str(bert_uncased_vocab))
    base = corpus / "megatron-shards"
    for name, mode in (("wiki60_text_sentence", "doc-sentences"), ("wiki60_text_document", "nsp")):
        prefix = str(base / name)
        # the corpus is an input: nothing may be written there. An unusable cache dir (under a file) builds the
        # index in memory; a writable one caches it
        (tmp_path / "a_file").write_text("")
        for cache in (str(tmp_path / "a_file" / "cache"), str(tmp_path)):
            cfg = DataConfig(data_path=[prefix], split="1,0,0", seq_length=128, sample_mode=mode, cache_dir=cache)
            train = build_datasets(cfg, tok)[0]
        assert list(tmp_path.glob(f"{name}_samples_*.npy")) and list(tmp_path.glob(f"{name}_maxid_*.json"))
        comp = train.components[0]
        ds = IndexedDataset(prefix)
        if mode == "doc-sentences":  # every token of the corpus in exactly one sample
            idx = np.asarray(comp.index)
            assert idx[0, 0] == 0 and idx[-1, 1] == ds.num_tokens and (idx[1:, 0] == idx[:-1, 1]).all()
        else:  # whole documents as single sequences: split into pieces, paired with true/random next pieces
            assert len(comp) > 60 * 2 and 0.3 < np.asarray(comp.index)[:, 4].mean() < 0.7
        batch = next(iter(build_dataloader(train, tok, cfg, 16, 0, 1, num_workers=0)))
        assert batch["input_ids"].shape == (16, 128)
        assert (batch["input_ids"][:, 0] == tok.cls_id).all()
        text = tok.decode(batch["input_ids"][0][batch["attention_mask"][0] > 0].tolist())
        assert text.startswith("[CLS]") and len(text.split()) > 20


def test_cyclic_loader_runs_past_the_nominal_length(shards):
    cfg = DataConfig(data_path=[shards[1]], split="1,0,0", seq_length=40)
    ds = build_datasets(cfg, TOK, num_samples=(20, 0, 0))[0]
    assert len(build_dataloader(ds, TOK, cfg, 4, 0, 1, num_workers=0)) == 5
    sampler = build_dataloader(ds, TOK, cfg, 4, 1, 2, consumed_samples=16, num_workers=0, cyclic=True).sampler
    it = iter(sampler)
    assert [next(it) for _ in range(3)] == [[20, 21, 22, 23], [28, 29, 30, 31], [36, 37, 38, 39]]
    with pytest.raises(DataConfigError, match="split is empty"):
        build_dataloader(None, TOK, cfg, 4, 0, 1)


def test_stats_read_exactly_the_dataset_not_the_next_epoch(shards):
    """--stats masks the first min(max_masked_samples, len) samples: with a batch larger than the dataset, the last
    batch stops at the dataset's end (it used to run into the next epoch's samples)."""
    from data_pipeline.collate import Collator
    from data_pipeline.stats import dataset_stats

    cfg = DataConfig(data_path=[shards[0]], split="1,0,0", seq_length=40, sample_mode="nsp")
    ds = build_datasets(cfg, TOK, num_samples=(37, 0, 0))[0]
    assert len(ds) == 37
    asked = []
    original = type(ds).__getitems__

    def spy(self, idx):
        asked.extend(idx)
        return original(self, idx)

    collator = Collator(TOK, cfg)
    try:
        type(ds).__getitems__ = spy
        stats = dataset_stats(ds, collator, max_masked_samples=20000, batch_size=16)
    finally:
        type(ds).__getitems__ = original
    assert sorted(asked) == list(range(37)) and stats["masked_samples"] == 37
    # the NSP share is over those 37 samples exactly
    labels = np.concatenate(
        [
            collator(ds.__getitems__(list(range(i, min(i + 16, 37)))))["next_sentence_label"].numpy()
            for i in range(0, 37, 16)
        ]
    )
    assert stats["random_next_fraction"] == pytest.approx(labels.mean())
