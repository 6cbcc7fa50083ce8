"""Label-smoothed cross entropy (Section 5.4, epsilon_ls = 0.1), computed in row chunks.

The paper cites Szegedy et al. (2016), whose smoothed target is q' = (1 - eps) * onehot + eps / K
over all K classes; so loss = (1 - eps) * NLL + eps / K * sum_k -log p_k. Padding positions are
excluded before the projection, so they cost nothing. Sums are returned in nats; the trainer
reports per-token values in base 2, as fairseq does.

With z = logits and lse = logsumexp(z) per row, -log p_k = lse - z_k, so

    loss_i = (1 - eps) * (lse_i - z_{i,gold}) + eps / K * (K * lse_i - sum_k z_ik)
    d loss_i / d z_ik = softmax(z_i)_k - q'_ik

A plain `log_softmax` keeps the whole (tokens x vocabulary) log-probabilities in fp32 for the
backward, and autograd writes two more fp32 tensors of that size there (the gradient of the
gather/sum and of log_softmax), on top of the logits and their gradient: at 4096 tokens and a
32k vocabulary that is 0.5 GB each. Here only the logits (in their own dtype, bf16 under
autocast) are kept: the forward takes log_softmax a chunk of rows at a time and keeps only
the sums, the backward recomputes the softmax a chunk at a time and writes the gradient once,
in the logits' dtype, over the logits themselves (the projection's backward needs its input
and weight, not its output), so the logits and their gradient never exist side by side. The
fp32 working set is one chunk. A second backward through the same graph is not possible.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 21
"""fp32 elements per chunk (8 MiB). 4096 x 8000 logits, forward + backward on two cores:
fp32 the same from 1M to 8M elements (108-112 ms); bf16 120 ms at 8M but 72 ms at 2M, because a
chunk's fp32 copy of 32 MiB is at glibc's largest mmap threshold, so each one was mapped anew
and paid a page fault per 4 KiB (in a bf16 training step: 130 ms of casts per update)."""


def _rows_per_chunk(vocab: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(vocab, 1))


class _LabelSmoothedCrossEntropy(torch.autograd.Function):
    """(loss sum, NLL sum) of logits (N, V) in any float dtype, maths in fp32, chunk by chunk."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
        n, vocab = logits.shape
        loss_sum = torch.zeros((), dtype=torch.float32, device=logits.device)
        nll_sum = torch.zeros((), dtype=torch.float32, device=logits.device)
        step = _rows_per_chunk(vocab)
        for start in range(0, n, step):
            lprobs = torch.log_softmax(logits[start : start + step], dim=-1, dtype=torch.float32)  # (rows, V)
            nll = -lprobs.gather(-1, target[start : start + step, None]).sum()
            nll_sum += nll
            if epsilon != 0.0:
                smooth = -lprobs.sum()  # sum over rows and k of -log p_k
                loss_sum += (1.0 - epsilon) * nll + (epsilon / vocab) * smooth
        if epsilon == 0.0:
            loss_sum = nll_sum.clone()
        ctx.save_for_backward(logits, target)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None]:
        logits, target = ctx.saved_tensors
        eps = ctx.epsilon
        n, vocab = logits.shape
        grad = logits  # written chunk by chunk over the logits, which nothing reads after this backward
        g = grad_loss.float()
        step = _rows_per_chunk(vocab)
        for start in range(0, n, step):
            t = target[start : start + step, None]
            p = torch.softmax(logits[start : start + step], dim=-1, dtype=torch.float32)  # (rows, V)
            if eps != 0.0:
                p.sub_(eps / vocab)
            p.scatter_add_(-1, t, torch.full(t.shape, eps - 1.0, dtype=p.dtype, device=p.device))
            torch.mul(p, g, out=grad[start : start + step])  # (p - q') * g, in the logits' dtype
        return grad, None, None


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, NLL sum) in nats over rows of `logits` (N, V) with gold ids `target` (N,).

    Both are fp32 whatever the logits' dtype; the NLL sum carries no gradient.
    """
    return _LabelSmoothedCrossEntropy.apply(logits, target, float(epsilon))
