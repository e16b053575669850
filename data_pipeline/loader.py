"""Compatibility module: the pretraining data code, split by concern, under one import path for users' scripts.

- :mod:`data_pipeline.data_config`: ``DataConfig``, ``--data-path`` / ``--split`` parsing;
- :mod:`data_pipeline.datasets`: ``ShardSplit``, ``PretrainingDataset``, ``build_datasets``;
- :mod:`data_pipeline.collate`: ``Collator`` (padding, dynamic masking);
- :mod:`data_pipeline.batching`: ``DistributedBatchSampler``, ``PretrainingLoader``, ``build_dataloader``;
- :mod:`data_pipeline.stats`: ``dataset_stats``.
"""

from data_pipeline.batching import DistributedBatchSampler, PretrainingLoader, build_dataloader  # noqa: F401
from data_pipeline.collate import Collator  # noqa: F401
from data_pipeline.data_config import (  # noqa: F401
    SPLIT_NAMES,
    DataConfig,
    DataConfigError,
    parse_data_path,
    parse_split,
    split_document_ranges,
)
from data_pipeline.datasets import PretrainingDataset, ShardSplit, build_datasets  # noqa: F401
from data_pipeline.stats import dataset_stats  # noqa: F401
