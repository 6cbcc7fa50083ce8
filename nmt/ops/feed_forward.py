"""The position-wise feed-forward network on CPU: `FeedForward` with one mask for ReLU and dropout,
and its bf16 training rows kept padded from the first product to the second.

tests/test_model.py and tests/test_gemm_rows.py check it against the stock FeedForward.
"""

from __future__ import annotations

from torch import Tensor

from nmt.model.transformer import ACTIVATIONS, FeedForward
from nmt.ops.bucketed_linear import BucketedLinear
from nmt.ops.dropout import relu_dropout


class CpuFeedForward(FeedForward):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 with `relu_dropout` (same parameters).

    In bucketed bf16 training (`nmt.ops.bucketed_linear`) the (rows x d_ff) activation stays
    padded from fc1 to fc2, so it is neither copied nor kept twice (ReLU's and fc2's).
    Another `activation` (swish, gelu) is followed by the layer's own dropout: it maps the
    zero padding rows to zero too."""

    def _activate(self, h: Tensor) -> Tensor:
        if self.activation == "relu":
            return relu_dropout(h, self.dropout.p, self.training)
        return self.dropout(ACTIVATIONS[self.activation](h))

    def forward(self, x: Tensor) -> Tensor:
        if isinstance(self.fc1, BucketedLinear) and self.fc1.pads(x):
            rows = x.reshape(-1, x.size(-1))
            h = self._activate(self.fc1.padded(rows))
            return self.fc2.padded(h)[: rows.size(0)].view(x.shape)
        return self.fc2(self._activate(self.fc1(x)))
