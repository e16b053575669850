"""What every benchmark command writes: one JSON file (written whole or not at all) and one Markdown table, so the
step and attention harnesses and the GPU check read and render results the same way."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Sequence

from common.provenance import commit_info

__all__ = ["commit_info", "markdown_table", "write_json"]


def write_json(path: str | Path, result: dict, flag: str = "--json") -> None:
    """Writes ``result`` to ``path`` atomically (a killed run leaves the previous file or none); an unwritable path
    is a one-line error naming ``flag``."""
    from common.errors import write_errors
    from common.outputs import atomic_file

    with write_errors(f"{flag} {path}", Path(path).parent), atomic_file(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1))


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
