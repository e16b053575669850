"""Reading a user's input file with the one error rule (common.errors): a missing, empty, binary or malformed file,
or a directory given for a file, is one line naming the flag and what to give."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common.errors import UserError, os_error_message


def _where(flag: str, path: str | os.PathLike) -> str:
    return f"{flag} {path}" if flag else str(path)


def read_text(path: str | os.PathLike, flag: str, what: str, error: type[UserError] = UserError) -> str:
    """The UTF-8 text of ``path`` (``flag``'s value, or "" for a file no flag names; ``what`` says what the file
    should be); a problem raises the caller's ``error`` class."""
    p, where = Path(path), _where(flag, path)
    if p.is_dir():
        raise error(f"{where} is a directory; give {what}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise error(os_error_message(e, where)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not a text file (byte {e.start} is not UTF-8); give {what}") from None


def parse_json_object(
    text: str, where: str, what: str, error: type[UserError] = UserError, line: int | None = None
) -> dict[str, Any]:
    """The JSON object in ``text`` from ``where`` (a flag and path, or a path), the whole file or its line ``line``
    (JSON Lines); invalid JSON names ``where:LINE:COLUMN``, anything but an object says what it got."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{where}:{(line or 1) + e.lineno - 1}:{e.colno}: not valid JSON ({e.msg}); give {what}") from None
    if not isinstance(obj, dict):
        at = f":{line}" if line is not None else ""
        raise error(f"{where}{at}: expected a JSON object, got a {type(obj).__name__}; give {what}")
    return obj


def read_json_object(
    path: str | os.PathLike, flag: str, what: str, error: type[UserError] = UserError
) -> dict[str, Any]:
    """The JSON object in ``path``; anything else (empty, not JSON, a list) is one line naming ``flag`` (or, with
    ``flag`` "", the path alone), raised as the caller's ``error`` class."""
    text = read_text(path, flag, what, error)
    if not text.strip():
        raise error(f"{_where(flag, path)} is empty; give {what}")
    return parse_json_object(text, _where(flag, path), what, error)
