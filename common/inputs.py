"""Reading a user's input file with the one error rule (common.errors): a missing, empty, binary or malformed file,
or a directory given for a file, is one line naming the flag and what to give."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from common.errors import UserError, os_error_message


def read_text(path: str | os.PathLike, flag: str, what: str) -> str:
    """The UTF-8 text of ``path`` (``flag``'s value; ``what`` says what the file should be)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {path} is a directory; give {what}")
    try:
        data = p.read_bytes()
    except OSError as e:
        raise UserError(os_error_message(e, f"{flag} {path}")) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{flag} {path}: not a text file (byte {e.start} is not UTF-8); give {what}") from None


def read_json_object(path: str | os.PathLike, flag: str, what: str) -> dict[str, Any]:
    """The JSON object in ``path``; anything else (empty, not JSON, a list) is one line naming ``flag``."""
    text = read_text(path, flag, what)
    if not text.strip():
        raise UserError(f"{flag} {path} is empty; give {what}")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{flag} {path}:{e.lineno}:{e.colno}: not valid JSON ({e.msg}); give {what}") from None
    if not isinstance(obj, dict):
        raise UserError(f"{flag} {path}: expected a JSON object, got a {type(obj).__name__}; give {what}")
    return obj
