"""Batches from samples: padding and dynamic MLM masking, vectorized over the batch (:class:`Collator`)."""

from __future__ import annotations

import numpy as np
import torch

from data_pipeline.data_config import DataConfig
from data_pipeline.masking import MLMMasker, sample_keys
from data_pipeline.samples import PACKED


def segment_offsets(doc_ids_BL: torch.Tensor) -> torch.Tensor:
    """``cu_seqlens`` of a packed batch (int64 ``[S + 1]``, as every batch tensor; the model hands FlashAttention
    int32): where each run of equal document ids starts in the flattened ``B * L`` tokens, every row start included
    (the row's tail of padding, id -1, is one more run), then ``B * L``. Made once per batch here, on the host, so
    the model's varlen attention (model/attention/kernels/varlen.py) never waits for the device to find the
    documents."""
    ids_BL = doc_ids_BL.numpy()
    B, L = ids_BL.shape
    starts_BL = np.ones((B, L), dtype=bool)
    np.not_equal(ids_BL[:, 1:], ids_BL[:, :-1], out=starts_BL[:, 1:])
    return torch.from_numpy(np.append(np.flatnonzero(starts_BL), B * L))  # numpy: 1.7 ms at B=128, N=512 (torch: 141)


# ---------------------------------------------------------------------------------------------------------
# collation + masking
# ---------------------------------------------------------------------------------------------------------
class Collator:
    """Pads, masks (vectorized over the batch) and returns torch tensors. Picklable into workers."""

    def __init__(self, tokenizer, config: DataConfig, mask_salt: int = 0) -> None:
        self.masker = MLMMasker.from_tokenizer(tokenizer, config.masking_config)
        self.pad_id = int(tokenizer.pad_id)
        self.seq_length = config.seq_length
        self.multiple = config.pad_to_multiple_of
        self.dynamic = config.dynamic_padding
        self.nsp = config.sample_mode == "nsp"
        self.packed = config.sample_mode == PACKED
        self.seed = config.seed
        self.salt = int(mask_salt)

    def padded_length(self, longest: int) -> int:
        n = longest if self.dynamic else self.seq_length
        if self.multiple:
            n = -(-n // self.multiple) * self.multiple
        return n

    def compact(self, items: list[tuple]) -> np.ndarray:
        """Pad + mask into one flat int32 array ``[ids (B*L) | labels (B*L) | lengths, first, nsp (3*B) |
        doc ids (B*L, packed-docs only) | B, L]``.

        This is what dataloader workers send: one int32 numpy array, pickled through the worker pipe,
        instead of five int64 tensors, each moved to its own shared-memory segment (the transfer, not the
        masking, limited the loader: 3.3k -> 9k samples/s); ``expand`` rebuilds the batch."""
        B = len(items)
        lens = np.fromiter((len(it[0]) for it in items), dtype=np.int64, count=B)
        L = self.padded_length(int(lens.max()) if B else 0)
        ids_BL = np.full((B, L), self.pad_id, dtype=np.int64)
        for b, it in enumerate(items):
            ids_BL[b, : lens[b]] = it[0]
        positions = np.fromiter((it[3] for it in items), dtype=np.int64, count=B)
        masked_BL, labels_BL = self.masker(ids_BL, sample_keys(self.seed, positions, self.salt))
        out = np.empty(2 * B * L + 3 * B + (B * L if self.packed else 0) + 2, dtype=np.int32)
        out[: B * L] = masked_BL.ravel()
        out[B * L : 2 * B * L] = labels_BL.ravel()
        meta = out[2 * B * L : 2 * B * L + 3 * B].reshape(3, B)
        meta[0] = lens
        meta[1] = np.fromiter((it[1] for it in items), dtype=np.int64, count=B)
        meta[2] = np.fromiter((it[2] for it in items), dtype=np.int64, count=B)
        if self.packed:  # document of every token (0, 1, ... per row), -1 on padding
            docs_BL = out[2 * B * L + 3 * B : 3 * B * L + 3 * B].reshape(B, L)
            docs_BL[:] = -1
            for b, it in enumerate(items):
                docs_BL[b, : lens[b]] = np.repeat(np.arange(len(it[4])), it[4])
        out[-2:] = (B, L)
        return out

    def expand(self, compact: np.ndarray) -> dict[str, torch.Tensor]:
        """The batch dict from ``compact``'s array (cheap: a few broadcasts, run in the consuming process)."""
        flat = torch.from_numpy(compact)
        B, L = int(flat[-2]), int(flat[-1])
        ids = flat[: B * L].view(B, L).long()
        labels = flat[B * L : 2 * B * L].view(B, L).long()
        meta = flat[2 * B * L : 2 * B * L + 3 * B].view(3, B).long()
        pos_L = torch.arange(L)
        attention = pos_L[None, :] < meta[0][:, None]
        out = {"input_ids": ids, "attention_mask": attention.long()}
        if self.nsp:
            out["token_type_ids"] = ((pos_L[None, :] >= meta[1][:, None]) & attention).long()
            out["next_sentence_label"] = meta[2].clone()
        else:
            out["token_type_ids"] = torch.zeros((B, L), dtype=torch.int64)
        out["labels"] = labels
        if self.packed:
            out["doc_ids"] = flat[2 * B * L + 3 * B : 3 * B * L + 3 * B].view(B, L).long()
            out["cu_seqlens"] = segment_offsets(out["doc_ids"])
        return out

    def __call__(self, items: list[tuple]) -> dict[str, torch.Tensor]:
        return self.expand(self.compact(items))
