"""The attention benchmark: one command, one parser, five measures.

    .venv/bin/python -m benchmarks.attention --measure {time,memory,tiles,masks,flex-tiles} [flags]

- ``time`` (default, kernel_table.py): forward+backward time and peak memory of each kernel x layout vs dense SDPA;
- ``memory`` (retained_memory.py): what one attention call (or ``--model-level`` a one-layer model) keeps for the
  backward, per kernel and layout family, against the layout's analytic bound;
- ``tiles`` (triton_tiles.py): ``triton_block``'s tiles, warps and stages swept against dense SDPA on a GPU;
- ``masks`` (masks.py): SparseBERT token masks, DIET biases and the DAM search step vs dense SDPA;
- ``flex-tiles`` (flex_tiles.py): FlexAttention's tile counts per layout (exact, from the BlockMasks).

cli.py holds the flags of every measure; steps.py the measured step (q/k/v as views of one fused projection, as in
training) and how it is timed and its memory counted; benchmarks/attention/layouts.py the named layouts and head shape.
"""

from benchmarks.attention.cli import main

__all__ = ["main"]
