"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), Section 3.

Reads in the order data flows (the configuration and named architectures are in
`nmt.model_config`, which needs no torch): sinusoidal positions
(3.5), scaled embeddings (3.4), multi-head attention (3.2.2), the position-wise feed-forward
network (3.3), encoder and decoder layers with residual dropout and layer norm (3.1, 5.4),
then the encoder-decoder model with incremental decoding for beam search.

Residual blocks are post-LN as in the paper: LayerNorm(x + Dropout(Sublayer(x))); `pre_ln`
gives x + Dropout(Sublayer(LayerNorm(x))) with a final LayerNorm, as tensor2tensor's later
default and fairseq's `--encoder-normalize-before`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import Iterator, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from nmt.gemm_rows import BucketedLinear
from nmt.layer_norm import OutputSavingLayerNorm
from nmt.model_config import TransformerConfig
from nmt.tokenizer import PAD_ID


def sinusoidal_positions(n_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...)  (Section 3.5)."""
    pos = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(-math.log(10000.0) * torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    pe = torch.zeros(n_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(pos * inv_freq)
    pe[:, 1::2] = torch.cos(pos * inv_freq)
    return pe.float()


def attend(q: Tensor, k: Tensor, v: Tensor, attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
           is_causal: bool = False) -> Tensor:
    """softmax(QK^T / sqrt(d_k)) V through `F.scaled_dot_product_attention`.

    On CPU, bf16/fp16 inputs are attended in fp32: PyTorch's CPU flash-attention backward in
    bf16 runs 3-5x slower than in fp32 (measured on AMX and AVX512-BF16 Xeons, torch 2.13),
    and it dominated a bf16 training step. The projections around it stay in bf16. For the
    backward, the attention keeps q, k and v as they came, in bf16, and casts them again there
    (exactly, so the gradients are unchanged): their fp32 copies, which it would otherwise keep,
    were 98 of the 365 MiB a `small` bf16 step at 4096 tokens kept for its backward.
    """
    # Any of the three decides: under torch.compile the query can arrive in fp32 beside bf16 k, v.
    low = None if q.device.type != "cpu" else next(
        (t.dtype for t in (q, k, v) if t.dtype in (torch.bfloat16, torch.float16)), None)
    if low is not None:
        q32, k32, v32 = q.float(), k.float(), v.float()
        with torch.autocast("cpu", enabled=False), _keep_as_cast_from(((q32, q), (k32, k), (v32, v))):
            out = F.scaled_dot_product_attention(q32, k32, v32, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
        return out.to(low)
    with sdpa_kernel(GPU_ATTENTION_BACKENDS) if q.device.type == "cuda" else nullcontext():
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)


@contextmanager
def _keep_as_cast_from(casts: tuple[tuple[Tensor, Tensor], ...]) -> Iterator[None]:
    """Saved-tensor hooks under which autograd keeps the source of a cast `(copy, source)`
    instead of the copy whenever it saves the copy, and casts it again when the backward
    needs it. Up-casts (bf16 -> fp32) are exact, so the backward sees the same numbers.

    Autograd keeps both hooks as long as it keeps what they saved, so they refer to the
    copies by id only (and only while this context is open): a reference would keep them alive.
    """
    sources = {id(copy): source for copy, source in casts}

    def pack(t: Tensor) -> object:
        source = sources.get(id(t))
        return t if source is None else _CastAgain(source, t.dtype)

    def unpack(packed: object) -> Tensor:
        return packed.source.to(packed.dtype) if isinstance(packed, _CastAgain) else packed

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield
    finally:
        sources.clear()


class _CastAgain(NamedTuple):
    """A saved tensor kept as the source it was cast from (`_keep_as_cast_from`)."""

    source: Tensor
    dtype: torch.dtype


GPU_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""The attention kernels `attend` lets PyTorch choose from on a GPU: cuDNN's is left out.
PyTorch prefers it on Hopper, but it plans every new shape on the host, and training batches
(each its own sentence count and length) and beam search (a new key length every step) keep
bringing new shapes: profiling `big` at 25k tokens on an H200 (torch 2.11) showed 9 ms of CPU
per cuDNN attention call against 0.2-0.3 ms of GPU work, so the GPU waited for the host. Flash
attention (no mask) and the memory-efficient kernel (padding masks) have no per-shape cost:
training `big` went from 126 to 80 ms per update (100k -> 159k target tok/s) and `nmt
translate` of a `base` model from 14-16 to 80-84 sentences/s."""


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout(x, p, training), with the mask of a CPU tensor drawn 16 bits per element.

    On CPU, F.dropout draws its mask with `bernoulli_`, one double per element: 4.9 ms per
    (4096, 256) activation in a `small` training step on two cores, 8% of the step over its 17
    dropouts. `keep_mask` draws 16 random bits per element instead (see there). The mask
    keeps each element with probability 1 - p (to within 2^-16) and scales it by 1 / (1 - p),
    as F.dropout does; only the random numbers differ, and torch's seed still decides them.
    GPUs, and graphs under torch.compile, keep F.dropout.
    """
    if not training or p == 0.0:
        return x
    if not _cpu_mask_applies(x, p):
        return F.dropout(x, p, True)
    return _MaskedScale.apply(x, keep_mask(x.shape, p), 1.0 / (1.0 - p))


def _cpu_mask_applies(x: Tensor, p: float) -> bool:
    """Whether dropout of x at rate p (training) draws its mask with `keep_mask`: on CPU, for
    p < 1, outside torch.compile graphs (which keep F.dropout)."""
    return x.device.type == "cpu" and p < 1.0 and not torch.compiler.is_compiling()


_SEED_RANGE = 2**62


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """Bool mask, True with probability 1 - p, from 16 random bits per element.

    The bits come from numpy's PCG64 (`random_raw`: 64 bits a draw, read as four int16
    uniform on [-2^15, 2^15)), seeded by a draw from torch's default generator, so that
    `torch.manual_seed` and a checkpoint's saved torch RNG state decide every mask, as they
    decided torch's own draws before. Per (4082, 256) mask on two Sapphire Rapids cores:
    1.53 ms with torch's `random_` on int32 and two comparisons, 0.65 ms here (0.53 for the
    bits, 0.12 for numpy's vectorised comparison).
    """
    n = math.prod(shape)
    seed = int(torch.randint(0, _SEED_RANGE, (), dtype=torch.int64))
    bits = np.random.PCG64(seed).random_raw((n + 3) // 4).view(np.int16)[:n]
    threshold = min(round(p * 2**16) - 2**15, 2**15 - 1)  # an int16 (p within 2^-17 of 1 would overflow it)
    return torch.from_numpy(np.greater_equal(bits, np.int16(threshold))).view(shape)


def relu_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """dropout(ReLU(x), p, training), with one mask for both on CPU.

    ReLU's backward needs where x > 0, and dropout's which elements it kept. On CPU one byte
    mask (kept and positive) serves both, so the (tokens x d_ff) ReLU output is not kept for
    the backward and one pass over it is saved there: `small` at 4096 tokens kept 12 MiB less
    per fp32 layer. Elements where x == 0 get no gradient, as with F.relu. The numbers are
    those of `dropout(F.relu(x), p, training)` with the same random state.
    """
    if not training or p == 0.0 or not _cpu_mask_applies(x, p):
        return dropout(F.relu(x), p, training)
    keep = keep_mask(x.shape, p)
    keep &= x > 0
    return _MaskedScale.apply(x, keep, 1.0 / (1.0 - p))


class _MaskedScale(torch.autograd.Function):
    """x * keep * scale whose backward keeps only the bool mask (1 byte per element).

    The mask is multiplied in as uint8 (the same bytes): PyTorch's CPU kernels multiply a
    float tensor by a bool one through a converted copy of the mask, by a uint8 one without:
    0.84 -> 0.58 ms per (4082, 256) fp32 activation, forward or backward."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep.view(torch.uint8)).mul_(scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(keep.view(torch.uint8)).mul_(ctx.scale), None, None


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1..head_h) W^O, each head scaled dot-product (3.2).

    Runs through `F.scaled_dot_product_attention`, so fused kernels are used where available.
    Self-attention projects Q, K, V with one matrix; encoder-decoder attention projects K, V
    of the encoder output with one matrix, once per sentence.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, self_attention: bool):
        super().__init__()
        self.n_heads, self.d_head, self.dropout = n_heads, d_model // n_heads, dropout
        self.self_attention = self_attention
        if self_attention:
            self.qkv_proj = BucketedLinear(d_model, 3 * d_model)
        else:
            self.q_proj = BucketedLinear(d_model, d_model)
            self.kv_proj = BucketedLinear(d_model, 2 * d_model)
        self.out_proj = BucketedLinear(d_model, d_model)
        for lin in self.modules():
            if isinstance(lin, nn.Linear):
                nn.init.xavier_uniform_(lin.weight)
                nn.init.zeros_(lin.bias)

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
        cache: Optional["SelfAttentionCache"] = None,
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
                out = attend(q, k, v, attn_mask=attn_mask)
                out = out.view(n_sent, self.n_heads, beam, T, self.d_head).permute(0, 2, 3, 1, 4)  # (N, beam, T, h, d_head)
                return self.out_proj(out.reshape(B, T, D))
        out = attend(q, k, v, attn_mask=attn_mask, dropout_p=self.dropout if self.training else 0.0, is_causal=is_causal)
        return self.out_proj(out.transpose(1, 2).reshape(B, T, D))  # (B, T, d_model)


class SelfAttentionCache:
    """Keys and values of the tokens decoded so far, (rows, h, capacity, d_head) each.

    Appending writes one step in place; the capacity grows by half when full, so a step never
    copies the whole cache just to grow it (as concatenation would), and the last growth
    overshoots the steps still to come by less than doubling did (measured on Multi30k: the
    peak RSS of `nmt translate` fell by 20 MiB). `reorder` moves the surviving rows within
    the same buffers.
    """

    def __init__(self) -> None:
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add k, v (rows, h, T, d_head) after the cached steps; return views of all steps."""
        end = self.length + k.size(2)
        if self.k is None or end > self.k.size(2):
            self._grow(k, max(end, (3 * self.k.size(2) + 1) // 2 if self.k is not None else 8))
        self.k[:, :, self.length : end] = k
        self.v[:, :, self.length : end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def _grow(self, like: Tensor, capacity: int) -> None:
        rows, heads, _, d_head = like.shape
        k, v = (like.new_empty(rows, heads, capacity, d_head) for _ in range(2))
        if self.k is not None:
            k[:, :, : self.length] = self.k[:, :, : self.length]
            v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v

    def reorder(self, rows: Tensor) -> None:
        """Keep `rows` (in that order) as rows 0..n-1, in place in the same buffers: a second
        buffer to gather into would double the cache, the largest memory of a CPU search."""
        if self.k is None:
            return
        n = rows.numel()
        for buf in (self.k, self.v):
            buf[:n, :, : self.length] = buf[:, :, : self.length].index_select(0, rows)
        self.k, self.v = self.k[:n], self.v[:n]


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2  (Section 3.3)."""

    def __init__(self, d_model: int, d_ff: int, relu_dropout: float):
        super().__init__()
        self.fc1, self.fc2 = BucketedLinear(d_model, d_ff), BucketedLinear(d_ff, d_model)
        self.relu_dropout = relu_dropout
        for lin in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.fc1.pads(x):
            # Bucketed bf16 rows (`nmt.gemm_rows`): the (rows x d_ff) activation stays padded
            # from fc1 to fc2, so it is neither copied nor kept twice (ReLU's and fc2's).
            rows = x.reshape(-1, x.size(-1))
            h = relu_dropout(self.fc1.padded(rows), self.relu_dropout, self.training)
            return self.fc2.padded(h)[: rows.size(0)].view(x.shape)
        return self.fc2(relu_dropout(self.fc1(x), self.relu_dropout, self.training))


class Residual(nn.Module):
    """Residual dropout and layer norm around one sublayer (Sections 3.1 and 5.4)."""

    def __init__(self, d_model: int, dropout: float, pre_ln: bool):
        super().__init__()
        # Post-LN keeps the norm's output for the next product anyway; its backward can work
        # from that (`nmt.layer_norm`). Pre-LN's norm output is not kept, so it keeps the input.
        self.norm = nn.LayerNorm(d_model) if pre_ln else OutputSavingLayerNorm(d_model)
        self.dropout, self.pre_ln = dropout, pre_ln

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_ln:
            return x + dropout(sublayer(self.norm(x)), self.dropout, self.training)
        return self.norm(x + dropout(sublayer(x), self.dropout, self.training))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout, self_attention=True)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.relu_dropout)
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
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.relu_dropout)
        self.self_block = Residual(cfg.d_model, cfg.dropout, cfg.pre_ln)
        self.cross_block = Residual(cfg.d_model, cfg.dropout, cfg.pre_ln)
        self.ffn_block = Residual(cfg.d_model, cfg.dropout, cfg.pre_ln)

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        memory_mask: Optional[Tensor],
        cache: Optional[dict[str, Tensor]] = None,
    ) -> Tensor:
        # Targets are right-padded, so the causal mask alone keeps real positions off padding.
        # (Teacher forcing: queries and keys are the same positions; a one-position causal mask is no mask.)
        causal = cache is None
        x = self.self_block(x, lambda h: self.self_attn(h, is_causal=causal, cache=cache))
        x = self.cross_block(x, lambda h: self.cross_attn(h, kv=memory_kv, attn_mask=memory_mask))
        return self.ffn_block(x, self.ffn)


class EncoderOut(NamedTuple):
    states: Tensor  # (B, S, d_model)
    attn_mask: Optional[Tensor]  # (B, 1, 1, S) bool, True where attention is allowed; None: no padding


class DecoderState:
    """What incremental decoding carries between steps: per-layer self-attention caches,
    the encoder-decoder keys/values and source mask (computed once, one entry per sentence,
    shared by the sentence's `beam` adjacent rows) and the step."""

    def __init__(self, memory_kv: list[tuple[Tensor, Tensor]], memory_mask: Optional[Tensor], beam: int = 1):
        self.memory_kv = memory_kv
        self.memory_mask = memory_mask
        self.beam = beam
        self.caches = [SelfAttentionCache() for _ in memory_kv]
        self.step = 0

    def reorder(self, rows: Tensor, sentences: Optional[Tensor] = None) -> None:
        """Continue from `rows` (beam search: the surviving hypotheses' parents), `beam` per
        sentence; `sentences` (indices, in order) keeps only those sentences, whose rows
        `rows` must then be."""
        if sentences is not None:
            self.memory_kv = [(k.index_select(0, sentences), v.index_select(0, sentences)) for k, v in self.memory_kv]
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, sentences)
        for cache in self.caches:
            cache.reorder(rows)


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Figure 1) with shared, sqrt(d_model)-scaled embeddings."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        d = cfg.d_model
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=PAD_ID)
        nn.init.normal_(self.src_embed.weight, mean=0.0, std=d**-0.5)
        nn.init.zeros_(self.src_embed.weight[PAD_ID])
        if cfg.share_all_embeddings:
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=PAD_ID)
            nn.init.normal_(self.tgt_embed.weight, mean=0.0, std=d**-0.5)
            nn.init.zeros_(self.tgt_embed.weight[PAD_ID])
        if cfg.share_all_embeddings or cfg.share_decoder_input_output_embed:
            self.output_proj = None
        else:
            self.output_proj = nn.Linear(d, cfg.tgt_vocab_size, bias=False)
            nn.init.normal_(self.output_proj.weight, mean=0.0, std=d**-0.5)
        self.register_buffer("positions", sinusoidal_positions(cfg.max_positions, d), persistent=False)
        self.embed_scale = math.sqrt(d)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        self.encoder_norm = nn.LayerNorm(d) if cfg.pre_ln else None
        self.decoder_norm = nn.LayerNorm(d) if cfg.pre_ln else None
        self.gemm_row_multiple = 0

    # -- embeddings ---------------------------------------------------------------------
    def _embed(self, table: nn.Embedding, tokens: Tensor, start: int = 0) -> Tensor:
        """Dropout(sqrt(d_model) * E[tokens] + PE[positions])  (Sections 3.4, 3.5, 5.4)."""
        T = tokens.size(1)
        x = table(tokens) * self.embed_scale + self.positions[start : start + T]
        return dropout(x, self.cfg.dropout, self.training)

    def bucket_gemm_rows(self, multiple: int) -> None:
        """Pad the rows of every layer's bf16 CPU training products to a multiple of
        `multiple` (0: never), so oneDNN builds a kernel per bucket, not per batch (`nmt.gemm_rows`);
        the training loss pads its chunks to match (`ProjectedLogits.row_multiple`)."""
        self.gemm_row_multiple = multiple
        for module in self.modules():
            if isinstance(module, BucketedLinear):
                module.row_multiple = multiple

    @property
    def output_weight(self) -> Tensor:
        """Pre-softmax projection (vocab, d_model): the target embedding when shared."""
        return self.output_proj.weight if self.output_proj is not None else self.tgt_embed.weight

    # -- encoder ------------------------------------------------------------------------
    def encode(self, src_tokens: Tensor) -> EncoderOut:
        """src_tokens: (B, S) right-padded with PAD_ID, eos-terminated."""
        pad = src_tokens.eq(PAD_ID)
        # Without padding no mask is needed (faster kernels); asking would make the host wait
        # for a GPU, so there the mask is always passed.
        masked = src_tokens.device.type == "cuda" or torch.compiler.is_compiling() or bool(pad.any())
        attn_mask = (~pad)[:, None, None, :] if masked else None  # (B, 1, 1, S)
        x = self._embed(self.src_embed, src_tokens)
        for layer in self.encoder_layers:
            x = layer(x, attn_mask)
        if self.encoder_norm is not None:
            x = self.encoder_norm(x)
        return EncoderOut(x, attn_mask)

    # -- decoder ------------------------------------------------------------------------
    def decode_hidden(self, prev_tokens: Tensor, enc: EncoderOut) -> Tensor:
        """Teacher-forced decoder states (B, T, d_model) for bos-prefixed target prefixes."""
        x = self._embed(self.tgt_embed, prev_tokens)
        for layer in self.decoder_layers:
            x = layer(x, layer.cross_attn.project_kv(enc.states), enc.attn_mask)
        if self.decoder_norm is not None:
            x = self.decoder_norm(x)
        return x

    def project(self, hidden: Tensor) -> Tensor:
        """Pre-softmax linear transformation to vocabulary logits."""
        return F.linear(hidden, self.output_weight)

    def project_fp32(self, hidden: Tensor) -> Tensor:
        """Logits in float32 from reduced-precision weights: rounding the logits to bf16 (8
        bits of mantissa) would tie or swap the candidates a beam search ranks."""
        source = self.output_weight
        if source.dtype == torch.float32 and hidden.dtype == torch.float32:
            return F.linear(hidden, source)
        key = (source.data_ptr(), source._version)  # a training step changes _version
        cached = getattr(self, "_output_weight_fp32", None)
        if cached is None or cached[0] != key:
            cached = self._output_weight_fp32 = (key, source.detach().float())
        with torch.autocast(hidden.device.type, enabled=False):
            return F.linear(hidden.float(), cached[1])

    def forward(self, src_tokens: Tensor, prev_tokens: Tensor, return_hidden: bool = False) -> Tensor:
        """Logits (B, T, tgt_vocab) of every next target token; with `return_hidden`, the
        decoder states before the projection (training projects non-pad positions only)."""
        hidden = self.decode_hidden(prev_tokens, self.encode(src_tokens))
        return hidden if return_hidden else self.project(hidden)

    # -- incremental decoding (beam search) ---------------------------------------------
    def init_decoder_state(self, enc: EncoderOut, beam: int = 1) -> DecoderState:
        """Encoder-decoder keys/values of every layer, computed once for the whole search;
        decoding then runs `beam` rows per sentence."""
        return DecoderState([layer.cross_attn.project_kv(enc.states) for layer in self.decoder_layers], enc.attn_mask, beam)

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
