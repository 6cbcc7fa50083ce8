"""Label-smoothed cross entropy (Section 5.4, epsilon_ls = 0.1).

The paper cites Szegedy et al. (2016), whose smoothed target is q' = (1 - eps) * onehot + eps / K
over all K classes; so loss = (1 - eps) * NLL + eps / K * sum_k -log p_k. Padding positions are
excluded before the projection, so they cost nothing. Sums are returned in nats; the trainer
reports per-token values in base 2, as fairseq does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def label_smoothed_nll_loss(logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, NLL sum) over rows of `logits` (N, V) with gold ids `target` (N,)."""
    lprobs = F.log_softmax(logits, dim=-1, dtype=torch.float32)
    nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)
    if epsilon == 0.0:
        nll_sum = nll.sum()
        return nll_sum, nll_sum.detach()
    smooth = -lprobs.sum(-1)
    loss = (1.0 - epsilon) * nll + (epsilon / lprobs.size(-1)) * smooth
    return loss.sum(), nll.sum().detach()
