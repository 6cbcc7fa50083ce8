"""Label-smoothed cross entropy (Section 5.4, epsilon_ls = 0.1).

The paper cites Szegedy et al. (2016), whose smoothed target is q' = (1 - eps) * onehot + eps / K
over all K classes, so loss = (1 - eps) * NLL + eps / K * sum_k -log p_k: exactly what
`F.cross_entropy(..., label_smoothing=eps)` computes. Sums are returned in nats (the trainer
reports per-token values in base 2, as fairseq does), in fp32 whatever the logits' dtype, so
the ranking of probabilities and the smoothed sum are never rounded to bf16/fp16.

Training never forms the (tokens x vocabulary) logits: it passes `ProjectedLogits` (the decoder
states at non-pad positions and the output projection), and the same loss is computed a chunk
of rows at a time by `nmt.ops.projected_loss`, tested against the reference below.
"""

from __future__ import annotations

from typing import Union

import torch.nn.functional as F
from torch import Tensor

from nmt.ops.projected_loss import ProjectedLogits, projected_label_smoothed_nll_loss


def label_smoothed_nll_loss(logits: Union[Tensor, ProjectedLogits], target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """(smoothed loss sum, NLL sum) in nats over rows of `logits` (N, V) with gold ids `target` (N,).
    The NLL sum carries no gradient."""
    if isinstance(logits, ProjectedLogits):
        return projected_label_smoothed_nll_loss(logits, target, epsilon)
    z = logits.float()
    loss = F.cross_entropy(z, target, label_smoothing=epsilon, reduction="sum")
    nll = F.cross_entropy(z.detach(), target, reduction="sum")
    return loss, nll
