"""Positional information. BERT's learned absolute embeddings live in the embedding layer (model/bert.py);
DIET-ABS/REL and per-head segment biases (next issue) plug in as :class:`model.attention.bias.ScoreBias` objects
produced here per layer and handed to the attention module's ``score_bias`` argument."""

from __future__ import annotations

import torch
import torch.nn as nn


class AbsolutePositionEmbedding(nn.Embedding):
    """Learned absolute positions 0..max-1, added at the input (BERT)."""

    def forward_positions(self, seq_len: int, device: torch.device) -> torch.Tensor:
        if seq_len > self.num_embeddings:
            raise ValueError(
                f"sequence length {seq_len} exceeds max_position_embeddings {self.num_embeddings}; "
                "shorten the inputs or raise max_position_embeddings in the model config"
            )
        return self(torch.arange(seq_len, device=device))
