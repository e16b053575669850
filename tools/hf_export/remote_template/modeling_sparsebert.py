"""Hugging Face wrappers around our own BERT code (the ``ours_*.py`` files next to this one are verbatim copies of
the training code, so the attention is exactly what was trained). Depends on torch and transformers only."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.modeling_outputs import (
    BaseModelOutput,
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from .configuration_sparsebert import SparseBertConfig
from .ours_attention_module import BlockSparseAttention
from .ours_bert import BertModel, PreTrainingHeads


class SparseBertPreTrainedModel(PreTrainedModel):
    config_class = SparseBertConfig
    base_model_prefix = "sparsebert"
    main_input_name = "input_ids"

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
            if module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, PreTrainingHeads):
            module.bias.zero_()
        elif isinstance(module, BlockSparseAttention) and module.sparsity_config is not None:
            # non-persistent buffers: rebuild them; the trained layout and token mask are restored from
            # sparse_layouts / token_masks at forward
            sc = module.sparsity_config
            module.master_layout = sc.make_layout(sc.padded_length(module.max_seq_length)).to(
                module.master_layout.device if not module.master_layout.is_meta else "cpu"
            )
            if module.fixed_token_mask is not None and module.fixed_token_mask.is_meta:
                module.fixed_token_mask = torch.zeros(
                    module.fixed_token_mask.shape, dtype=torch.bool, device=module.master_layout.device
                )
            module._plans.clear()


class SparseBertModel(SparseBertPreTrainedModel):
    """Our encoder; ``sparse_layouts.layer{i}`` keeps each sparse layer's trained master layout and
    ``token_masks.layer{i}`` its SparseBERT token mask (bool [H, n, n])."""

    _keys_to_ignore_on_load_unexpected = [r"^cls\."]  # the MLM head, when loading the encoder alone

    def __init__(self, config: SparseBertConfig):
        super().__init__(config)
        built = config.build_config()
        self.bert = BertModel(built)
        self.token_masks = nn.Module()
        for name, n in sorted((config.token_mask_lengths or {}).items()):
            self.token_masks.register_buffer(
                name, torch.zeros(built.num_attention_heads, int(n), int(n), dtype=torch.bool)
            )
        self.sparse_layouts = nn.Module()
        for i, layer in enumerate(self.bert.encoder.layers):
            lay = layer.attention.core.master_layout  # may live on the meta device while HF builds the model
            if lay is not None:
                self.sparse_layouts.register_buffer(f"layer{i}", lay.detach().clone())
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.bert.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.bert.embeddings.word_embeddings = value

    def _sync_layouts(self) -> None:
        for name, saved in self.token_masks.named_buffers():
            core = self.bert.encoder.layers[int(name[len("layer") :])].attention.core
            n = saved.shape[-1]
            p = core.sparsity_config.padded_length(n) - n
            want = F.pad(saved.detach().bool(), (0, p, 0, p), value=False)
            cur = core.fixed_token_mask
            if cur is not None and not isinstance(cur, torch.Tensor):  # a band (a window kept as its radius)
                if tuple(cur.shape) == tuple(want.shape) and torch.equal(cur.dense(want.device), want):
                    continue  # the saved mask is this band: keep it sparse
                cur = None
            if cur is None or cur.is_meta or cur.shape != want.shape or not torch.equal(cur, want.to(cur.device)):
                core.fixed_token_mask = want.to(saved.device)
                core.max_seq_length = n
                core._plans.clear()
                core._layout_version += 1
        for name, saved in self.sparse_layouts.named_buffers():
            core = self.bert.encoder.layers[int(name[len("layer") :])].attention.core
            if core.master_layout is None or core.master_layout.is_meta or core.master_layout.shape != saved.shape:
                core.master_layout = saved.detach().clone()
                core._plans.clear()
                core._layout_version += 1
            elif not torch.equal(core.master_layout, saved.to(core.master_layout.device)):
                core.load_layout_state(saved.detach())

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, return_dict=None, **kwargs):
        self._sync_layouts()
        hidden = self.bert(input_ids, attention_mask, token_type_ids)
        if return_dict is False:
            return (hidden,)
        return BaseModelOutput(last_hidden_state=hidden)


class SparseBertForMaskedLM(SparseBertPreTrainedModel):
    """MLM head of pre-training (decoder tied to the word embeddings, as in training)."""

    _keys_to_ignore_on_load_unexpected = [r"^cls\.(pooler|seq_relationship)\."]

    def __init__(self, config: SparseBertConfig):
        super().__init__(config)
        self.sparsebert = SparseBertModel(config)
        self.cls = PreTrainingHeads(config.model_config())
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.sparsebert.get_input_embeddings()

    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, return_dict=None, **kwargs
    ):
        hidden = self.sparsebert(input_ids, attention_mask, token_type_ids).last_hidden_state
        word = self.sparsebert.bert.embeddings.word_embeddings.weight
        logits = F.linear(self.cls.transform(hidden), word, self.cls.bias)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), labels.view(-1), ignore_index=-100)
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return MaskedLMOutput(loss=loss, logits=logits)


class SparseBertForSequenceClassification(SparseBertPreTrainedModel):
    """[CLS] -> dense + tanh (BERT's pooler) -> dropout -> linear; cross-entropy, or MSE when num_labels == 1."""

    _keys_to_ignore_on_load_unexpected = [r"^cls\."]

    def __init__(self, config: SparseBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.sparsebert = SparseBertModel(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, return_dict=None, **kwargs
    ):
        hidden = self.sparsebert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.classifier(self.dropout(torch.tanh(self.pooler(hidden[:, 0]))))
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                loss = F.cross_entropy(logits.float(), labels.view(-1))
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class SparseBertForQuestionAnswering(SparseBertPreTrainedModel):
    """Start/end span heads (one linear layer to 2 logits per token), BERT's SQuAD setup."""

    _keys_to_ignore_on_load_unexpected = [r"^cls\."]

    def __init__(self, config: SparseBertConfig):
        super().__init__(config)
        self.sparsebert = SparseBertModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        start_positions=None,
        end_positions=None,
        return_dict=None,
        **kwargs,
    ):
        hidden = self.sparsebert(input_ids, attention_mask, token_type_ids).last_hidden_state
        start_logits, end_logits = self.qa_outputs(hidden).split(1, dim=-1)
        start_logits, end_logits = start_logits.squeeze(-1).contiguous(), end_logits.squeeze(-1).contiguous()
        loss = None
        if start_positions is not None and end_positions is not None:
            n = start_logits.shape[1]
            s, e = start_positions.view(-1).clamp(0, n), end_positions.view(-1).clamp(0, n)
            loss = (
                F.cross_entropy(start_logits.float(), s, ignore_index=n)
                + F.cross_entropy(end_logits.float(), e, ignore_index=n)
            ) / 2
        if return_dict is False:
            out = (start_logits, end_logits)
            return out if loss is None else (loss, *out)
        return QuestionAnsweringModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits)


class SparseBertForTokenClassification(SparseBertPreTrainedModel):
    """Per-token labels (NER, POS): dropout -> linear on every hidden state, as transformers'
    BertForTokenClassification; cross-entropy over the positions whose label is not -100."""

    _keys_to_ignore_on_load_unexpected = [r"^cls\."]

    def __init__(self, config: SparseBertConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.sparsebert = SparseBertModel(config)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, return_dict=None, **kwargs
    ):
        hidden = self.sparsebert(input_ids, attention_mask, token_type_ids).last_hidden_state
        logits = self.classifier(self.dropout(hidden))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.view(-1, self.num_labels).float(), labels.view(-1), ignore_index=-100)
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return TokenClassifierOutput(loss=loss, logits=logits)


class SparseBertForMultipleChoice(SparseBertPreTrainedModel):
    """SWAG-style multiple choice, as transformers' BertForMultipleChoice: inputs ``[batch, choices, length]``, each
    choice encoded on its own, [CLS] -> dense + tanh (BERT's pooler) -> dropout -> linear to one score;
    cross-entropy over the choices."""

    _keys_to_ignore_on_load_unexpected = [r"^cls\."]

    def __init__(self, config: SparseBertConfig):
        super().__init__(config)
        self.sparsebert = SparseBertModel(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, return_dict=None, **kwargs
    ):
        B, C, N = input_ids.shape

        def flat(t):
            return None if t is None else t.reshape(B * C, N)

        hidden = self.sparsebert(flat(input_ids), flat(attention_mask), flat(token_type_ids)).last_hidden_state
        logits = self.classifier(self.dropout(torch.tanh(self.pooler(hidden[:, 0])))).view(B, C)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float(), labels.view(-1))
        if return_dict is False:
            return (logits,) if loss is None else (loss, logits)
        return MultipleChoiceModelOutput(loss=loss, logits=logits)
