"""The one user-error mechanism of our entry points: a problem the user can fix (a bad flag, a missing, corrupt or
mismatched file, a full disk, a read-only destination) is one line on stderr, ``PROG: error: WHAT (WHICH FILE OR
SETTING); WHAT TO DO``, exit code 2, printed by rank 0 only. The full traceback is printed with ``--debug`` on the
command line or ``SPARSE_BERT_DEBUG=1`` in the environment. Anything else is a bug and keeps its traceback.

Each package's error classes (ArgsError, CheckpointError, IndexedDatasetError, ...) derive from :class:`UserError`,
so an entry point catches one type; :func:`os_error_message` turns the operating system's errors (ENOSPC, EROFS,
EACCES, ENOENT, ...) into the same kind of line."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import traceback
from typing import Callable, Iterator, Sequence

from common import launch

# the rule's parts that need nothing of ours: below this module and common/launch.py (re-exported here)
from common.user_error import (  # noqa: F401
    DEBUG_ENV,
    DEBUG_FLAG,
    USER_ERROR_EXIT,
    UserError,
    debug_enabled,
    error_line,
    take_debug_flag,
)


def is_rank0() -> bool:
    """Rank 0 of a launched job (as :func:`common.launch.detect` sees it), or a single process; True where the
    environment cannot tell (one more error line rather than none)."""
    try:
        return launch.detect(master=False).rank == 0
    except Exception:  # a malformed launcher environment must not hide the error being reported
        return True


_OS_HINTS = {
    errno.ENOSPC: ("no space left on the device", "free space there or choose another destination"),
    errno.EDQUOT: ("disk quota exceeded", "free space there or choose another destination"),
    errno.EROFS: ("read-only file system", "choose a writable destination"),
    errno.EACCES: ("permission denied", "choose a location you may write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "choose a location you may write to, or fix its permissions"),
    errno.ENOENT: ("no such file or directory", "check the path"),
    errno.ENOTDIR: ("a path component is a file, not a directory", "choose a directory path"),
    errno.EISDIR: ("is a directory, a file was expected", "give a file path"),
    errno.EEXIST: ("already exists", "choose another path or remove it"),
}


def os_error_message(e: OSError, what: str = "") -> str:
    """One line for an OSError: ``WHAT: REASON (PATH); WHAT TO DO``. ``what`` names the step or setting (``--save
    runs/x: writing the checkpoint``)."""
    reason, todo = _OS_HINTS.get(e.errno or -1, (e.strerror or str(e), "check the path and the disk"))
    path = e.filename if e.filename is not None else ""
    where = f" ({path})" if path and str(path) not in what else ""
    head = f"{what}: " if what else ""
    return f"{head}{reason}{where}; {todo}"


#: How libraries that wrap a failed write say so: safetensors ("os error 28"), torch's zip writer ("unexpected pos
#: 582912 vs 582804" when the disk filled mid-file, "PytorchStreamWriter failed writing file").
_WRITE_FAILURES = ("No space left", "os error 28", "unexpected pos", "PytorchStreamWriter failed", "Disk quota")


def _free_space(path: str | os.PathLike | None) -> str:
    while path and not os.path.exists(path):
        path = os.path.dirname(os.path.abspath(path))
    try:
        return f" ({shutil.disk_usage(path).free / 2**20:,.1f} MiB free there)" if path else ""
    except OSError:
        return ""


@contextlib.contextmanager
def write_errors(what: str, path: str | os.PathLike | None = None) -> Iterator[None]:
    """Turn a failed write into one :class:`UserError` line starting with ``what`` (``--save runs/x``): an
    OSError by its errno (disk full, read-only, permission), a library's wrapped failure by its message, with the
    free space left at ``path``."""
    try:
        yield
    except UserError:
        raise
    except OSError as e:
        raise UserError(os_error_message(e, what) + _free_space(path if e.errno == errno.ENOSPC else None)) from e
    except Exception as e:  # noqa: BLE001 - re-raised unless it is a failed write
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if not any(m in str(e) for m in _WRITE_FAILURES):
            raise
        raise UserError(
            f"{what}: writing failed ({first[:200]}): the disk is full{_free_space(path)}; free space there or "
            "choose another destination"
        ) from e


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
