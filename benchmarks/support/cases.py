"""The one case syntax of the benchmark harnesses (``benchmarks.step`` and ``benchmarks.attention``: ``--cases``).

A case is one thing measured at one sequence length, written ``NAME@N``: a step variant (``dense@4096``), a kernel
table layout (``blockbert_n2@4096``) or a memory family (``fixed@4096``). A comma list on either side stands for every
pair, lengths outer: ``dense,blockbert-n2@512,1024`` is ``dense@512 blockbert-n2@512 dense@1024 blockbert-n2@1024``.
A harness may name sets of cases (the step's ``long``); a set's name stands for its cases. Cases run in the order
written; one given twice is refused (it would be measured twice). Why one flag, not a names x lengths pair of flags:
docs/benchmarks.md ("Cases").

Each harness describes its names once (a :class:`CaseSyntax`); the flag's keywords, its parsing at argparse time and
its errors come from here, so both harnesses read and refuse the same words the same way.
"""

from __future__ import annotations

import argparse
import difflib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

Case = tuple[str, int]
"""(name, sequence length N)."""


@dataclass(frozen=True)
class CaseSyntax:
    """What a harness's ``--cases`` may name."""

    names: tuple[str, ...]
    """The names a case may have (a registry's keys: step variants, layouts, memory families)."""
    what: str
    """What a name is called in the metavar and in errors: VARIANT, LAYOUT, FAMILY."""
    sets: Mapping[str, str] = field(default_factory=dict)
    """Set name -> the cases it stands for, written in this syntax."""

    def __post_init__(self) -> None:
        clash = set(self.sets) & set(self.names)
        if clash or any("@" in s or "," in s for s in self.sets):
            raise ValueError(f"case sets {sorted(self.sets)}: a set's name is a plain word, not also a {self.what}")

    def usage(self) -> str:
        """How to write a case, as errors and --help say it."""
        w = self.what
        sets = f"; or a set: {', '.join(self.sets)}" if self.sets else ""
        return f"write {w}@N, or {w},{w}@N,N for every pair, with {w} one of {', '.join(self.names)}{sets}"

    def parse(self, specs: Iterable[str]) -> list[Case]:
        """The cases ``specs`` write, in order (a set expanded where it stands); ValueError naming the bad word."""
        cases: list[Case] = []
        for given in specs:
            for spec in self.sets[given].split() if given in self.sets else [given]:
                for case in self._one(spec):
                    if case in cases:
                        raise ValueError(f"--cases {spec!r}: {case[0]}@{case[1]} is given twice")
                    cases.append(case)
        return cases

    def _one(self, spec: str) -> list[Case]:
        names, at, lengths = spec.partition("@")
        near_set = difflib.get_close_matches(spec, list(self.sets), n=1)
        problem = "" if at else f"no set {spec!r} (did you mean {near_set[0]}?)" if near_set else "no @N"
        for name in names.split(",") if at else []:
            if name not in self.names:
                near = difflib.get_close_matches(name, [*self.names, *self.sets], n=1)
                problem = f"no {self.what} {name!r}" + (f" (did you mean {near[0]}?)" if near else "")
                break
        for n in lengths.split(",") if at and not problem else []:
            if not (n.isascii() and n.isdigit()) or int(n) == 0:
                problem = f"N {n!r} is not a positive whole number"
                break
        if problem:
            raise ValueError(f"--cases {spec!r}: {problem}; {self.usage()}")
        return [(name, int(n)) for n in lengths.split(",") for name in names.split(",")]

    def flag(self, default: list[str], help: str) -> dict[str, Any]:
        """The argparse keywords of ``--cases`` (for ``add_argument("--cases", **...)``): parsed as given, so that
        ``args.cases`` is always the :data:`Case` list, a bad word an argparse error (exit 2) before any set-up."""
        return dict(
            nargs="+",
            metavar=f"{self.what}@N",
            action=_CasesAction,
            syntax=self,
            default=self.parse(default),
            help=f"{help} (default: {' '.join(default)}); {self.usage()}",
        )


class _CasesAction(argparse.Action):
    """``--cases``'s words -> :data:`Case` list, or argparse's error with :meth:`CaseSyntax.parse`'s message."""

    def __init__(self, option_strings: list[str], dest: str, syntax: CaseSyntax, **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.syntax = syntax

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        try:
            setattr(namespace, self.dest, self.syntax.parse(values))
        except ValueError as e:
            raise argparse.ArgumentError(None, str(e)) from None


def by_length(cases: Iterable[Case]) -> list[tuple[int, list[str]]]:
    """The cases grouped by N, lengths in the order they first appear (a measure that builds its inputs and dense
    baseline once per N)."""
    groups: dict[int, list[str]] = {}
    for name, n in cases:
        groups.setdefault(n, []).append(name)
    return list(groups.items())
