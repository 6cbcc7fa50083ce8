"""A beam search step's vocabulary work on a block of logits in one pass per row, in C++.

After the projection, the stock search (`nmt.inference.beam_search.row_candidates`) computes
log P = log_softmax(logits) in place, masks pad and bos, takes the maxima of blocks of 64
logits to rank only the best blocks, gathers them, ranks them, and copies eos's column out:
five passes over the (rows, V) block, each a PyTorch operation of its own, and the block
(8 MiB) larger than a core's cache. In #30's profile of a `mini` decode that took more than
half the time of the projection itself. The loop in nmt/ops/csrc/vocabulary_top.cpp
reads each row twice while it is in the core's cache (block maxima, then the sum of exp for
log_softmax's normalizer) and writes only what the search keeps:

    log P(y) = logit(y) - (m + log sum_v exp(logit(v) - m)),   m = max_v logit(v)

for the row's w best tokens other than pad and bos (which are never generated, but count in
the normalizer) and for eos. tests/test_vocabulary_top.py checks it against log_softmax +
topk. Built by `nmt.ops.native`; used for a single fp32 model on a CPU
(`nmt.ops.fused_vocabulary_top`, on the native decoding path).
"""

from __future__ import annotations

from torch import Tensor

from nmt.model.config import SpecialIds
from nmt.ops.native import loaded


def vocabulary_top(logits: Tensor, values: Tensor, tokens: Tensor, eos: Tensor, ids: SpecialIds) -> None:
    """For logits (rows, V) fp32: values, tokens (rows, w) := each row's w best log-probabilities
    (log_softmax) and their ids, pad and bos left out, best first (ties: the lower id); eos
    (rows,) := log P(eos). The outputs may be views (rows contiguous) of the search's buffers."""
    loaded().vocabulary_top(logits, values, tokens, eos, ids.eos, ids.pad, ids.bos)
