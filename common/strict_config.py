"""The one strict dict -> dataclass helper: a typo in a JSON config is an error naming the key, the place and the
allowed keys, never a silently ignored setting. Used by the model configs and by data_pipeline's DataConfig.
(Standard library only: the model code is exported as Hugging Face remote code.)"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")


def field_names(cls: type) -> list[str]:
    """Public field names of a dataclass, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")]


def check_keys(d: Any, allowed: list[str] | set[str], where: str) -> dict[str, Any]:
    """``d`` as a dict whose keys are all in ``allowed``; else ValueError naming ``where``."""
    if not isinstance(d, dict):
        raise ValueError(f"{where} must be a JSON object, got {type(d).__name__}")
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; allowed keys: {sorted(allowed)}")
    return dict(d)


def from_dict(cls: type[T], d: Any, where: str) -> T:
    """``cls(**d)`` after checking that every key of ``d`` is a field of ``cls``."""
    return cls(**check_keys(d, field_names(cls), where))
