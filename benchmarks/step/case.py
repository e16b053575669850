"""What a measured training step is: the model variants (dense, BlockBERT, whole presets), one :class:`Case` per
set-up, the ``--cases VARIANT@N`` syntax (benchmarks/support/cases.py's, shared with benchmarks.attention), and the
model config a case trains. Model shapes come from model/presets.py."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.support.cases import CaseSyntax
from model.config import ModelConfig
from model.presets import PRESETS, blockbert

TOKENS_PER_STEP = {"bert-base": 16384, "tiny": 256}
"""The model presets (model/presets.py) the harness sizes (--model-preset), and the b x N of a step for each."""
WINDOW_B64 = {"mode": "local", "block": 64, "attention": "bidirectional"}
"""The 64-token-block sliding window (3 blocks, bidirectional: density 0.023 at N=8192), the kernel table's
``local_bi_b64`` (benchmarks/attention/layouts.py) as a model's ``sparsity``."""
VARIANTS = {
    "dense": None,
    "blockbert-n2": 2,
    "blockbert-n3": 3,
    "window-b64": WINDOW_B64,
    "modernbert-base": None,
    "modernbert-blockbert": 2,
}
"""Variant -> BlockBERT n (model.presets.blockbert, the paper's split scaled to the preset's heads), or a layout's
``sparsity`` dict (the window); None = dense.
The variants of :data:`WHOLE_PRESETS` are their own models instead (the n is only what they use)."""
WHOLE_PRESETS = {"modernbert-base": "modernbert-base", "modernbert-blockbert": "modernbert-blockbert-base"}
"""Variant -> the model preset it trains as a whole (its widths, positions, layer plan and dropouts as the recipe has
them), whatever --model-preset sizes: issue #41's ModernBERT local/global layers with BlockBERT globals at 8192."""
CASE_SETS = {"long": "dense,blockbert-n2,blockbert-n3,window-b64@16384,32768"}
"""Named lists of ``--cases`` (issue #48's long rows, where attention dominates: bert-base at N=16384 and 32768; with
``--tokens 32768`` that is micro-batch 2 and 1)."""
CASES = CaseSyntax(tuple(VARIANTS), "VARIANT", CASE_SETS)
"""``--cases VARIANT@N`` (benchmarks/support/cases.py: the syntax benchmarks.attention shares)."""
DEFAULT_CASES = {"time": ["dense,blockbert-n2,blockbert-n3@512,1024"], "memory": ["dense,blockbert-n2@4096"]}
"""``--cases`` of ``--measure time`` and ``memory`` when none is given (the window and whole presets only when
named)."""


@dataclass(frozen=True)
class Case:
    """One training step set-up: what every measure builds a :class:`benchmarks.step.engine.TrainStep` for."""

    variant: str = "dense"
    """A key of VARIANTS."""
    precision: str = "bf16"
    seq_len: int = 512
    batch: int | None = None
    """Micro-batch; None: --tokens // seq_len."""
    zero: int = 1
    """ZeRO stage of ds_configs/zero{stage}_{precision}.json."""
    ds_config: str | None = None
    """A file of ds_configs/ instead of zero{stage}_{precision}.json (its own stage and precision then apply)."""
    attention_dropout: float = 0.1
    """The paper set-ups' 0.1 (run_scripts/common.sh): with it ``auto`` trains the sparse variants with block_gather."""
    compile: bool = False
    """torch.compile through the engine, as the trainer's --compile (pretrain.parallelize.apply_compile)."""
    sample_mode: str | None = None
    """With --data-path: the trainer's --sample-mode (None: --sample-mode of the command line)."""
    residual_norm: str = "eager"
    """ModelConfig.residual_norm of the post-LN (bert-base) variants: 'triton' fuses dropout + residual + LayerNorm
    (model/fused_norm.py); the whole presets (pre-LN) keep their own."""
    mlm_head: str = "chunked"
    """chunked: the model's MLM head (decoder on the vocabulary padded to 64, chunked recomputed loss, slots from
    the 1e-6 binomial quantile). main: the head before issue #47 (unpadded vocabulary, the plain loss keeping the
    fp32 log-softmax, 128 slots at N=512: p x N + 6 binomial standard deviations), for the side-by-side."""


def preset_shape(args) -> None:
    """--model-preset's hidden size, layers and heads onto ``args`` (model/presets.py is their one home)."""
    preset = PRESETS[args.model_preset]
    args.hidden, args.layers, args.heads = preset["hidden_size"], preset["num_layers"], preset["num_attention_heads"]


def case_model_config(case: Case, args) -> ModelConfig:
    """The model a case trains: --model-preset's sizes with the variant's BlockBERT layout, or a whole preset
    (:data:`WHOLE_PRESETS`). --kernel is the kernel of the block-sparse layouts only: a dense model (or a whole
    preset without a layout) keeps ``auto``, the dense reference's fastest path, so that a comparison is never
    against a dense step slowed by a sparse kernel."""
    layout = VARIANTS[case.variant]
    kernel = "auto" if layout is None else args.kernel
    if case.variant in WHOLE_PRESETS:
        name = WHOLE_PRESETS[case.variant]
        positions = max(ModelConfig.preset(name).max_position_embeddings, case.seq_len)
        attention = dict(PRESETS[name]["attention"], kernel=kernel)
        return ModelConfig.preset(
            name, vocab_size=args.vocab_size, max_position_embeddings=positions, attention=attention
        )
    if isinstance(layout, dict):
        sparsity = dict(layout)
    else:  # BlockBERT n at the layout's default tile
        sparsity = None if layout is None else blockbert(layout, args.heads, block=None)
    return ModelConfig.preset(
        "bert-base",
        vocab_size=args.vocab_size,
        hidden_size=args.hidden,
        num_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(512, case.seq_len),
        hidden_dropout=0.1,
        attention_dropout=case.attention_dropout,
        attention={"kernel": kernel, "sparsity": sparsity},
        residual_norm=case.residual_norm,
        **({"pad_vocab_multiple": 1} if case.mlm_head == "main" else {}),
    )
