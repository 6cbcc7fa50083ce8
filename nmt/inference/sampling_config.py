"""Settings of `nmt translate --sampling` (fairseq's names). A plain dataclass without torch,
so `nmt --help` stays fast; the CLI flags, defaults and help come from these fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nmt.errors import NmtError
from nmt.settings import COUNT, POSITIVE_REAL, SEED, Range, check_ranges, setting


@dataclass
class SamplingConfig:
    sampling: bool = setting(False, "Draw one translation per line from the model's distribution instead of beam search "
                                    "(back-translation, Edunov et al. 2018); --beam and the length penalty are then unused, --max-len-a/b still bound the length.")
    sampling_topk: int = setting(0, "Sample from the K most probable next tokens only; 0 = the whole vocabulary. "
                                    "1 is greedy search.")
    sampling_topp: float = setting(0.0, "Nucleus sampling: from the smallest set of next tokens whose probability "
                                   "reaches P (0 < P <= 1); 0 = off. Give --sampling-topk or --sampling-topp, not both.")
    temperature: float = setting(1.0, "Divide the logits by T before sampling: below 1 sharper, above 1 flatter.")
    seed: int = setting(1, "Seed of the sampler: the same seed, input and settings give the same translations.")

    RANGES: ClassVar[dict[str, Range]] = {
        "sampling_topk": COUNT, "sampling_topp": Range(0.0, 1.0), "temperature": POSITIVE_REAL, "seed": SEED,
    }
    """The range of every numeric setting (`nmt.settings`); a top-k above the vocabulary keeps all of it."""

    def validate(self) -> None:
        check_ranges(self)
        if not self.sampling and (self.sampling_topk or self.sampling_topp or self.temperature != 1.0):
            raise NmtError("--sampling-topk, --sampling-topp and --temperature apply to --sampling; add --sampling")
        if self.sampling_topk and self.sampling_topp:
            raise NmtError("give --sampling-topk or --sampling-topp, not both")
