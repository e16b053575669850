"""The end of every import from a transformers state dict: its tied copies checked and nothing left unconverted."""

from __future__ import annotations

import torch


def check_tied_and_rest(sd: dict[str, torch.Tensor], tied: dict[str, tuple[torch.Tensor, str]], family: str) -> None:
    """Pop each of ``tied`` (their name -> (our weight it must equal, what that is)) that ``sd`` holds, refusing one
    that differs (our model ties it, so it cannot hold another value), then refuse any weight ``sd`` still holds."""
    for theirs, (ours, what) in tied.items():
        t = sd.pop(theirs, None)
        if t is not None and not torch.equal(t, ours):
            raise ValueError(f"{theirs} differs from {what}")
    if sd:
        raise ValueError(f"unexpected {family} weights (not converted): {sorted(sd)[:8]}")
