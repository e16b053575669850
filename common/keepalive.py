"""ssh keep-alives for the launchers that reach other hosts over ssh, so that a lost host ends the launch command.

When a host's link goes down (a power loss, a switch failure), no TCP reset reaches anyone: the surviving ranks end
by themselves after --distributed-timeout-minutes, but pdsh (``deepspeed --hostfile``) waits for its ssh session to
the lost host, which hears nothing, forever (mpirun's rsh agent holds ssh sessions the same way). With
``ServerAliveInterval=5`` and ``ServerAliveCountMax=3`` ssh gives up after 3 unanswered probes 5 s apart (about 15 s),
and the launcher returns.

:data:`SSH_KEEPALIVE` is the one home of the values. :func:`keepalive_env` adds them to the variables pdsh and
Open MPI read (``PDSH_SSH_ARGS_APPEND``, ``OMPI_MCA_plm_rsh_args``), keeping what the user already set there: only an
option the user did not give is appended, so a user's own ``-o ServerAliveInterval=30`` wins. ``python -m
common.launch`` sets them for every launcher it starts (run_scripts/common.sh and the Slurm templates go through it);
``python -m common.keepalive`` prints them as ``export`` lines for a shell (``eval "$(python -m common.keepalive)"``).
Standard library only (called from shell scripts before anything heavy is imported).
"""

from __future__ import annotations

import os
import shlex
import sys
from typing import Mapping, Sequence

SSH_KEEPALIVE: dict[str, str] = {"ServerAliveInterval": "5", "ServerAliveCountMax": "3"}
"""ssh options (``-o KEY=VALUE``) every ssh session of a launch gets unless the user set that option: a host that
stops answering ends its session after ServerAliveInterval x ServerAliveCountMax seconds (15 s)."""

PDSH_VAR = "PDSH_SSH_ARGS_APPEND"
"""pdsh's ssh module appends this variable's arguments to every ssh command line it runs."""
OMPI_VAR = "OMPI_MCA_plm_rsh_args"
"""Open MPI's rsh launcher (mpirun's daemons on other hosts) appends these (the MCA parameter ``plm_rsh_args``;
``--mca plm_rsh_args`` on mpirun's command line overrides it: :func:`keepalive_mpi_args`)."""
SSH_ARG_VARS: tuple[str, ...] = (PDSH_VAR, OMPI_VAR)
"""The environment variables whose ssh arguments get the keep-alives."""

MPI_RSH_PARAM = "plm_rsh_args"
"""Open MPI's MCA parameter of extra ssh arguments."""


def given_options(ssh_args: str) -> set[str]:
    """The ``-o`` option names (lower case, as ssh compares them) in an ssh argument string: ``-o Key=Value``,
    ``-oKey=Value``, ``-o "Key Value"``."""
    tokens = shlex.split(ssh_args)
    names = set()
    for i, tok in enumerate(tokens):
        value = tokens[i + 1] if tok == "-o" and i + 1 < len(tokens) else tok[2:] if tok.startswith("-o") else None
        if value:
            names.add(value.replace("=", " ").split()[0].lower())
    return names


def with_keepalive(ssh_args: str | None) -> str:
    """``ssh_args`` with each :data:`SSH_KEEPALIVE` option the string does not already set appended."""
    text = (ssh_args or "").strip()
    given = given_options(text)
    missing = [f"-o {k}={v}" for k, v in SSH_KEEPALIVE.items() if k.lower() not in given]
    return " ".join([text, *missing]).strip()


def keepalive_env(environ: Mapping[str, str] | None = None, variables: Sequence[str] = SSH_ARG_VARS) -> dict[str, str]:
    """``variables`` (default: all :data:`SSH_ARG_VARS`) with the keep-alives added to their values in ``environ``
    (default ``os.environ``); put them into the launcher's environment."""
    env = os.environ if environ is None else environ
    return {var: with_keepalive(env.get(var)) for var in variables}


def keepalive_mpi_args(args: Sequence[str]) -> list[str]:
    """mpirun flags with the keep-alives added to a ``--mca plm_rsh_args VALUE`` among them (it overrides the
    environment's ``OMPI_MCA_plm_rsh_args``); other flags unchanged."""
    out = list(args)
    for i in range(len(out) - 2):
        if out[i] in ("--mca", "-mca") and out[i + 1] == MPI_RSH_PARAM:
            out[i + 2] = with_keepalive(out[i + 2])
    return out


def main() -> int:
    """Print ``export VAR=...`` lines of :func:`keepalive_env` for a shell's ``eval``."""
    for var, value in keepalive_env().items():
        print(f"export {var}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
