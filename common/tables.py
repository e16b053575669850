"""One Markdown table for every report the repository prints (the benchmarks through benchmarks/report.py, the
tools below them directly): the same cells, alignment and missing-value mark everywhere."""

from __future__ import annotations

from typing import Any, Callable, Sequence

__all__ = ["markdown_table"]


def _cell(value: Any, fmt: str | Callable[[Any], str] | None) -> str:
    if value is None:
        return "-"
    if callable(fmt):
        return fmt(value)
    if fmt and isinstance(value, (int, float)):
        return format(value, fmt)
    return str(value)


def markdown_table(
    rows: Sequence[dict], columns: Sequence[tuple[str, str] | tuple[str, str, str | Callable[[Any], str] | None]]
) -> list[str]:
    """Lines of a Markdown table: ``columns`` are (key, header) or (key, header, format), a format being a
    ``format()`` spec for numbers or a function of the value; a missing value is ``-``. Numeric columns align right."""
    cols = [(c[0], c[1], c[2] if len(c) > 2 else None) for c in columns]
    numeric = [
        any(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for r in rows) for k, _, _ in cols
    ]
    out = ["| " + " | ".join(h for _, h, _ in cols) + " |"]
    out.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    for r in rows:
        out.append("| " + " | ".join(_cell(r.get(k), f) for k, _, f in cols) + " |")
    return out
