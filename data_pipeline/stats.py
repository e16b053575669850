"""Statistics of a dataset split (sample count, fill ratio, masking shares) for ``tools.inspect_dataset samples``
and the docs."""

from __future__ import annotations

import numpy as np

from data_pipeline.collate import Collator
from data_pipeline.datasets import PretrainingDataset
from data_pipeline.masking import IGNORE_INDEX


# ---------------------------------------------------------------------------------------------------------
# statistics (CLI, docs)
# ---------------------------------------------------------------------------------------------------------
def dataset_stats(
    dataset: PretrainingDataset, collator: Collator, max_masked_samples: int = 20000, batch_size: int = 256
) -> dict:
    """Sample count, fill ratio (all samples), masked fraction and [MASK]/random/kept split (first positions)."""
    N = collator.seq_length
    lengths = [c.sample_lengths() for c in dataset.components]
    all_len = np.concatenate(lengths)
    stats = {
        "num_samples": int(len(all_len)),
        "dataset_length": int(len(dataset)),
        "num_samples_per_dataset": {c.prefix: int(len(c)) for c in dataset.components},
        "seq_length": N,
        "mean_fill_ratio": float(all_len.mean() / N),
        "mean_fill_ratio_per_dataset": {c.prefix: float(n.mean() / N) for c, n in zip(dataset.components, lengths)},
        # the price of cut_fraction < 1: samples whose text starts inside a sentence
        "mid_sentence_start_fraction": float(
            np.mean(
                np.concatenate(
                    [
                        ~np.isin(
                            c.sample_text_starts(),
                            np.asarray(c.shard.sequence_pointers) // c.shard.dtype.itemsize,
                        )
                        for c in dataset.components
                    ]
                )
            )
        ),
    }
    n_pred = n_cand = n_mask = n_rand = n_kept = 0
    nsp_pos = nsp_total = 0
    special = collator.masker.is_special
    limit = min(max_masked_samples, len(dataset))  # never into the next epoch's samples
    for start in range(0, limit, batch_size):
        stop = min(start + batch_size, limit)
        items = dataset.__getitems__(list(range(start, stop)))
        batch = collator(items)
        ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        orig = np.full_like(ids, collator.pad_id)
        for b, it in enumerate(items):
            orig[b, : len(it[0])] = it[0]
        pred = labels != IGNORE_INDEX
        n_cand += int((~special[orig] & (batch["attention_mask"].numpy() > 0)).sum())
        n_pred += int(pred.sum())
        n_mask += int((pred & (ids == collator.masker.mask_id)).sum())
        n_kept += int((pred & (ids == labels)).sum())
        n_rand += int((pred & (ids != labels) & (ids != collator.masker.mask_id)).sum())
        if "next_sentence_label" in batch:
            nsp_pos += int(batch["next_sentence_label"].sum())
            nsp_total += len(items)
    stats.update(
        {
            "masked_samples": int(min(max_masked_samples, len(dataset))),
            "masked_fraction": n_pred / max(n_cand, 1),
            "mask_split": {
                "mask": n_mask / max(n_pred, 1),
                "random": n_rand / max(n_pred, 1),
                "kept": n_kept / max(n_pred, 1),
            },
        }
    )
    if nsp_total:
        stats["random_next_fraction"] = nsp_pos / nsp_total
    return stats
