"""nmt's own decoding strategy: the `Translator`'s search run by this package's beam search
(or sampling) on torch models; the module that brings torch into `nmt translate`."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch

from nmt.data.batching import source_tensor
from nmt.errors import NmtError
from nmt.inference.beam_search import beam_search
from nmt.inference.config import SearchConfig, resolve_inter_threads
from nmt.inference.hypothesis import NO_REQUEST, Hypothesis, TargetRequest
from nmt.inference.sampling_config import SamplingConfig
from nmt.model.transformer import Transformer
from nmt.ops import decoder_path


class ModelDecoder:
    """nmt's own engine: beam search (or sampling) over one model or an ensemble, in batches
    of at most `max_tokens` padded source tokens, longest lines first, so padding stays small.

    On a CPU, `inter_threads` batches are searched at once, each by its own worker thread with
    `threads / inter_threads` threads for its operations (CTranslate2's inter_threads x
    intra_threads). A decoder step is a few dozen small operations per layer; sharing each of
    them between two threads costs a synchronisation per operation, while two batches on one
    thread each keep both cores busy (the split CTranslate2 is fastest with too; docs/performance.md).
    The operations release the GIL, so the workers run in parallel.
    """

    constrains = True
    """Whether it searches with constraints."""

    def __init__(self, models: Sequence[Transformer], max_tokens: int, sampling: Optional[SamplingConfig] = None,
                 threads: int = 0, inter_threads: int = 0):
        self.models, self.max_tokens = list(models), max_tokens
        self.device = next(self.models[0].parameters()).device
        self.max_positions = min(m.cfg.max_positions for m in self.models)
        self.decoder_layers = min(m.cfg.decoder_layers for m in self.models)
        self.path = decoder_path(self.models[0])
        """The decoder step `nmt.ops.optimize_for` chose: "native" or "stock"."""
        self.sampling = sampling if sampling is not None and sampling.sampling else None
        """With --sampling: one draw per line (nmt.inference.sampling) instead of the beam search."""
        self.generator = torch.Generator(self.device).manual_seed(sampling.seed) if self.sampling else None
        self.threads = threads or torch.get_num_threads()
        self.inter_threads = resolve_inter_threads(inter_threads, self.threads, self.device.type, self.sampling is not None)
        """Batches searched at once (see the class docstring)."""
        self._pool: Optional[ThreadPoolExecutor] = None

    def decode(self, ids: list[list[int]], search: SearchConfig, requests: Optional[Sequence[TargetRequest]] = None,
               alignment_layer: Optional[int] = None) -> list[list[Hypothesis]]:
        if self.sampling is not None and requests is not None and any(requests):
            raise NmtError("--sampling draws free translations; a prefix or constraints need the beam search")
        hyps: list[list[Hypothesis]] = [[] for _ in ids]
        batches = list(self._batches(ids))
        requests = list(requests) if requests is not None else [NO_REQUEST] * len(ids)

        def search_batch(batch: list[int]) -> list[list[Hypothesis]]:
            return self._search(ids, batch, search, requests, alignment_layer)

        if self.inter_threads > 1 and len(batches) > 1:
            if self._pool is None:  # the same worker threads for every call: each keeps its thread team
                self._pool = ThreadPoolExecutor(self.inter_threads, thread_name_prefix="nmt-decode")
            with _intra_threads(self.threads // self.inter_threads, self.threads):
                found = list(self._pool.map(search_batch, batches))
        else:
            found = [search_batch(batch) for batch in batches]
        for batch, batch_hyps in zip(batches, found):
            for i, hyp in zip(batch, batch_hyps):
                hyps[i] = hyp
        return hyps

    def _search(self, ids: list[list[int]], batch: list[int], search: SearchConfig, requests: list[TargetRequest],
                alignment_layer: Optional[int]) -> list[list[Hypothesis]]:
        """One batch. Its lines with constraints are searched again on their own by the
        constrained search; the plain search still runs on the whole batch when it holds any
        line without, so those lines get exactly what they would get without the others."""
        src = self._source_tensor([ids[i] for i in batch])
        if self.sampling is not None:
            from nmt.inference.sampling import sample

            return sample(self.models, src, self.sampling, search, self.generator)
        constrained = [j for j, i in enumerate(batch) if requests[i].constraints]
        found: list[list[Hypothesis]] = [[] for _ in batch]
        if len(constrained) < len(batch):
            prefixes = [requests[i].prefix for i in batch]
            found = beam_search(self.models, src, search, prefixes=prefixes if any(prefixes) else None)
        if constrained:
            from nmt.inference.constrained_search import constrained_beam_search

            sub = self._source_tensor([ids[batch[j]] for j in constrained])
            for j, hyps in zip(constrained, constrained_beam_search(self.models, sub, search, [requests[batch[j]] for j in constrained])):
                found[j] = hyps
        if alignment_layer is not None:
            from nmt.inference.source_attention import attach_attention

            attach_attention(self.models, src, found, alignment_layer)
        return found

    def _batches(self, ids: list[list[int]]) -> list[list[int]]:
        """Indices of non-empty lines, longest first, in batches of at most max_tokens padded
        source tokens; with `inter_threads` workers, as many batches as a multiple of the workers.

        Cut at max_tokens alone, the last batch is whatever is left, often a small one, and runs
        alone while the other worker waits
        (bench/results/2026-12-04_63daffd_zen4_balanced-decoder-batches.json). So the batch budget
        is lowered to the smallest that still cuts the lines into the next multiple of the
        workers, which makes the batches about equal. Outputs do not depend on the batches."""
        order = sorted((i for i, seq in enumerate(ids) if seq), key=lambda i: -len(ids[i]))
        batches = _cut(order, ids, self.max_tokens)
        workers = self.inter_threads
        if workers > 1 and len(batches) % workers:
            target = -(-len(batches) // workers) * workers
            low, high = 1, self.max_tokens  # _cut(.., high) has at most `target` batches
            while low < high:  # the smallest budget that cuts into at most `target` batches
                mid = (low + high) // 2
                low, high = (mid + 1, high) if len(_cut(order, ids, mid)) > target else (low, mid)
            balanced = _cut(order, ids, low)
            if len(balanced) == target:
                batches = balanced
        return batches

    def _source_tensor(self, seqs: list[list[int]]) -> torch.Tensor:
        """(B, S) right-padded with pad, each sentence followed by eos (`nmt.data.batching.padded_sources`)."""
        return source_tensor(seqs, self.models[0].cfg.special_ids).to(self.device, non_blocking=True)


def _cut(order: list[int], ids: list[list[int]], budget: int) -> list[list[int]]:
    """`order` (line indices) cut greedily into batches of at most `budget` padded source tokens
    (eos included); a line longer than the budget is a batch of its own."""
    batches: list[list[int]] = []
    batch: list[int] = []
    width = 0
    for i in order:
        n = len(ids[i]) + 1
        if batch and (len(batch) + 1) * max(width, n) > budget:
            batches.append(batch)
            batch, width = [], 0
        batch.append(i)
        width = max(width, n)
    if batch:
        batches.append(batch)
    return batches


@contextmanager
def _intra_threads(during: int, after: int) -> Iterator[None]:
    """PyTorch's thread count (one setting for the whole process) set to `during` for the
    workers' operations, then back to `after`."""
    torch.set_num_threads(max(1, during))
    try:
        yield
    finally:
        torch.set_num_threads(after)
