"""The learning-rate schedule of Section 5.3.

    lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)

rises linearly for `warmup` steps, then decays with the inverse square root of the step.
fairseq's `inverse_sqrt` is the same curve named by its peak: lr(step) = peak *
min(step / warmup, sqrt(warmup / step)); `--lr` picks that form, `--lr-scale` multiplies
the paper's form. `warmup` 0 means no warmup: the decay alone, from step 1.

`--lr-cooldown F` multiplies either form by `cooldown`: a linear decay to 0 over the last F of
the run, the cooldown of warmup-stable-decay schedules (Hagele et al. 2024), not in the paper.
"""

from __future__ import annotations

import math


def paper_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The paper's lrate at 1-based update `step`."""
    step = max(step, 1)
    if warmup <= 0:
        return scale * d_model**-0.5 * step**-0.5
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def peak_lr(step: int, peak: float, warmup: int) -> float:
    """fairseq's inverse_sqrt with linear warmup from 0 to `peak` at step `warmup`."""
    step = max(step, 1)
    if warmup <= 0:
        return peak * step**-0.5
    return peak * min(step / warmup, math.sqrt(warmup / step))


def learning_rate(step: int, d_model: int, warmup: int, lr_scale: float = 1.0, lr: float | None = None) -> float:
    """The rate for update `step`: fairseq's peak form when `lr` is given, else the paper's."""
    if lr is not None:
        return peak_lr(step, lr, warmup)
    return paper_lr(step, d_model, warmup, lr_scale)


def cooldown(progress: float, fraction: float) -> float:
    """The factor on the rate when the last `fraction` of a run decays it linearly to 0;
    `progress` is how far the run is towards its end, in [0, 1].

    A run cut by a budget under the inverse square root ends at a point on a still noisy path
    (checkpoint averaging smooths it after the fact); ending at a rate near 0 lets the weights
    settle within the budget itself. 1 before the cooldown and when `fraction` is 0."""
    if fraction <= 0.0 or progress <= 1.0 - fraction:
        return 1.0
    return max(0.0, (1.0 - progress) / fraction)
