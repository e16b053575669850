"""A SentencePiece model (``data_pipeline.train_tokenizer --model-type unigram``) as a Hugging Face fast tokenizer.

transformers' own ``SpmConverter`` builds the ``tokenizers`` pipeline (precompiled normaliser, Metaspace, Unigram)
from the model proto; ids match ``sentencepiece`` exactly (tests/test_hf_export.py compares them). BERT-style
``[CLS] A [SEP] B [SEP]`` templates are added so the directory works for classification and QA. SentencePiece BPE
models are not converted: transformers 5.23's converter fails on them (its BPE branch passes the vocab scores where
the model type is expected), so only ``spm.model`` is exported for those.
"""

from __future__ import annotations

from pathlib import Path


class _SpmFile:
    """The two attributes SpmConverter reads from a slow tokenizer."""

    def __init__(self, path: str) -> None:
        self.vocab_file = path
        self.legacy = True
        self.add_prefix_space = True


def spm_model_type(path: str) -> str:
    from transformers.convert_slow_tokenizer import import_protobuf  # the proto module the converter uses too

    proto = import_protobuf().ModelProto()
    proto.ParseFromString(Path(path).read_bytes())
    return {1: "unigram", 2: "bpe", 3: "word", 4: "char"}.get(proto.trainer_spec.model_type, "unknown")


def save_spm_as_hf(path: str, out_dir: str | Path, specials: dict[str, str], max_len: int) -> list[str]:
    """Write tokenizer.json / tokenizer_config.json for a unigram SentencePiece model; returns the files."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import SpmConverter

    backend = SpmConverter(_SpmFile(path)).converted()
    cls, sep = specials["cls_token"], specials["sep_token"]
    backend.post_processor = TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, backend.token_to_id(cls)), (sep, backend.token_to_id(sep))],
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=max_len,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
        **specials,
    )
    return [Path(f).name for f in tok.save_pretrained(str(out_dir))]
