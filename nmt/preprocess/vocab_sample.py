"""The uniform sample of training pairs a vocabulary is learned from, drawn chunk by chunk."""

from __future__ import annotations

import numpy as np


class UniformSample:
    """A uniform sample without replacement of `size` of `population` lines, drawn chunk by chunk.

    For each chunk, the number of sampled lines it holds is hypergeometric given what is left;
    the positions within the chunk are then uniform. Memory is one chunk's mask.
    """

    def __init__(self, population: int, size: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.population_left, self.size_left = population, min(size, population)

    def take(self, n: int) -> np.ndarray:
        mask = np.zeros(n, dtype=bool)
        n_in = min(n, self.population_left)
        if self.size_left >= self.population_left:
            mask[:n_in] = True
            k = n_in
        elif n_in > 0 and self.size_left > 0:
            if n_in == self.population_left:  # the last chunk holds all that is left to draw
                k = self.size_left
            else:
                k = int(self.rng.hypergeometric(n_in, self.population_left - n_in, self.size_left))
            mask[self.rng.choice(n_in, size=k, replace=False)] = True
        else:
            k = 0
        self.population_left -= n_in
        self.size_left -= k
        return mask
