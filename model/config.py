"""Model configuration: one dataclass for attention, one for the encoder, named presets, strict dict round-trip."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from common.strict_config import check_keys, field_names, from_dict
from model.attention.kernels import KERNELS
from model.attention.layouts import SparsityConfig, check_ds_config, from_ds_config
from model.attention.sparsebert import TokenMaskConfig
from model.positions import SEGMENT_TYPES, PositionConfig
from model.presets import PRESETS

_LAYER_KEYS = ["kernel", "sparsity", "token_mask"]
FFN_TYPES = ("standard", "glu")
RESIDUAL_NORMS = ("eager", "triton")
SIZE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
)
"""The ModelConfig sizes: positive integers (checked in __post_init__), and fields every BERT-family config of
Hugging Face has (the stock exporters' field lists start from them)."""


def _flag(flag: str, negative: str | None = None) -> dict[str, Any]:
    """Field metadata naming the trainer flag (Megatron's name) that overrides this ModelConfig field on the command
    line (pretrain/args.py generates those flags from it; plain data here, the model code stays standard library)."""
    return {"cli": {"flag": flag, "negative": negative}}


def _check_kernel(name: str, where: str) -> None:
    if name not in KERNELS:
        raise ValueError(f"{where}: unknown attention kernel {name!r}; choose one of {sorted(KERNELS)}")


def _check_sparsity(sparsity: dict | None, where: str) -> None:
    """Mode and keys of a layout dict, checked when the config is parsed (values are checked when the layout object
    is built, which needs the head count)."""
    if sparsity is None:
        return
    try:
        check_ds_config(sparsity)
    except (ValueError, NotImplementedError) as e:
        raise ValueError(f"{where}: {e}") from e


@dataclass(frozen=True)
class LayerAttention:
    """One layer's attention, parsed: what :meth:`AttentionConfig.for_layer` and the model read."""

    kernel: str
    sparsity: dict | None
    """The ds_config-style layout dict (built into a layout object once the number of heads is known)."""
    sparsity_where: str
    token_mask: TokenMaskConfig | None


@dataclass(frozen=True)
class AttentionConfig:
    """Which layout and which kernel each layer's attention uses.

    The fields keep the JSON form (what checkpoints and exports store); ``__post_init__`` parses them once into
    typed per-layer objects (:class:`LayerAttention`, :class:`TokenMaskConfig`, layout objects per head count) that
    the accessors return. Frozen, so the parsed objects can never go stale: change a setting with
    ``dataclasses.replace(config, kernel=...)``, which parses again."""

    kernel: str = "auto"
    """Kernel registry name (see the kernel table); auto picks by device, dtype, N, density."""
    sparsity: dict | None = None
    """None = full attention. Else an old ds_config ``sparse_attention`` block, e.g. ``{"mode": "fixed", "block": 16,
    "num_local_blocks": 4}``, or BlockBERT ``{"mode": "blockbert", "num_blocks": 2, "head_assignment": "10:2",
    "block": 64}``. Random modes take an extra ``seed`` (default 0): the same layout on every rank."""
    token_mask: dict | None = None
    """None = no token-level mask. Else a SparseBERT mask (:class:`model.attention.sparsebert.TokenMaskConfig`),
    e.g. ``{"pattern": "no_diagonal"}``, ``{"pattern": "bigbird", "seq_len": 128}``, ``{"pattern": "dam", "dam":
    {"lam": 1e-3, "structured": true}}`` or ``{"pattern": "file", "path": "masks.pt"}``; ANDed with ``sparsity``."""
    per_layer: list[dict] | None = None
    """Optional list, one dict per layer with ``kernel``, ``sparsity`` and/or ``token_mask`` overriding the fields
    above (``"sparsity": null`` makes that layer dense)."""
    global_every: int | None = None
    """ModernBERT's layer cadence (instead of ``per_layer``): layer i is global when i % global_every == 0 and uses
    the fields above (full attention, or any layout, e.g. BlockBERT), local otherwise and uses ``local``. Rotary
    positions use position.rope_theta on global and position.rope_theta_local on local layers. None = no cadence."""
    local: dict | None = None
    """The local layers' settings under ``global_every``, a dict like a ``per_layer`` entry: ModernBERT's exact
    window ``{"token_mask": {"pattern": "sliding_window", "window": 128}}``, or any layout, e.g. ``{"sparsity":
    {"mode": "local", "num_sliding_window_blocks": 9, "attention": "bidirectional"}}``."""

    def __post_init__(self) -> None:
        _check_kernel(self.kernel, "attention.kernel")
        if self.sparsity is not None and not isinstance(self.sparsity, dict):
            raise ValueError(f"attention.sparsity must be a dict or null, got {type(self.sparsity).__name__}")
        _check_sparsity(self.sparsity, "attention.sparsity")
        top = None if self.token_mask is None else TokenMaskConfig.from_dict(self.token_mask)
        dam = top if top is not None and top.pattern == "dam" else None
        if dam is not None and (
            self.sparsity is not None or self.per_layer is not None or self.global_every is not None
        ):
            raise ValueError(
                "attention.token_mask pattern 'dam' searches all n x n positions: it cannot be combined "
                "with attention.sparsity, attention.per_layer or attention.global_every (export the mask, then use "
                "'file')"
            )
        layers: list[LayerAttention] | None = None
        if self.per_layer is not None:
            if not isinstance(self.per_layer, list):
                raise ValueError("attention.per_layer must be a list of dicts (one per layer)")
            layers = [self._parse_layer(f"attention.per_layer[{i}]", d, top) for i, d in enumerate(self.per_layer)]
        parsed = {
            "_dam": dam,
            "_default": LayerAttention(self.kernel, self.sparsity, "attention.sparsity", top),
            "_layers": layers,
            "_local": self._parse_cadence(top),
            "_layouts": {},  # (layer, num_heads) -> layout object, filled by for_layer
        }
        for name, value in parsed.items():  # frozen dataclass: the parsed state is set once, here
            object.__setattr__(self, name, value)

    def _parse_cadence(self, top: TokenMaskConfig | None) -> LayerAttention | None:
        """The local layers' settings of ``global_every`` (None without a cadence)."""
        if self.global_every is None:
            if self.local is not None:
                raise ValueError("attention.local is read only with attention.global_every; set both or neither")
            return None
        if isinstance(self.global_every, bool) or not isinstance(self.global_every, int) or self.global_every < 1:
            raise ValueError(f"attention.global_every must be a positive integer or null, got {self.global_every!r}")
        if self.per_layer is not None:
            raise ValueError("give either attention.per_layer or attention.global_every (with attention.local)")
        if self.local is None:
            raise ValueError(
                "attention.global_every needs attention.local, the local layers' settings, e.g. "
                '{"token_mask": {"pattern": "sliding_window", "window": 128}}'
            )
        local = self._parse_layer("attention.local", self.local, top)
        if local.token_mask is not None and local.token_mask.pattern == "file":
            raise ValueError("attention.local.token_mask: a 'file' mask holds one mask per layer; use per_layer")
        return local

    def _parse_layer(self, where: str, d: Any, top: TokenMaskConfig | None) -> LayerAttention:
        d = check_keys(d, _LAYER_KEYS, where)
        kernel = d.get("kernel", self.kernel)
        _check_kernel(kernel, f"{where}.kernel")
        tm = top
        if "token_mask" in d:
            tm = None if d["token_mask"] is None else TokenMaskConfig.from_dict(d["token_mask"], f"{where}.token_mask")
            if tm is not None and tm.pattern == "dam":
                raise ValueError(f"{where}.token_mask: 'dam' is only valid for all layers")
        if "sparsity" in d:
            _check_sparsity(d["sparsity"], f"{where}.sparsity")
            return LayerAttention(kernel, d["sparsity"], f"{where}.sparsity", tm)
        return LayerAttention(kernel, self.sparsity, "attention.sparsity", tm)

    def layer(self, index: int) -> LayerAttention:
        """The parsed settings of layer ``index``."""
        if self._layers is not None:
            return self._layers[index]
        return self._default if self.is_global(index) else self._local

    def is_global(self, index: int) -> bool:
        """False for the local layers of ``global_every`` (ModernBERT: index % k != 0), True for every other layer."""
        return self.global_every is None or index % self.global_every == 0

    def token_mask_for_layer(self, index: int) -> TokenMaskConfig | None:
        """The token-mask settings of layer ``index`` (None = no token mask)."""
        return self.layer(index).token_mask

    def dam(self) -> TokenMaskConfig | None:
        """The DAM search settings, if this model searches its mask."""
        return self._dam

    def for_layer(self, index: int, num_heads: int) -> tuple[str, SparsityConfig | None]:
        """(kernel name, layout object or None) for layer ``index``; the layout object is built once."""
        la = self.layer(index)
        if la.sparsity is None:
            return la.kernel, None
        key = (index, num_heads)
        if key not in self._layouts:
            try:
                self._layouts[key] = from_ds_config(dict(la.sparsity), num_heads)
            except (ValueError, NotImplementedError) as e:
                raise ValueError(f"{la.sparsity_where}: {e}") from e
        return la.kernel, self._layouts[key]


@dataclass
class ModelConfig:
    """Sizes and options of the BERT encoder and its pre-training heads."""

    vocab_size: int = 30522
    """Word-piece vocabulary size: the real one, what tokenizers, exports and the MLM logits see."""
    pad_vocab_multiple: int = field(default=64, metadata=_flag("--make-vocab-size-divisible-by"))
    """The MLM decoder's GEMMs run on :attr:`padded_vocab_size` rows, vocab_size rounded up to a multiple of this
    (zero rows appended to the tied weight and the bias inside the forward), so they take aligned tensor-core
    kernels (30522 is not a multiple of 8: an sm80 align2 kernel ran on H200). The padded logits are cut off before
    the loss, argmax and outputs, so the model computes the same function; parameters, checkpoints and exports keep
    the real vocabulary, and a run may resume with another value. 1 = no padding. Megatron's
    --make-vocab-size-divisible-by (which pads the embedding table itself, to 128)."""
    hidden_size: int = field(default=768, metadata=_flag("--hidden-size"))
    """Width of the residual stream."""
    num_layers: int = field(default=12, metadata=_flag("--num-layers"))
    """Number of transformer layers."""
    num_attention_heads: int = field(default=12, metadata=_flag("--num-attention-heads"))
    """Attention heads per layer."""
    intermediate_size: int = field(default=3072, metadata=_flag("--ffn-hidden-size"))
    """Feed-forward inner width."""
    max_position_embeddings: int = field(default=512, metadata=_flag("--max-position-embeddings"))
    """Learned absolute positions; also the longest sequence the attention layouts are built for."""
    type_vocab_size: int = 2
    """Segment (token type) embeddings; 0 disables them."""
    hidden_dropout: float = field(default=0.1, metadata=_flag("--hidden-dropout"))
    """Dropout on embeddings, attention output and feed-forward output."""
    attention_dropout: float = field(default=0.1, metadata=_flag("--attention-dropout"))
    """Dropout on attention probabilities (inside the kernel)."""
    layer_norm_eps: float = field(default=1e-12, metadata=_flag("--layernorm-epsilon"))
    """LayerNorm epsilon (BERT: 1e-12)."""
    pre_layer_norm: bool = field(default=False, metadata=_flag("--pre-layer-norm", negative="--post-layer-norm"))
    """False: post-LN as BERT/RoBERTa. True: LN before each sublayer plus a final LN."""
    nsp_head: bool = False
    """Add the pooler and next-sentence-prediction classifier."""
    head_size: int | None = field(default=None, metadata=_flag("--kv-channels"))
    """Per-head width; None = hidden_size / num_attention_heads. Q/K/V project to heads*head_size."""
    hidden_act: str = "gelu"
    """gelu (exact, as BERT) | gelu_tanh | relu."""
    initializer_range: float = 0.02
    """Std of the normal init of weights."""
    pad_token_id: int = 0
    """Padding id (kept for the Hugging Face config)."""
    attention: AttentionConfig = field(default_factory=AttentionConfig)
    """Layout + kernel (+ SparseBERT token mask), for all layers or per layer."""
    position: PositionConfig = field(default_factory=PositionConfig)
    """absolute (BERT input embeddings) | diet_abs | diet_rel (DIET decoupled positional attention) | rotary (RoPE,
    ModernBERT); see :class:`model.positions.PositionConfig`."""
    segment: str = "input"
    """input: token-type embeddings added at the input (BERT). per_head: DIET's logits += s_h[seg_i, seg_j]."""
    ffn_type: str = field(default="standard", metadata=_flag("--ffn-type"))
    """standard: ffn_out(act(ffn_in(x))) (BERT). glu: ffn_in projects to 2 x intermediate_size, split into (input,
    gate), ffn_out(act(input) * gate); with hidden_act gelu that is ModernBERT's GeGLU."""
    linear_bias: bool = field(default=True, metadata=_flag("--add-bias-linear", negative="--disable-bias-linear"))
    """Biases of the attention (Q/K/V, output), feed-forward and MLM-transform linears (ModernBERT: none). The MLM
    decoder keeps its bias either way (ModernBERT's decoder_bias)."""
    norm_bias: bool = field(default=True, metadata=_flag("--norm-bias", negative="--no-norm-bias"))
    """Biases of every LayerNorm (ModernBERT: none)."""
    first_attn_norm: bool = True
    """Pre-LN only: False gives layer 0 no attention LayerNorm, as ModernBERT (the embedding LayerNorm has just
    normalised its input)."""
    residual_norm: str = field(default="eager", metadata=_flag("--residual-norm"))
    """How a post-LN layer computes LayerNorm(dropout(sublayer) + residual), twice per layer: eager (torch's dropout,
    add and LayerNorm: what torch.compile fuses by itself) | triton (one Triton kernel each way, the dropout mask
    regenerated from a Philox seed instead of stored; model/fused_norm.py): on CUDA tensors and only where the model
    is not being compiled (a compiled model runs the eager ops, which Inductor fuses). Not part of the architecture:
    a checkpoint loads under either, exports drop it."""

    def __post_init__(self) -> None:
        if isinstance(self.attention, dict):
            self.attention = from_dict(AttentionConfig, self.attention, "attention")
        if isinstance(self.position, dict):
            self.position = PositionConfig.from_dict(self.position)
        if self.segment not in SEGMENT_TYPES:
            raise ValueError(f"segment must be one of {list(SEGMENT_TYPES)}, got {self.segment!r}")
        if self.segment == "per_head" and self.type_vocab_size < 1:
            raise ValueError("segment 'per_head' needs type_vocab_size >= 1")
        for name in SIZE_FIELDS:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if isinstance(self.pad_vocab_multiple, bool) or not isinstance(self.pad_vocab_multiple, int):
            raise ValueError(
                f"pad_vocab_multiple (--make-vocab-size-divisible-by) must be a positive integer, got "
                f"{self.pad_vocab_multiple!r}"
            )
        if self.pad_vocab_multiple < 1:
            raise ValueError(
                f"pad_vocab_multiple (--make-vocab-size-divisible-by) must be >= 1 (1 = no padding), got "
                f"{self.pad_vocab_multiple}"
            )
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {self.type_vocab_size}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.head_size is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}; "
                "set head_size explicitly"
            )
        if self.head_size is not None and self.head_size < 1:
            raise ValueError(f"head_size must be a positive integer or null, got {self.head_size}")
        if self.hidden_act not in ("gelu", "gelu_tanh", "relu"):
            raise ValueError(f"hidden_act must be gelu | gelu_tanh | relu, got {self.hidden_act!r}")
        if self.residual_norm not in RESIDUAL_NORMS:
            raise ValueError(
                f"residual_norm (--residual-norm) must be one of {list(RESIDUAL_NORMS)}, got {self.residual_norm!r}"
            )
        if self.residual_norm == "triton" and self.pre_layer_norm:
            raise ValueError(
                "residual_norm (--residual-norm) 'triton' fuses post-LN layers' LayerNorm(dropout(x) + residual); a "
                "pre-LN model (--pre-layer-norm, ModernBERT) normalises before each sublayer: use 'eager' (or "
                "--compile)"
            )
        if self.ffn_type not in FFN_TYPES:
            raise ValueError(f"ffn_type (--ffn-type) must be one of {list(FFN_TYPES)}, got {self.ffn_type!r}")
        if not self.first_attn_norm and not self.pre_layer_norm:
            raise ValueError("first_attn_norm False (no attention LayerNorm in layer 0) needs pre_layer_norm True")
        if self.position.type == "rotary" and self.attention_head_size % 2:
            raise ValueError(f"position.type 'rotary' needs an even head size, got {self.attention_head_size}")
        if self.attention.per_layer is not None and len(self.attention.per_layer) != self.num_layers:
            raise ValueError(
                f"attention.per_layer has {len(self.attention.per_layer)} entries but num_layers is {self.num_layers}"
            )
        for i in range(self.num_layers):  # build every layout object once, so errors surface at config time
            self.attention.for_layer(i, self.num_attention_heads)
        self._check_kernels()

    def _check_kernels(self) -> None:
        """Kernel settings that cannot run are refused here, when the config is parsed, not at the first forward."""
        for i in range(self.num_layers):
            if self.attention.layer(i).kernel == "flex" and self.attention_dropout > 0:
                where = "attention.kernel"
                if self.attention.per_layer is not None:
                    where = f"attention.per_layer[{i}].kernel"
                elif self.attention.global_every and i % self.attention.global_every:
                    where = "attention.local.kernel"
                raise ValueError(
                    f"{where} 'flex' (--attention-kernel) has no attention dropout, but attention_dropout is "
                    f"{self.attention_dropout} (--attention-dropout): set it to 0, or use 'block_gather', 'dense' or "
                    "'auto' (which picks a kernel with dropout)"
                )
        if self.attention.dam() is not None and self.attention.kernel not in ("auto", "dense"):
            raise ValueError(
                f"attention.token_mask pattern 'dam' searches its mask with gated dense attention (the probabilities "
                f"times the soft mask; no block kernel computes that), so attention.kernel {self.attention.kernel!r} "
                "(--attention-kernel) would not be used: set 'auto' or 'dense' for the search, then train the "
                "exported mask (pattern 'file') with any kernel"
            )

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word embedding and the decoder: vocab_size rounded up to a multiple of pad_vocab_multiple."""
        return -(-self.vocab_size // self.pad_vocab_multiple) * self.pad_vocab_multiple

    @property
    def attention_head_size(self) -> int:
        return self.head_size if self.head_size is not None else self.hidden_size // self.num_attention_heads

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        d = check_keys(d, field_names(cls), "model config")
        if "attention" in d and isinstance(d["attention"], dict):
            d["attention"] = from_dict(AttentionConfig, d["attention"], "model config 'attention'")
        if "position" in d and isinstance(d["position"], dict):
            d["position"] = PositionConfig.from_dict(d["position"])
        return cls(**d)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "ModelConfig":
        """The recipe ``name`` of :data:`model.presets.PRESETS`, with ``overrides`` (ModelConfig fields)."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
        d = copy.deepcopy(PRESETS[name])
        d.update(check_keys(overrides, field_names(cls), f"the overrides of preset {name!r}"))
        return cls.from_dict(d) if isinstance(d.get("attention"), dict) else cls(**d)
