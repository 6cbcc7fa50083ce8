"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), Section 3, in stock torch ops.

Reads in the order data flows (the configuration and named architectures are in
`nmt.model.config`, which needs no torch): sinusoidal positions (3.5), scaled embeddings
(3.4), multi-head attention (3.2.2), the position-wise feed-forward network (3.3), encoder and
decoder layers with residual dropout and layer norm (3.1, 5.4), then the encoder-decoder model
with incremental decoding for beam search (its state: `nmt.model.incremental`).

Residual blocks are post-LN as in the paper: LayerNorm(x + Dropout(Sublayer(x))); `pre_ln`
gives x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm, as tensor2tensor's later
default and fairseq's `--encoder-normalize-before`.

Only stock ops appear here (`nn.Linear`, `nn.LayerNorm`, `nn.Dropout`,
`F.scaled_dot_product_attention`). Faster or leaner equivalents for one device live in
`nmt.ops`; `nmt.ops.optimize_for` swaps them in, keeping every parameter and checkpoint key.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.config import TransformerConfig
from nmt.model.incremental import Cache, DecoderState, SelfAttentionCache


def sinusoidal_positions(n_positions: int, d_model: int, layout: str = "interleaved") -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...)  (Section 3.5).

    `layout` "halves" puts the same values in another order, as Marian / OPUS-MT does: the
    sines of every frequency in the first half of the dimensions, their cosines in the second."""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    if layout == "halves":
        return torch.cat([torch.sin(pos * inv_freq), torch.cos(pos * inv_freq[: d_model // 2])], dim=1).float()
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq)
    return pe.float()


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, each head scaled dot-product (3.2).

    Self-attention projects Q, K, V with one matrix; encoder-decoder attention projects K, V
    of the encoder output with one matrix, once per sentence.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, self_attention: bool):
        super().__init__()
        self.n_heads, self.d_head, self.dropout = n_heads, d_model // n_heads, dropout
        self.self_attention = self_attention
        if self_attention:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        else:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        for lin in self.modules():
            if isinstance(lin, nn.Linear):
                nn.init.xavier_uniform_(lin.weight)
                nn.init.zeros_(lin.bias)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                  is_causal: bool = False) -> Tensor:
        """Attention(Q, K, V) = softmax(QK^T / sqrt(d_k)) V  (3.2.1), per head: (B, h, T, d_head).
        `attn_mask` is True where attention is allowed."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)

    def attention_weights(self, x: Tensor, kv: tuple[Tensor, Tensor], attn_mask: Optional[Tensor] = None) -> Tensor:
        """softmax(QK^T / sqrt(d_k)) of encoder-decoder attention, (B, h, T, S): what each
        query position attends to in the source, for word alignments (`nmt.inference.word_alignment`).
        `attention` never materialises these weights (the fused kernel does not return them)."""
        q = self._heads(self.q_proj(x))
        scores = q @ kv[0].transpose(-2, -1) / math.sqrt(self.d_head)
        if attn_mask is not None:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        return scores.softmax(-1)

    def _heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, h, T, d_head)

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output, (B, h, S, d_head) each."""
        k, v = self.kv_proj(memory).chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def forward(
        self,
        x: Tensor,
        kv: Optional[tuple[Tensor, Tensor]] = None,
        attn_mask: Optional[Tensor] = None,
        is_causal: bool = False,
        cache: Optional[SelfAttentionCache] = None,
    ) -> Tensor:
        """x: (B, T, d_model). Self-attention uses x for K, V (written into `cache` when
        decoding step by step); encoder-decoder attention takes precomputed `kv`, which may
        hold one entry per sentence for B = sentences x beam rows (a sentence's rows are
        adjacent): the rows then share their sentence's keys, never copied per row."""
        B, T, D = x.shape
        if self.self_attention:
            q, k, v = (self._heads(t) for t in self.qkv_proj(x).chunk(3, dim=-1))
            if cache is not None:
                k, v = cache.append(k, v)
        else:
            q = self._heads(self.q_proj(x))
            k, v = kv
            n_sent = k.size(0)
            if n_sent != B:  # beam rows grouped by sentence: (N, h, beam * T, d_head) queries
                beam = B // n_sent
                q = q.view(n_sent, beam, self.n_heads, T, self.d_head).transpose(1, 2).reshape(n_sent, self.n_heads, beam * T, self.d_head)
                out = self.attention(q, k, v, attn_mask=attn_mask)
                out = out.view(n_sent, self.n_heads, beam, T, self.d_head).permute(0, 2, 3, 1, 4)  # (N, beam, T, h, d_head)
                return self.out_proj(out.reshape(B, T, D))
        out = self.attention(q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, D))  # (B, T, d_model)


ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}
"""The feed-forward network's activations by `TransformerConfig.activation`."""


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2  (Section 3.3), with dropout on the ReLU's output
    (tensor2tensor's relu_dropout). `activation` swish (x * sigmoid(x)) or gelu replaces the
    ReLU, as Marian / OPUS-MT and BERT-style models do."""

    def __init__(self, d_model: int, d_ff: int, relu_dropout: float, activation: str = "relu"):
        super().__init__()
        self.activation = activation
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(relu_dropout)
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(ACTIVATIONS[self.activation](self.fc1(x))))


class Residual(nn.Module):
    """Residual dropout and layer norm around one sublayer (Sections 3.1 and 5.4)."""

    def __init__(self, d_model: int, dropout: float, pre_ln: bool):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.pre_ln = pre_ln

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_ln:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, self_attention=True)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.relu_dropout, cfg.activation)
        self.attn_block = Residual(cfg.d_model, cfg.dropout, cfg.pre_ln)
        self.ffn_block = Residual(cfg.d_model, cfg.dropout, cfg.pre_ln)

    def forward(self, x: Tensor, attn_mask: Optional[Tensor]) -> Tensor:
        x = self.attn_block(x, lambda h: self.self_attn(h, attn_mask=attn_mask))
        return self.ffn_block(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, self_attention=True)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, self_attention=False)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.relu_dropout, cfg.activation)
        self.self_block = Residual(cfg.d_model, cfg.dropout, cfg.pre_ln)
        self.cross_block = Residual(cfg.d_model, cfg.dropout, cfg.pre_ln)
        self.ffn_block = Residual(cfg.d_model, cfg.dropout, cfg.pre_ln)

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        memory_mask: Optional[Tensor],
        cache: Optional[SelfAttentionCache] = None,
    ) -> Tensor:
        # Targets are right-padded, so the causal mask alone keeps real positions off padding.
        # (Teacher forcing: queries and keys are the same positions; a one-position causal mask is no mask.)
        causal = cache is None
        x = self.self_block(x, lambda h: self.self_attn(h, is_causal=causal, cache=cache))
        x = self.cross_block(x, lambda h: self.cross_attn(h, kv=memory_kv, attn_mask=memory_mask))
        return self.ffn_block(x, self.ffn)

    def cross_attention_weights(self, x: Tensor, memory_kv: tuple[Tensor, Tensor], memory_mask: Optional[Tensor]) -> Tensor:
        """The encoder-decoder attention weights (B, h, T, S) this layer computes for input x
        (teacher forcing): its self-attention block, then the queries its cross-attention forms."""
        x = self.self_block(x, lambda h: self.self_attn(h, is_causal=True))
        h = self.cross_block.norm(x) if self.cross_block.pre_ln else x
        return self.cross_attn.attention_weights(h, memory_kv, memory_mask)


def word_dropout(embeddings: Tensor, p: float, training: bool) -> Tensor:
    """Word dropout: each token's whole embedding (B, T, d) zeroed with probability p, the
    others scaled by 1 / (1 - p), in training only. Not in the paper: Marian's --dropout-src /
    --dropout-trg, one of the regularisers Sennrich & Zhang (2019) found to pay on small
    corpora. The positional encoding added after it is kept, so the model still sees where a
    dropped word was."""
    if not training or p == 0.0:
        return embeddings
    return F.dropout1d(embeddings, p, True)  # (N, C, L) = (B, T, d): channel t of sentence b is one token


class EncoderOut(NamedTuple):
    states: Tensor  # (B, S, d_model)
    attn_mask: Optional[Tensor]  # (B, 1, 1, S) bool, True where attention is allowed


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Figure 1) with shared, sqrt(d_model)-scaled embeddings."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d = cfg.d_model
        pad = cfg.pad_id
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=pad)
        nn.init.normal_(self.src_embed.weight, mean=0.0, std=d**-0.5)
        nn.init.zeros_(self.src_embed.weight[pad])
        if cfg.share_all_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=pad)
            nn.init.normal_(self.tgt_embed.weight, mean=0.0, std=d**-0.5)
            nn.init.zeros_(self.tgt_embed.weight[pad])
        if cfg.share_all_embeddings or cfg.share_decoder_input_output_embed:
            self.output_proj = None
        else:
            self.output_proj = nn.Linear(d, cfg.tgt_vocab_size, bias=False)
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=d**-0.5)
        # Marian's final_logits_bias; absent (not a zero vector) by default, so checkpoints keep their keys
        self.output_bias = nn.Parameter(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None
        self.register_buffer("positions", sinusoidal_positions(cfg.max_positions, d, cfg.positions_layout), persistent=False)
        self.embed_scale = math.sqrt(d)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.encoder_norm = nn.LayerNorm(d) if cfg.pre_ln else None
        self.decoder_norm = nn.LayerNorm(d) if cfg.pre_ln else None
        self.dropout = nn.Dropout(cfg.dropout)

    # -- embeddings ---------------------------------------------------------------------
    def _embed(self, table: nn.Embedding, tokens: Tensor, start: int = 0, word_dropout_p: float = 0.0) -> Tensor:
        """Dropout(sqrt(d_model) * E[tokens] + PE[positions])  (Sections 3.4, 3.5, 5.4), with
        whole token embeddings dropped at `word_dropout_p` in training (`word_dropout`)."""
        T = tokens.size(1)
        x = word_dropout(table(tokens), word_dropout_p, self.training) * self.embed_scale + self.positions[start : start + T]
        return self.dropout(x)

    @property
    def output_weight(self) -> Tensor:
        """Pre-softmax projection (vocab, d_model): the target embedding when shared."""
        return self.output_proj.weight if self.output_proj is not None else self.tgt_embed.weight

    # -- encoder ------------------------------------------------------------------------
    def source_mask(self, src_tokens: Tensor) -> Optional[Tensor]:
        """(B, 1, 1, S) bool, True where attention is allowed: at every source position but padding."""
        return src_tokens.ne(self.cfg.pad_id)[:, None, None, :]

    def encode(self, src_tokens: Tensor) -> EncoderOut:
        """src_tokens: (B, S) right-padded with cfg.pad_id, eos-terminated."""
        attn_mask = self.source_mask(src_tokens)
        x = self._embed(self.src_embed, src_tokens, word_dropout_p=self.cfg.dropout_src)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return EncoderOut(x, attn_mask)

    # -- decoder ------------------------------------------------------------------------
    def decode_hidden(self, prev_tokens: Tensor, enc: EncoderOut) -> Tensor:
        """Teacher-forced decoder states (B, T, d_model) for bos-prefixed target prefixes."""
        x = self._embed(self.tgt_embed, prev_tokens, word_dropout_p=self.cfg.dropout_trg)
        for layer in self.decoder_layers:
            x = layer(x, layer.cross_attn.project_kv(enc.states), enc.attn_mask)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x

    def cross_attention(self, src_tokens: Tensor, prev_tokens: Tensor, layer: int) -> Tensor:
        """Encoder-decoder attention weights of decoder layer `layer` (negative: from the end),
        averaged over its heads, (B, T, S): row t is what the prediction of target token t
        attended to. Teacher-forced, so it runs the decoder layers up to `layer` only."""
        enc = self.encode(src_tokens)
        x = self._embed(self.tgt_embed, prev_tokens)
        last = self.decoder_layers[range(len(self.decoder_layers))[layer]]  # an IndexError names a bad layer
        for dec in self.decoder_layers:
            kv = dec.cross_attn.project_kv(enc.states)
            if dec is last:
                return dec.cross_attention_weights(x, kv, enc.attn_mask).mean(1)
            x = dec(x, kv, enc.attn_mask)
        raise AssertionError("the layer is one of the decoder's")

    def project(self, hidden: Tensor) -> Tensor:
        """Pre-softmax linear transformation to vocabulary logits (+ `output_bias` if the model has one)."""
        return F.linear(hidden, self.output_weight, self.output_bias)

    def project_fp32(self, hidden: Tensor) -> Tensor:
        """Logits in float32 from reduced-precision weights: rounding the logits to bf16 (8
        bits of mantissa) would tie or swap the candidates a beam search ranks."""
        bias = self.output_bias
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.float(), self.output_weight.float(), None if bias is None else bias.float())

    def forward(self, src_tokens: Tensor, prev_tokens: Tensor, return_hidden: bool = False) -> Tensor:
        """Logits (B, T, tgt_vocab) of every next target token; with `return_hidden`, the
        decoder states before the projection (training projects non-pad positions only)."""
        hidden = self.decode_hidden(prev_tokens, self.encode(src_tokens))
        return hidden if return_hidden else self.project(hidden)

    # -- incremental decoding (beam search) ---------------------------------------------
    def init_decoder_state(self, enc: EncoderOut, beam: int = 1,
                           cache: Optional[Callable[[], Cache]] = None) -> DecoderState:
        """Encoder-decoder keys/values of every layer, computed once for the whole search;
        decoding then runs `beam` rows per sentence, each layer's self-attention keys and
        values in a `cache` (None: the model's choice, `SelfAttentionCache` here; a device's step
        may keep them its own way). Each is made
        contiguous once here: as views into the projection's output, a batched product over
        them (CPU inference's `nmt.ops.product_attention`) would copy them at every step."""
        memory_kv = [tuple(t.contiguous() for t in layer.cross_attn.project_kv(enc.states)) for layer in self.decoder_layers]
        return DecoderState(memory_kv, enc.attn_mask, beam, SelfAttentionCache if cache is None else cache)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """Feed one token per row (sentences x beam,), return next-token logits (rows,
        tgt_vocab) in float32 whatever the weights' dtype (beam search ranks them); advances state."""
        return self.project_fp32(self.decode_step_hidden(tokens, state))

    def decode_step_hidden(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """`decode_step` before the vocabulary projection: the decoder states (rows, d_model),
        for a search that projects a block of rows at a time (`project_fp32`)."""
        x = self._embed(self.tgt_embed, tokens[:, None], start=state.step)  # (B, 1, d_model)
        for layer, kv, cache in zip(self.decoder_layers, state.memory_kv, state.caches):
            x = layer(x, kv, state.memory_mask, cache=cache)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        state.step += 1
        return x[:, 0]


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a shared embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def non_embedding_parameters(model: Transformer) -> tuple[int, int]:
    """(encoder, decoder) parameters excluding embeddings and the output projection."""
    enc = sum(p.numel() for p in model.encoder_layers.parameters())
    enc += sum(p.numel() for p in model.encoder_norm.parameters()) if model.encoder_norm is not None else 0
    dec = sum(p.numel() for p in model.decoder_layers.parameters())
    dec += sum(p.numel() for p in model.decoder_norm.parameters()) if model.decoder_norm is not None else 0
    return enc, dec
