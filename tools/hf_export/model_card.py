"""README.md model card for an export, from what the checkpoint's client state recorded about the run."""

from __future__ import annotations

import json
from typing import Any


def _mask_text(tm: dict[str, Any] | None) -> str:
    """A SparseBERT token mask in words (file masks by the exported file name, never the training path)."""
    if tm is None:
        return ""
    if tm.get("pattern") == "dam":
        dam = json.dumps(tm.get("dam") or {}, sort_keys=True)
        return f"; SparseBERT DAM mask search (learned alpha exported) `{dam}`"
    shown = {k: v for k, v in tm.items() if v not in (None, False, {}) and k != "path"}
    return f"; SparseBERT token mask `{json.dumps(shown, sort_keys=True)}` (stored in the export)"


def _attention_lines(model_config: dict[str, Any]) -> list[str]:
    att = model_config.get("attention") or {}
    per_layer = att.get("per_layer")
    if per_layer:
        lines = []
        for i, d in enumerate(per_layer):
            sp = d.get("sparsity", att.get("sparsity"))
            tm = d["token_mask"] if "token_mask" in d else att.get("token_mask")
            lines.append(
                f"- layer {i}: {'dense (full)' if sp is None else json.dumps(sp, sort_keys=True)}"
                f"{_mask_text(tm)}, kernel `{d.get('kernel', att.get('kernel'))}`"
            )
        return lines
    sp = att.get("sparsity")
    what = (
        ("dense (full attention)" if att.get("token_mask") is None else "no block layout")
        if sp is None
        else f"block-sparse `{json.dumps(sp, sort_keys=True)}`"
    )
    return [
        f"- all layers: {what}{_mask_text(att.get('token_mask'))}, trained with kernel `{att.get('kernel', 'auto')}`"
    ]


def _position_lines(model_config: dict[str, Any]) -> list[str]:
    pos = model_config.get("position") or {"type": "absolute"}
    kind = pos.get("type", "absolute")
    if kind == "absolute":
        p = "learned absolute position embeddings at the input (BERT)"
    elif kind == "diet_abs":
        p = (
            f"DIET-ABS positional attention (rank {pos.get('rank')}, sharing {pos.get('sharing')}); no input "
            "position embeddings"
        )
    else:
        p = (
            f"DIET-REL relative positional attention (max distance {pos.get('max_distance')}, sharing "
            f"{pos.get('sharing')}); no input position embeddings"
        )
    seg = model_config.get("segment", "input")
    if not model_config.get("type_vocab_size"):
        s = "none (type_vocab_size 0)"
    elif seg == "per_head":
        s = f"per-head segment attention biases ({model_config['type_vocab_size']} types; DIET)"
    else:
        s = f"token-type embeddings at the input ({model_config['type_vocab_size']} types, BERT)"
    return [f"- positions: {p}", f"- segments: {s}"]


def _head_names() -> str:
    """The Auto classes a custom-code export serves besides AutoConfig and AutoModelForMaskedLM (from AUTO_MAP)."""
    from tools.hf_export.remote_code import AUTO_MAP

    names = [f"`{k}`" for k in AUTO_MAP if k not in ("AutoConfig", "AutoModelForMaskedLM", "AutoModelForPreTraining")]
    return ", ".join(names[:-1]) + " and " + names[-1]


def _uses_blockbert(model_config: dict[str, Any]) -> bool:
    att = model_config.get("attention") or {}
    sps = [att.get("sparsity")] + [d.get("sparsity") for d in att.get("per_layer") or []]
    return any((sp or {}).get("mode") == "blockbert" for sp in sps)


def model_card(
    model_config: dict[str, Any], client: dict[str, Any], source: str, remote_code: bool, extra_config: dict[str, Any]
) -> str:
    """Markdown: attention, sizes, steps and data as recorded in the checkpoint (``unknown`` where absent)."""
    args = client.get("args") or {}
    data, loop, optim = args.get("data") or {}, args.get("loop") or {}, args.get("optim") or {}
    c = model_config
    head = c.get("head_size") or (c["hidden_size"] // c["num_attention_heads"])
    other = {k: v for k, v in extra_config.items() if v not in (None, False, 0, [], {})}
    load = (
        "AutoModelForMaskedLM.from_pretrained(path, trust_remote_code=True)"
        if remote_code
        else "AutoModelForMaskedLM.from_pretrained(path)"
    )
    lines = [
        "---",
        "library_name: transformers",
        "tags: [bert, fill-mask, sparse-attention]" if remote_code else "tags: [bert, fill-mask]",
        "---",
        "",
        "# Sparse-attention BERT encoder",
        "",
        f"Converted from the DeepSpeed checkpoint `{source}` by `python -m tools.convert_checkpoint`.",
        "",
        "## Load",
        "",
        "```python",
        "from transformers import AutoModelForMaskedLM, AutoTokenizer",
        "tok = AutoTokenizer.from_pretrained(path" + (", trust_remote_code=True)" if remote_code else ")"),
        f"model = {load}",
        "```",
        "",
    ]
    if remote_code:
        lines += [
            "The directory carries its modeling code (copied verbatim from the training code, depends only on",
            "torch and transformers), so `trust_remote_code=True` is required.",
            f"{_head_names()} load from it too (fresh heads on the pretrained encoder, to fine-tune).",
            "",
        ]
        if _uses_blockbert(c):
            lines += [
                "BlockBERT cuts a sequence into `num_blocks` chunks of its length: pad fine-tuning inputs to",
                f'{c["max_position_embeddings"]} tokens (`padding="max_length"`) to keep the pretrained chunks',
                "(`python -m tools.finetune` does so by default).",
                "",
            ]
    lines += [
        "## Attention",
        "",
        *_attention_lines(c),
        *_position_lines(c),
        "",
        "## Sizes",
        "",
        f"- layers {c['num_layers']}, hidden {c['hidden_size']}, heads {c['num_attention_heads']} x head size {head}, "
        f"feed-forward {c['intermediate_size']}",
        f"- vocabulary {c['vocab_size']}, max positions {c['max_position_embeddings']}, "
        f"{'pre' if c.get('pre_layer_norm') else 'post'}-LayerNorm, activation {c.get('hidden_act')}, "
        f"NSP head {'yes' if c.get('nsp_head') else 'no'}",
    ]
    if other:
        lines.append(f"- other settings: `{json.dumps(other, sort_keys=True)}`")
    lines += [
        "",
        "## Training",
        "",
        f"- iterations: {client.get('iteration', 'unknown')}, samples consumed: "
        f"{client.get('consumed_train_samples', 'unknown')}, "
        f"data-parallel ranks: {client.get('world_size', 'unknown')}",
        f"- sequence length {data.get('seq_length', 'unknown')}, "
        f"micro batch {loop.get('micro_batch_size', 'unknown')}, "
        f"global batch {loop.get('global_batch_size') or client.get('global_batch') or 'unknown'}, "
        f"peak LR {optim.get('lr', 'unknown')}",
        f"- data: {data.get('data_path', 'unknown')} (sample mode {data.get('sample_mode', 'unknown')}, "
        f"mask prob {data.get('mask_prob', 'unknown')}, "
        f"whole-word masking {data.get('whole_word_masking', 'unknown')})",
        f"- tokenizer: {data.get('tokenizer_type', 'unknown')} "
        f"({data.get('vocab_file') or data.get('tokenizer_model') or 'unknown'})",
        f"- DeepSpeed: {client.get('ds_summary', 'unknown')}",
        "",
    ]
    return "\n".join(lines)
