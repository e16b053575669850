"""How an entry point ends on a user error (the rule: :mod:`common.errors`): :func:`run_entry` wraps a command's
``main``, turning :class:`~common.errors.UserError` and OSError into one line on stderr from rank 0 and exit code 2;
``--debug`` shows the traceback."""

from __future__ import annotations

import os
import sys
import traceback
from typing import Callable, Sequence

from common import launch
from common.errors import USER_ERROR_EXIT, UserError, debug_enabled, error_line, os_error_message, take_debug_flag


def is_rank0() -> bool:
    """Rank 0 of a launched job (as :func:`common.launch.detect` sees it), or a single process; True where the
    environment cannot tell (one more error line rather than none)."""
    try:
        return launch.detect(master=False).rank == 0
    except Exception:  # a malformed launcher environment must not hide the error being reported
        return True


def report(prog: str, message: str) -> int:
    """Print ``PROG: error: MESSAGE`` (rank 0 only; with the traceback under debug) and return the exit code 2."""
    if debug_enabled() and sys.exc_info()[0] is not None:
        traceback.print_exc()
    if is_rank0():
        print(error_line(prog, message), file=sys.stderr, flush=True)
    return USER_ERROR_EXIT


def run_entry(prog: str, main: Callable[[list[str]], int], argv: Sequence[str] | None = None) -> int:
    """Run ``main(argv)`` with the one error rule: :class:`UserError` and OSError become one line and exit 2
    (:func:`report`); ``--debug`` is taken off ``argv`` first (:func:`take_debug_flag`)."""
    args = take_debug_flag(argv)
    try:
        return main(args)
    except UserError as e:
        return report(prog, str(e))
    except BrokenPipeError:  # the reader of our output went away (`| head`): nothing to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:
        return report(prog, os_error_message(e))
