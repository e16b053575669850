"""``python -m tools.merge_shards --inputs P1 P2 ... --output-prefix OUT``: concatenate Megatron shards.

Documents keep the order given; all inputs must share a dtype. Streams (memory does not grow with
the shards) and writes ``OUT.bin/.idx`` by atomic rename. Useful to join shards preprocessed on
different machines, or the per-rank parts of a run.
"""

from __future__ import annotations

import argparse
import glob
import sys
from typing import Sequence

from common.error_exit import run_entry
from common.outputs import check_fresh, check_not_input
from data_pipeline.indexed import IndexedDataset, data_file_path, index_file_path, merge_shards


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; bad input is one line and exit 2 (common.error_exit.run_entry)."""
    return run_entry("tools.merge_shards", _main, argv)


def _main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.merge_shards", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--inputs", nargs="+", required=True, help="shard prefixes (or globs of .idx files, merged in sorted order)"
    )
    p.add_argument("--output-prefix", required=True)
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT.bin/.idx")
    a = p.parse_args(argv)
    prefixes: list[str] = []
    for spec in a.inputs:
        if glob.has_magic(spec):
            prefixes += [m[:-4] for m in sorted(glob.glob(spec)) if m.endswith(".idx")]
        else:
            prefixes.append(spec[:-4] if spec.endswith((".idx", ".bin")) else spec)
    if not prefixes:
        print(f"tools.merge_shards: error: --inputs {' '.join(a.inputs)} matched no shard", file=sys.stderr)
        return 2
    outs = [data_file_path(a.output_prefix), index_file_path(a.output_prefix)]
    for out in outs:
        check_not_input(
            out, "--output-prefix", [("--inputs", f(q)) for q in prefixes for f in (data_file_path, index_file_path)]
        )
    check_fresh(outs, "--output-prefix", a.overwrite)
    merge_shards(prefixes, a.output_prefix)
    ds = IndexedDataset(a.output_prefix)
    print(
        f"[merge_shards] {a.output_prefix}.bin/.idx: {len(prefixes)} shards, {ds.num_documents:,} documents, "
        f"{len(ds):,} sequences, {ds.num_tokens:,} tokens"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
