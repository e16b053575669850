"""What every benchmark command writes: one JSON file (written whole or not at all) and one Markdown table, so the
step and attention harnesses and the GPU check read and render results the same way."""

from __future__ import annotations

import json
from pathlib import Path

from common.provenance import commit_info
from common.tables import markdown_table

__all__ = ["commit_info", "markdown_table", "write_json"]


def write_json(path: str | Path, result: dict, flag: str = "--json") -> None:
    """Writes ``result`` to ``path`` atomically (a killed run leaves the previous file or none); an unwritable path
    is a one-line error naming ``flag``."""
    from common.errors import write_errors
    from common.outputs import atomic_file

    with write_errors(f"{flag} {path}", Path(path).parent), atomic_file(path) as tmp:
        tmp.write_text(json.dumps(result, indent=1))
