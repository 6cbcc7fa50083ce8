"""The label-smoothed loss of `nmt.train.loss` fused with the vocabulary projection, a chunk of rows at a time.

It equals `F.cross_entropy(hidden @ weight.T (+ bias), target, label_smoothing=eps, reduction="sum")`
(tests/test_loss.py checks it against `nmt.train.loss.label_smoothed_nll_loss`) without ever
forming the (tokens x vocabulary) logits. With z = logits and lse = logsumexp(z) per row,
-log p_k = lse - z_k, so

    loss_i = (1 - eps) * (lse_i - z_{i,gold}) + eps / K * (K * lse_i - sum_k z_ik)
    d loss_i / d z_ik = softmax(z_i)_k - q'_ik

The stock formulation keeps the whole (tokens x vocabulary) log-probabilities in fp32 for the
backward, and autograd writes two more fp32 tensors of that size (the gradient of the
gather/sum and of log_softmax), on top of the logits and their gradient: at 4096 tokens and a
32k vocabulary that is 0.5 GB each. Here the loss is given the decoder states and the
projection, forms each chunk's logits itself, and computes the hidden and weight gradients
with the loss: the fp32 working set is one chunk, and each chunk's softmax reads logits that
are still in cache. A second backward through the same graph is not possible.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from nmt.ops.bucketed_linear import zero_padded_rows


def _rows_per_chunk(vocab: int, elements: int) -> int:
    """Rows of a chunk of `elements` logits."""
    return max(1, elements // max(vocab, 1))


def _minus_smoothed_target(p: Tensor, t: Tensor, epsilon: float, dtype: torch.dtype) -> Tensor:
    """p - q' in `dtype`, the loss's gradient over one chunk's logits, from its fp32 softmax
    `p` (overwritten). The subtraction runs in place in fp32 and the cast after it: one
    mixed-dtype pass (`torch.sub(..., out=bf16)`) was slower on CPU than the two."""
    p.scatter_add_(-1, t, torch.full(t.shape, epsilon - 1.0, dtype=p.dtype, device=p.device))
    if epsilon:
        p.sub_(epsilon / p.size(-1))
    return p.to(dtype)  # p itself when dtype is fp32


def _exp_and_losses(logits: Tensor, t: Tensor, epsilon: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(exp(z - m), its row sums, smoothed loss sum, NLL sum) of one chunk's logits z (rows, V),
    which it overwrites when they are fp32, with gold ids t (rows, 1); m is the row maximum.

    With s = sum_k exp(z_k - m): lse = m + log s, -log p_gold = lse - z_gold and
    sum_k -log p_k = V * lse - sum_k z_k, so the losses need the row sums of z and one
    exponential per logit, which divided by s is also the softmax the gradient needs
    (log_softmax and then exp took two; bench/results/2026-11-30_4d5c99e_sapphire-rapids_cpu-dropout-and-loss-ab.json).
    """
    z = logits.float()  # the logits themselves when fp32
    vocab = z.size(-1)
    m = z.amax(dim=-1, keepdim=True)
    z_gold = z.gather(-1, t)
    z_rows = z.sum(dim=-1, keepdim=True)
    e = z.sub_(m).exp_()
    s = e.sum(dim=-1, keepdim=True)
    lse = s.log().add_(m)
    nll = (lse - z_gold).sum()
    loss = nll if not epsilon else (1.0 - epsilon) * nll + (epsilon / vocab) * (vocab * lse - z_rows).sum()
    return e, s, loss, nll


class ProjectedLogits(NamedTuple):
    """Logits given as `hidden @ weight.T` in `dtype` (+ `bias` in fp32), for the loss to form a chunk at a time.

    Training passes these instead of the (tokens x vocabulary) logits: the loss then never
    writes them out whole, nor their gradient (at 4096 tokens and 8k pieces, 131 MB each in
    fp32), and each chunk's softmax reads logits that are still in cache.
    """

    hidden: Tensor  # (N, d_model), non-pad decoder states
    weight: Tensor  # (V, d_model), the pre-softmax projection
    dtype: torch.dtype  # of the matrix products: bf16/fp16 under autocast, else the weight's
    row_multiple: int = 0  # > 0: the layers' row multiple; chunks shorter than min(chunk, it) are padded (`nmt.ops.bucketed_linear`)
    bias: Optional[Tensor] = None  # (V,), the model's output_bias, added to the fp32 logits


PROJECTED_CHUNK_ELEMENTS = 1 << 22
"""Logits per chunk of the projected loss on a CPU: fp32 and bf16 were both fastest at about 4M
logits, the vocabulary's weight-gradient product then summing over 512 rows a chunk (no result
file was committed; `python bench/bench_loss_chunks.py` times it on your CPU)."""

PROJECTED_CHUNK_ELEMENTS_CUDA = 1 << 27
"""The same on a GPU, where a chunk must be large enough to keep the matrix units busy (at 4M
logits and 32k pieces a chunk is 131 rows: hundreds of small products, and the fp32 weight
gradient read and written once per chunk). `bench/bench_loss_chunks.py --device cuda` at the
paper's `big` batch: 2^27 is close to the fastest at much less memory than larger chunks
(bench/results/2026-11-30_b968069_h200_gpu-loss-chunks.json)."""


def projected_chunk_rows(vocab: int, device: torch.device) -> int:
    """Rows of hidden states per chunk of the projected loss on `device`."""
    return _rows_per_chunk(vocab, PROJECTED_CHUNK_ELEMENTS_CUDA if device.type == "cuda" else PROJECTED_CHUNK_ELEMENTS)


class _ProjectedLabelSmoothedCrossEntropy(torch.autograd.Function):
    """(loss sum, NLL sum) of hidden @ weight.T (+ bias); gradients computed with the loss.

    The gradient of a sum-reduced loss is known up to the incoming scalar at forward time, so
    each chunk's (softmax - q') is multiplied into the hidden and weight gradients at once
    (as Liger-Kernel's fused linear cross entropy does) and the chunk is dropped; backward
    only scales them. Products run in `dtype` with the weight gradient summed in fp32.
    """

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float, dtype: torch.dtype,
                with_grad: bool, row_multiple: int, bias: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        n, vocab = hidden.size(0), weight.size(0)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
            nll_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
            grad_hidden = torch.empty_like(hidden) if with_grad else None
            grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if with_grad else None
            b = None if bias is None else bias.float()
            grad_bias = torch.zeros(vocab, dtype=torch.float32, device=hidden.device) if with_grad and b is not None else None
            step = projected_chunk_rows(vocab, hidden.device)
            # oneDNN builds a kernel per bf16 product shape (`nmt.ops.bucketed_linear`): short chunks are
            # padded with zero rows so that every chunk of every update has one shape.
            pad_to = min(step, row_multiple) if with_grad and row_multiple > 0 else 0
            for start in range(0, n, step):
                rows, t = h[start : start + step], target[start : start + step, None]
                r = rows.size(0)
                if r < pad_to:
                    rows = zero_padded_rows(rows, pad_to, dtype)
                # In bf16 the product is dropped once cast, and the fp32 softmax once d is made:
                # the chunk's peak is one fp32 and one bf16 copy, not two bf16 and one fp32.
                z = (rows @ w.t())[:r].float()
                if b is not None:
                    z += b
                e, s, loss, nll = _exp_and_losses(z, t, epsilon)
                loss_sum += loss
                nll_sum += nll
                if not with_grad:
                    continue  # validation: the softmax itself is not needed
                d = _minus_smoothed_target(e.div_(s), t, epsilon, dtype)
                del e
                if grad_bias is not None:
                    grad_bias += d.sum(0, dtype=torch.float32)
                if rows.size(0) > r:
                    d = zero_padded_rows(d, rows.size(0), dtype)
                grad_hidden[start : start + r] = (d @ w)[:r]
                if dtype == torch.float32:
                    grad_weight.addmm_(d.t(), rows)
                else:
                    grad_weight += d.t() @ rows
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors  # computed in forward whenever a graph is recorded
        g = grad_loss.float()
        return (grad_hidden.mul_(g.to(grad_hidden.dtype)), grad_weight.mul_(g).to(ctx.weight_dtype),
                None, None, None, None, None, None if grad_bias is None else grad_bias.mul_(g).to(ctx.bias_dtype))


def projected_label_smoothed_nll_loss(logits: ProjectedLogits, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, NLL sum) in nats, fp32, of `hidden @ weight.T (+ bias)` with gold ids `target` (N,)."""
    hidden, weight, dtype, row_multiple, bias = logits
    with_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad
                                             or (bias is not None and bias.requires_grad))
    return _ProjectedLabelSmoothedCrossEntropy.apply(hidden, weight, target, float(epsilon), dtype, with_grad, row_multiple, bias)
