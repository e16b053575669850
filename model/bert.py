"""Plain-PyTorch BERT encoder with block-sparse attention, MLM head (tied) and optional NSP head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from model.attention.band import BandMask
from model.attention.module import BlockSparseAttention
from model.attention.sparsebert import DAMConfig, DAMMask, build_layer_mask, gated_attention, sparsity
from model.config import ModelConfig
from model.cpu_shortcuts import cpu_all
from model.fused_norm import dropout_add_norm
from model.mlm_loss import chunk_rows, chunked_mlm_loss
from model.positions import AbsolutePositionEmbedding, PositionalAttention
from model.rotary import apply_rotary

_ACT = {"gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu": F.relu}


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor | None
    """mlm_loss + nsp_loss (those given)."""
    mlm_loss: torch.Tensor | None
    nsp_loss: torch.Tensor | None
    logits: torch.Tensor | None
    """Over the real vocabulary (``config.vocab_size``; the padded rows are cut off). Without ``labels``: ``[B, N,
    V]``. With ``labels``: None (the loss is computed in chunks and never holds all logits) unless the forward was
    called with ``return_logits=True``: then ``[T, V]`` for the T positions whose label != -100 (row-major order),
    or ``[B, k, V]`` with ``max_predictions=k`` (each row's labelled positions first, then padding slots)."""
    nsp_logits: torch.Tensor | None
    mlm_correct: torch.Tensor | None
    """Number of masked positions predicted right (argmax over the real vocabulary)."""
    mlm_count: torch.Tensor | None
    """Number of positions with a label."""


@dataclass
class Documents:
    """Packed sequences: the document of every token and its position inside that document."""

    doc_ids_BN: torch.Tensor
    positions_BN: torch.Tensor
    cu_seqlens: torch.Tensor | None = None
    """The batch's runs of equal ids (the collator's; model/attention/kernels/varlen.py), or None."""

    @staticmethod
    def from_ids(doc_ids_BN: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> "Documents":
        """Positions count from 0 at every change of id along a row (a document is a run of equal ids)."""
        B, N = doc_ids_BN.shape
        ar = torch.arange(N, device=doc_ids_BN.device)
        starts = torch.ones_like(doc_ids_BN, dtype=torch.bool)
        starts[:, 1:] = doc_ids_BN[:, 1:] != doc_ids_BN[:, :-1]
        first = torch.where(starts, ar, torch.zeros_like(ar)).cummax(1).values
        return Documents(doc_ids_BN, ar - first, cu_seqlens)


class BertEmbeddings(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size, padding_idx=c.pad_token_id)
        # DIET: positions (and per-head segments) enter the attention logits only, not the input
        self.position_embeddings = (
            AbsolutePositionEmbedding(c.max_position_embeddings, c.hidden_size)
            if c.position.type == "absolute"
            else None
        )
        self.token_type_embeddings = (
            nn.Embedding(c.type_vocab_size, c.hidden_size) if c.type_vocab_size and c.segment == "input" else None
        )
        self.layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias)
        self.dropout = nn.Dropout(c.hidden_dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        positions_BN: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            if positions_BN is None:
                x = x + self.position_embeddings.forward_positions(input_ids.shape[1], input_ids.device)
            else:  # packed sequences: positions restart at every document
                x = x + self.position_embeddings(positions_BN)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.layer_norm(x))


def layer_token_mask(c: ModelConfig, index: int) -> torch.Tensor | BandMask | None:
    """The fixed token mask layer ``index`` applies (bool ``[H, n, n]`` or a BandMask; None without one, and for DAM's
    learned mask), built from the config alone: the layer uses it, and so does the HF export without a model."""
    tm_cfg = c.attention.token_mask_for_layer(index)
    n_mask = c.max_position_embeddings if tm_cfg is None or tm_cfg.seq_len is None else tm_cfg.seq_len
    if n_mask > c.max_position_embeddings:
        raise ValueError(
            f"attention.token_mask.seq_len {n_mask} exceeds max_position_embeddings {c.max_position_embeddings}"
        )
    return build_layer_mask(tm_cfg, c.num_attention_heads, n_mask, index)


class BertSelfAttention(nn.Module):
    """Fused Q/K/V projection to heads x head_size, rotary positions (if configured), the shared attention module,
    output projection back."""

    def __init__(self, c: ModelConfig, kernel: str, sparsity, index: int = 0):
        super().__init__()
        self.num_heads = c.num_attention_heads
        self.head_size = c.attention_head_size
        inner = self.num_heads * self.head_size
        self.qkv = nn.Linear(c.hidden_size, 3 * inner, bias=c.linear_bias)
        self.rope_theta = None  # rotary base of this layer (ModernBERT: global vs local layers differ)
        if c.position.type == "rotary":
            global_ = c.attention.is_global(index)
            self.rope_theta = c.position.rope_theta if global_ else c.position.rope_theta_local
        tm_cfg = c.attention.token_mask_for_layer(index)
        token_mask = layer_token_mask(c, index)
        self.core = BlockSparseAttention(
            sparsity,
            kernel,
            c.max_position_embeddings,
            c.attention_dropout,
            fixed_token_mask=token_mask,
            mask_block=16 if tm_cfg is None else tm_cfg.block,
        )
        self.out_proj = nn.Linear(inner, c.hidden_size, bias=c.linear_bias)

    def forward(
        self,
        x_BND: torch.Tensor,
        key_padding_mask_BN: torch.Tensor | None,
        score_bias=None,
        gate_HNN: torch.Tensor | None = None,
        docs: "Documents | None" = None,
    ) -> torch.Tensor:
        B, N, _ = x_BND.shape
        qkv = self.qkv(x_BND).view(B, N, 3, self.num_heads, self.head_size).permute(2, 0, 3, 1, 4)
        # unbind, not qkv[0..2]: its backward stacks the three gradients into one buffer, where three selects each
        # build a zero-filled [3, B, H, N, D] gradient that autograd then adds up and copies (issue #56)
        q_BHND, k_BHND, v_BHND = qkv.unbind(0)
        if self.rope_theta is not None:
            q_BHND, k_BHND = apply_rotary(q_BHND, k_BHND, self.rope_theta, None if docs is None else docs.positions_BN)
        if docs is not None:
            if gate_HNN is not None:
                raise ValueError("packed sequences (doc_ids) are not supported during the DAM mask search")
            ctx_BHND = self.core(
                q_BHND,
                k_BHND,
                v_BHND,
                key_padding_mask_BN=key_padding_mask_BN,
                score_bias=score_bias,
                doc_ids_BN=docs.doc_ids_BN,
                cu_seqlens=docs.cu_seqlens,
            )
        elif gate_HNN is not None:  # DAM search: probabilities gated by the soft mask (dense by nature)
            drop = self.core.dropout_p if self.training else 0.0
            ctx_BHND = gated_attention(q_BHND, k_BHND, v_BHND, gate_HNN, key_padding_mask_BN, drop, None, score_bias)
        else:
            ctx_BHND = self.core(q_BHND, k_BHND, v_BHND, key_padding_mask_BN=key_padding_mask_BN, score_bias=score_bias)
        return self.out_proj(ctx_BHND.transpose(1, 2).reshape(B, N, -1))


class BertLayer(nn.Module):
    """Attention + feed-forward (standard or GLU), post-LN (BERT) or pre-LN."""

    def __init__(self, c: ModelConfig, index: int):
        super().__init__()
        kernel, sparsity = c.attention.for_layer(index, c.num_attention_heads)
        self.pre_ln = c.pre_layer_norm
        self.attention = BertSelfAttention(c, kernel, sparsity, index)
        # ModernBERT's layer 0 reads the embedding LayerNorm's output as it is (first_attn_norm False)
        skip_norm = index == 0 and not c.first_attn_norm
        self.attn_layer_norm = (
            nn.Identity() if skip_norm else nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias)
        )
        self.glu = c.ffn_type == "glu"
        ffn_in_width = 2 * c.intermediate_size if self.glu else c.intermediate_size
        self.ffn_in = nn.Linear(c.hidden_size, ffn_in_width, bias=c.linear_bias)
        self.ffn_out = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.linear_bias)
        self.ffn_layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias)
        self.dropout = nn.Dropout(c.hidden_dropout)
        self.act = _ACT[c.hidden_act]
        self.fused_norm = c.residual_norm == "triton"  # post-LN only (ModelConfig checks)

    def ffn(self, x_BND: torch.Tensor) -> torch.Tensor:
        """The feed-forward sublayer: ffn_out(act(ffn_in(x))), or with GLU ffn_out(act(input) * gate)."""
        h = self.ffn_in(x_BND)
        if self.glu:
            input_BNI, gate_BNI = h.chunk(2, dim=-1)
            return self.ffn_out(self.act(input_BNI) * gate_BNI)
        return self.ffn_out(self.act(h))

    def forward(
        self,
        x_BND: torch.Tensor,
        key_padding_mask_BN: torch.Tensor | None = None,
        score_bias=None,
        gate_HNN: torch.Tensor | None = None,
        docs: "Documents | None" = None,
    ) -> torch.Tensor:
        if self.pre_ln:
            x_BND = x_BND + self.dropout(
                self.attention(self.attn_layer_norm(x_BND), key_padding_mask_BN, score_bias, gate_HNN, docs)
            )
            return x_BND + self.dropout(self.ffn(self.ffn_layer_norm(x_BND)))
        x_BND = self._dropout_add_norm(
            self.attention(x_BND, key_padding_mask_BN, score_bias, gate_HNN, docs), x_BND, self.attn_layer_norm
        )
        return self._dropout_add_norm(self.ffn(x_BND), x_BND, self.ffn_layer_norm)

    def _dropout_add_norm(self, out_BND: torch.Tensor, residual_BND: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """``norm(dropout(out) + residual)``: eager, or one Triton kernel (ModelConfig.residual_norm)."""
        return dropout_add_norm(out_BND, residual_BND, norm, self.dropout.p, self.training, self.fused_norm)


class BertEncoder(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.layers = nn.ModuleList(BertLayer(c, i) for i in range(c.num_layers))
        self.final_layer_norm = (
            nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias) if c.pre_layer_norm else None
        )

    def forward(
        self,
        x_BND: torch.Tensor,
        key_padding_mask_BN: torch.Tensor | None,
        biases=None,
        gates_LHNN: torch.Tensor | None = None,
        docs: "Documents | None" = None,
    ) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            gate = None if gates_LHNN is None else gates_LHNN[0 if gates_LHNN.shape[0] == 1 else i]
            x_BND = layer(x_BND, key_padding_mask_BN, None if biases is None else biases[i], gate, docs)
        return x_BND if self.final_layer_norm is None else self.final_layer_norm(x_BND)


class BertModel(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.embeddings = BertEmbeddings(c)
        self.encoder = BertEncoder(c)
        self.positional_attention = None
        if c.position.type not in ("absolute", "rotary") or c.segment == "per_head":
            self.positional_attention = PositionalAttention(
                c.position,
                c.segment,
                c.num_layers,
                c.num_attention_heads,
                c.max_position_embeddings,
                c.type_vocab_size,
                c.initializer_range,
            )
        self.dam = None
        dam = c.attention.dam()
        if dam is not None:
            n = dam.seq_len or c.max_position_embeddings
            dcfg = DAMConfig.from_dict(dam.params.dam)
            self.dam = DAMMask(dcfg, 1 if dcfg.share_layers else c.num_layers, c.num_attention_heads, n)

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None, doc_ids=None, cu_seqlens=None
    ) -> torch.Tensor:
        """``doc_ids`` (int ``[B, N]``): packed sequences, several documents per row; attention stays inside each
        document and positions (absolute embeddings, rotary) restart at every document, so a packed row computes
        what each of its documents would compute alone. ``cu_seqlens``: the same documents as runs of the flattened
        batch (the collator's), for dense attention's varlen route."""
        kpm = None
        if attention_mask is not None:
            kpm = attention_mask.to(torch.bool)
            if cpu_all(kpm):
                kpm = None  # no padding: unmasked fused attention (on GPUs the check would wait for the device;
                # the trainer drops an all-ones mask on the host instead)
        B, N = input_ids.shape
        docs = None
        if doc_ids is not None:
            if self.positional_attention is not None:
                raise ValueError(
                    "packed sequences (doc_ids) need absolute or rotary positions: DIET's positional attention and "
                    "per-head segments do not restart per document; use a non-packed sample mode"
                )
            cu = None if cu_seqlens is None else cu_seqlens.to(input_ids.device, torch.int32)  # FlashAttention's
            docs = Documents.from_ids(doc_ids.to(input_ids.device), cu)
        biases = None
        if self.positional_attention is not None:
            biases = self.positional_attention.biases(self.positional_attention(N, token_type_ids, B))
        gates = None
        if self.dam is not None:
            if N > self.dam.n:
                raise ValueError(
                    f"sequence length {N} exceeds the DAM mask length {self.dam.n}; raise attention.token_mask.seq_len"
                )
            gates = self.dam()
        positions = None if docs is None else docs.positions_BN
        return self.encoder(self.embeddings(input_ids, token_type_ids, positions), kpm, biases, gates, docs)


class MLMTransform(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.hidden_size, bias=c.linear_bias)
        self.layer_norm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps, bias=c.norm_bias)
        self.act = _ACT[c.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer_norm(self.act(self.dense(x)))


class PreTrainingHeads(nn.Module):
    def __init__(self, c: ModelConfig):
        super().__init__()
        self.transform = MLMTransform(c)
        self.bias = nn.Parameter(torch.zeros(c.vocab_size))  # decoder weight is tied to the word embeddings
        self.pooler = nn.Linear(c.hidden_size, c.hidden_size) if c.nsp_head else None
        self.seq_relationship = nn.Linear(c.hidden_size, 2) if c.nsp_head else None


class BertForPreTraining(nn.Module):
    """BERT with the MLM head (decoder tied to word embeddings) and, if configured, the NSP head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = PreTrainingHeads(config)
        self.apply(self._init_weights)
        self.mlm_chunk_rows = chunk_rows(config.padded_vocab_size)
        """Predicted rows per chunk of the MLM loss (model.mlm_loss); 0: the plain loss over whole logits (what
        pretrain/parallelize.py sets where a recomputed chunk cannot read the decoder weight again: ZeRO-3)."""

    def _init_weights(self, m: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
            if m.padding_idx is not None:
                with torch.no_grad():
                    m.weight[m.padding_idx].zero_()
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)

    def mlm_decoder(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The decoder's (weight, bias): the word embeddings and ``cls.bias`` with zero rows up to
        ``config.padded_vocab_size`` (pad_vocab_multiple). The padding lives only here, for the GEMMs (aligned
        tensor-core kernels: 30522 rows are not a multiple of 8); parameters, checkpoints and exports keep the real
        vocabulary, and :meth:`mlm_logits` cuts the padded logits off. In the parameters' dtype (autocast casts it),
        so the chunks' weight gradients add up in that dtype."""
        w_VD, b_V = self.bert.embeddings.word_embeddings.weight, self.cls.bias
        pad = self.config.padded_vocab_size - self.config.vocab_size
        if pad == 0:
            return w_VD, b_V
        return F.pad(w_VD, (0, 0, 0, pad)), F.pad(b_V, (0, pad))

    def mlm_logits(
        self, hidden: torch.Tensor, decoder: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> torch.Tensor:
        """The MLM head's logits over the real vocabulary (``decoder``: :meth:`mlm_decoder`'s, built here when not
        given); no padded row can win an argmax or enter a loss."""
        w_PD, b_P = self.mlm_decoder() if decoder is None else decoder
        logits = F.linear(self.cls.transform(hidden), w_PD, b_P)
        V = self.config.vocab_size
        return logits if logits.shape[-1] == V else logits[..., :V]

    def _mlm_loss(
        self, hidden_TD: torch.Tensor, targets_T: torch.Tensor, valid_T: torch.Tensor, return_logits: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(summed loss over the valid rows, number predicted right, logits or None): chunked (model.mlm_loss), or
        with ``return_logits`` the plain loss over logits kept whole (the reference the chunked loss is tested
        against; also without chunks, ``mlm_chunk_rows`` 0)."""
        if not return_logits and self.mlm_chunk_rows:
            # each chunk pads the decoder itself (recomputed with it): a padded copy built once would be kept for
            # the backward, 90 MB at bert-base in fp32, more than the log-softmax of a small batch
            total, correct = chunked_mlm_loss(self.mlm_logits, hidden_TD, targets_T, valid_T, self.mlm_chunk_rows)
            return total, correct, None
        logits_TV = self.mlm_logits(hidden_TD)
        ce_T = F.cross_entropy(logits_TV.float(), targets_T, reduction="none")
        correct = ((logits_TV.detach().argmax(-1) == targets_T) & valid_T).sum()
        return (ce_T * valid_T).sum(), correct, logits_TV if return_logits else None

    def _mlm_static(self, hidden_BND: torch.Tensor, labels_BN: torch.Tensor, k: int, return_logits: bool = False):
        """MLM loss over the labelled positions of each row, gathered into k slots per row with fixed shapes [B, k].

        A row with more than k labels is an error (a device-side assert, no sync), never a silent loss of labels:
        the data pipeline caps every row at the same k (DataConfig.max_predictions). Unused slots are masked out of
        the loss and the counts."""
        B, N = labels_BN.shape
        k = min(int(k), N)
        sel_BN = labels_BN.ne(-100)
        torch._assert_async(sel_BN.sum(1).max() <= k, "a row has more labelled positions than max_predictions")
        # labelled positions first, in order (a stable sort of the 0/1 "unlabelled" flag)
        pos_Bk = torch.sort((~sel_BN).to(torch.uint8), dim=1, stable=True).indices[:, :k]
        valid_Bk = torch.gather(sel_BN, 1, pos_Bk)
        hidden_BkD = torch.gather(hidden_BND, 1, pos_Bk[..., None].expand(B, k, hidden_BND.shape[-1]))
        targets_Bk = torch.gather(labels_BN, 1, pos_Bk).masked_fill(~valid_Bk, 0)
        total, correct, logits = self._mlm_loss(
            hidden_BkD.flatten(0, 1), targets_Bk.flatten(), valid_Bk.flatten(), return_logits
        )
        count = valid_Bk.sum()
        loss = total / count.clamp(min=1)
        if logits is not None:
            logits = logits.view(B, k, -1)  # slots past a row's labels are padding
        return loss, correct, count, logits

    def forward(
        self,
        input_ids,
        attention_mask=None,
        token_type_ids=None,
        labels=None,
        next_sentence_label=None,
        max_predictions: int | None = None,
        doc_ids=None,
        cu_seqlens=None,
        return_logits: bool = False,
    ) -> PreTrainingOutput:
        """``max_predictions``: at most this many labelled positions per row (the data pipeline's
        max_predictions_per_seq). Given, the MLM head gathers exactly B x max_predictions positions (static
        shapes, no host sync: torch.compile keeps it in one graph); without it, the labelled positions are
        selected by a boolean mask (dynamic shape, one device-to-host sync). With ``labels`` the loss is computed in
        chunks and no logits are returned, unless ``return_logits`` (the plain loss over whole logits)."""
        hidden_BND = self.bert(input_ids, attention_mask, token_type_ids, doc_ids, cu_seqlens)
        mlm_loss = mlm_correct = mlm_count = None
        if labels is not None and max_predictions is not None:
            mlm_loss, mlm_correct, mlm_count, logits = self._mlm_static(
                hidden_BND, labels, max_predictions, return_logits
            )
        elif labels is not None:
            # only the labelled positions go through the transform and the vocab-sized decoder
            sel = labels.ne(-100)
            targets = labels[sel]
            total, mlm_correct, logits = self._mlm_loss(
                hidden_BND[sel], targets, torch.ones_like(targets, dtype=torch.bool), return_logits
            )
            mlm_count = sel.sum()
            mlm_loss = total / mlm_count.clamp(min=1)  # 0 (with gradients) when no position has a label
        else:
            logits = self.mlm_logits(hidden_BND)
        nsp_logits = nsp_loss = None
        if self.cls.pooler is not None:
            pooled = torch.tanh(self.cls.pooler(hidden_BND[:, 0]))
            nsp_logits = self.cls.seq_relationship(pooled)
            if next_sentence_label is not None:
                nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label.view(-1))
        elif next_sentence_label is not None:
            raise ValueError("next_sentence_label given but the model has no NSP head (set nsp_head: true)")
        losses = [x for x in (mlm_loss, nsp_loss) if x is not None]
        loss = sum(losses[1:], losses[0]) if losses else None
        return PreTrainingOutput(loss, mlm_loss, nsp_loss, logits, nsp_logits, mlm_correct, mlm_count)

    def build_attention_plans(
        self, seq_len: int, device: torch.device | str, dtype: torch.dtype = torch.float32
    ) -> list[str]:
        """Build every attention layer's kernel plan for ``dtype`` inputs of ``seq_len`` on ``device`` ahead of the
        first forward: call it before torch.compile, so the plans (host-side layout work) stay out of the graph.
        Returns ``auto``'s distinct choices, one line each (the trainer prints them at start)."""
        lines = [
            m.build_plan(seq_len, torch.device(device), dtype)
            for m in self.modules()
            if isinstance(m, BlockSparseAttention)
        ]
        return list(dict.fromkeys(line for line in lines if line is not None))

    def auxiliary_loss(self) -> torch.Tensor | None:
        """Sum of ``auxiliary_loss()`` of submodules that have one (DAM's L1 term); None if none do."""
        terms = [m.auxiliary_loss() for m in self.modules() if m is not self and hasattr(m, "auxiliary_loss")]
        terms = [t for t in terms if t is not None]
        return sum(terms[1:], terms[0]) if terms else None

    def layout_state(self) -> dict:
        """Every layer's master layout (random layouts must be saved with checkpoints)."""
        return {f"layer{i}": layer.attention.core.layout_state() for i, layer in enumerate(self.bert.encoder.layers)}

    def load_layout_state(self, state: dict) -> None:
        want = {f"layer{i}" for i in range(len(self.bert.encoder.layers))}
        if set(state) != want:
            raise ValueError(f"layout state has keys {sorted(state)}, expected {sorted(want)}")
        for i, layer in enumerate(self.bert.encoder.layers):
            layer.attention.core.load_layout_state(state[f"layer{i}"])

    # -- SparseBERT masks: what the trainer logs and exports ------------------------------------------------------
    def mask_parameters(self) -> list[nn.Parameter]:
        """The parameters :meth:`mask_stats` and :meth:`export_learned_masks` read outside a forward (DAM's alpha): a
        wrapper that partitions parameters (ZeRO-3) must gather these around those calls."""
        return [] if self.bert.dam is None else list(self.bert.dam.parameters())

    def mask_stats(self) -> dict[str, float]:
        """Scalars to log: DAM's current binarised sparsity (overall and per head) and mean mask value; for fixed
        token masks each layer's sparsity and block-layout density. Empty when the model has no token mask."""
        out: dict[str, float] = {}
        if self.bert.dam is not None:
            out.update(self.bert.dam.stats())
        for i, layer in enumerate(self.bert.encoder.layers):
            core = layer.attention.core
            if core.fixed_token_mask is not None:
                n = core.max_seq_length
                tm = core.fixed_token_mask
                out[f"token_mask/layer{i}_sparsity"] = sparsity(
                    tm.resized(n) if isinstance(tm, BandMask) else tm[:, :n, :n]
                )
                lay = core.master_layout
                out[f"token_mask/layer{i}_block_density"] = int(torch.count_nonzero(lay)) / lay.numel()
        return out

    def export_learned_masks(self) -> dict[str, torch.Tensor]:
        """DAM's binarised mask, ``{"layer{i}": bool [H, n, n]}`` (alpha > 0, or dam.prune_fraction pruned); save it
        with :func:`model.attention.sparsebert.save_masks` and train stage 2 with ``attention.token_mask =
        {"pattern": "file", "path": ..., "seq_len": n}`` on any kernel."""
        if self.bert.dam is None:
            raise ValueError("this model has no learned mask (attention.token_mask.pattern is not 'dam')")
        keep = self.bert.dam.binarize()
        L = len(self.bert.encoder.layers)
        return {f"layer{i}": keep[0 if keep.shape[0] == 1 else i].clone() for i in range(L)}
