"""The data-parallel loader: which stream positions each rank's micro-batches hold (:class:`DistributedBatchSampler`)
and the iterable of batches (:class:`PretrainingLoader`, :func:`build_dataloader`). A batch depends only on
``(seed, consumed_samples)``, which is what makes exact resume possible."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from data_pipeline.collate import Collator
from data_pipeline.data_config import DataConfig, DataConfigError
from data_pipeline.datasets import PretrainingDataset


class DistributedBatchSampler:
    """Positions of this rank's micro-batches: step t serves global batch
    ``[consumed + t*G, consumed + (t+1)*G)`` with G = micro_batch * world; rank r takes slice r of it."""

    def __init__(
        self, total: int | None, consumed_samples: int, micro_batch_size: int, dp_rank: int, dp_world_size: int
    ) -> None:
        if micro_batch_size < 1 or dp_world_size < 1 or not 0 <= dp_rank < dp_world_size:
            raise DataConfigError(
                f"micro_batch_size={micro_batch_size}, dp_rank={dp_rank}, "
                f"dp_world_size={dp_world_size}: need mbs >= 1 and 0 <= rank < world"
            )
        if consumed_samples < 0:
            raise DataConfigError(f"consumed_samples={consumed_samples}: must be >= 0")
        self.total, self.consumed = total, int(consumed_samples)
        self.mbs, self.rank, self.world = int(micro_batch_size), int(dp_rank), int(dp_world_size)

    @property
    def global_batch(self) -> int:
        return self.mbs * self.world

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("an endless sampler has no length")
        return max(0, (self.total - self.consumed) // self.global_batch)

    def __iter__(self) -> Iterator[list[int]]:
        start = self.consumed
        while self.total is None or start + self.global_batch <= self.total:
            lo = start + self.rank * self.mbs
            yield list(range(lo, lo + self.mbs))
            start += self.global_batch


class PretrainingLoader:
    """Iterable of batches for one rank; a fresh iteration restarts at ``consumed_samples``."""

    def __init__(
        self, dataset: PretrainingDataset, collator: Collator, sampler: DistributedBatchSampler, num_workers: int
    ) -> None:
        self.dataset, self.collator, self.sampler, self.num_workers = dataset, collator, sampler, num_workers

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # Every random number of a batch comes from (seed, sample, position) hashes, so the DataLoader needs no
        # randomness; its own generator keeps it from drawing its worker base seed from torch's global RNG (which
        # would shift the model's dropout stream and break exact resume).
        generator = torch.Generator().manual_seed(0)
        if self.num_workers == 0:
            loader = torch.utils.data.DataLoader(
                self.dataset, batch_sampler=self.sampler, collate_fn=self.collator, num_workers=0, generator=generator
            )
            yield from loader
            return
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_sampler=self.sampler,
            collate_fn=self.collator.compact,
            num_workers=self.num_workers,
            prefetch_factor=4,
            generator=generator,
        )
        for flat in loader:
            yield self.collator.expand(flat)


def build_dataloader(
    dataset: PretrainingDataset,
    tokenizer,
    config: DataConfig,
    micro_batch_size: int,
    dp_rank: int,
    dp_world_size: int,
    consumed_samples: int = 0,
    num_workers: int = 2,
    epoch_seed: int | None = None,
    cyclic: bool = False,
) -> Iterable[dict[str, torch.Tensor]]:
    """Batches of ``micro_batch_size`` for ``dp_rank``, starting after ``consumed_samples`` (global count).

    Stops when the next global batch would pass ``len(dataset)``, or never with ``cyclic=True``.
    ``epoch_seed`` salts the masks (e.g. a fixed one for evaluation), leaving the order unchanged.
    """
    if dataset is None:
        raise DataConfigError(f"build_dataloader: no dataset (the split is empty with split={config.split!r})")
    collator = Collator(tokenizer, config, mask_salt=0 if epoch_seed is None else int(epoch_seed) + 1)
    sampler = DistributedBatchSampler(
        None if cyclic else len(dataset), consumed_samples, micro_batch_size, dp_rank, dp_world_size
    )
    return PretrainingLoader(dataset, collator, sampler, num_workers)
