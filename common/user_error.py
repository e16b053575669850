"""The parts of the user-error rule that need nothing of ours (common/errors.py describes the rule): the error
class, its exit code, the one-line format and the debug switch. Both common/errors.py (which asks common/launch.py
which rank this process is) and common/launch.py (which raises user errors) build on this module, so neither
imports the other both ways."""

from __future__ import annotations

import os
import sys
from typing import Sequence

USER_ERROR_EXIT = 2
"""Exit code of every user error (argparse uses 2 for bad flags too)."""
DEBUG_ENV = "SPARSE_BERT_DEBUG"
DEBUG_FLAG = "--debug"


class UserError(Exception):
    """A problem the user can fix; the message says what is wrong, which file or setting, and what to do."""


def error_line(prog: str, message: str) -> str:
    """The one line a user error prints: ``PROG: error: MESSAGE``."""
    return f"{prog}: error: {message}"


def debug_enabled() -> bool:
    """Whether full tracebacks were asked for (``--debug`` was seen by :func:`take_debug_flag`, or the env var)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def take_debug_flag(argv: Sequence[str] | None) -> list[str]:
    """``argv`` (default ``sys.argv[1:]``) without ``--debug``; seeing it sets ``SPARSE_BERT_DEBUG=1`` (inherited
    by the ranks and workers this process starts)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if DEBUG_FLAG in args:
        args = [a for a in args if a != DEBUG_FLAG]
        os.environ[DEBUG_ENV] = "1"
    return args
