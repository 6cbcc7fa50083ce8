"""The decoder step's ops against the stock ops they replace in CPU fp32 inference (`nmt.ops`).

One thread (what each of `nmt translate`'s CPU workers has), the shapes of a beam-4 step over
a batch of 150 sentences (600 rows), models `mini` (d_model 128) and `small` (256):
- linear layers: `F.linear` (MKL sgemm) against `nmt.ops.onednn_linear.onednn_linear`, for the
  products of a decoder layer and the vocabulary projection (8,000 entries, a CPU logit block);
- encoder-decoder attention: `F.scaled_dot_product_attention` against
  `nmt.ops.product_attention.attention_by_products`, beam 4 queries per sentence, S source keys;
- the vocabulary step of the search (`nmt.inference.beam_search.row_candidates` after the
  decoder layers: projection, log-softmax, each row's best tokens) for 600 rows, with the rows
  projected a block at a time (`LOGIT_BLOCK_ELEMENTS`), per block size: the whole-batch block
  (every logit written at once) against smaller blocks whose logits stay in the core's cache.
The two sides of a row alternate, five rounds each, and each keeps its best round: a shared
CPU only ever slows a timing down.

    .venv/bin/python bench/bench_decoder_ops.py

Prints one line per shape and writes bench/results/DATE_COMMIT_MACHINE_bench-decoder-ops.json.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, write_result  # noqa: E402

sys.path.insert(0, str(REPO))
import nmt.inference.beam_search as search  # noqa: E402
from nmt.model.config import build_config  # noqa: E402
from nmt.model.transformer import Transformer  # noqa: E402
from nmt.ops.product_attention import attention_by_products  # noqa: E402
from nmt.ops.onednn_linear import onednn_linear, onednn_pays_off  # noqa: E402


def best_ms(stock: Callable[[], object], fast: Callable[[], object], calls: int = 20, rounds: int = 5) -> tuple[float, float]:
    """Best milliseconds per call of `stock` and `fast`, timed in alternating rounds."""
    best = [float("inf"), float("inf")]
    for f in (stock, fast):
        f(), f()  # warm-up: kernels, allocator
    for _ in range(rounds):
        for i, f in enumerate((stock, fast)):
            start = time.perf_counter()
            for _ in range(calls):
                f()
            best[i] = min(best[i], (time.perf_counter() - start) / calls * 1e3)
    return best[0], best[1]


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows, sentences = 600, 150
    linear, attention = [], []
    with torch.inference_mode():
        for d_model in (128, 256):
            for d_in, d_out in ((d_model, 3 * d_model), (d_model, d_model), (d_model, 4 * d_model), (4 * d_model, d_model), (d_model, 8000)):
                n = 262 if d_out == 8000 else rows  # the vocabulary projection's CPU block of rows
                x, w, b = torch.randn(n, d_in), torch.randn(d_out, d_in), torch.randn(d_out)
                torch.testing.assert_close(onednn_linear(x, w, b), F.linear(x, w, b), rtol=1e-4, atol=1e-3)
                mkl, onednn = best_ms(lambda: F.linear(x, w, b), lambda: onednn_linear(x, w, b))
                gflop = 2 * n * d_in * d_out / 1e6
                linear.append({"rows": n, "in": d_in, "out": d_out, "f_linear_ms": round(mkl, 3), "onednn_ms": round(onednn, 3),
                               "f_linear_gflop_per_s": round(gflop / mkl, 1), "onednn_gflop_per_s": round(gflop / onednn, 1),
                               "speedup": round(mkl / onednn, 3)})
                print(f"linear {n}x{d_in}->{d_out}: F.linear {mkl:.3f} ms, oneDNN {onednn:.3f} ms = {mkl / onednn:.2f}x", flush=True)
            heads, d_head = 4, d_model // 4
            for source in (10, 20, 40):
                q = torch.randn(sentences, heads, 4, d_head)
                k, v = torch.randn(sentences, heads, source, d_head), torch.randn(sentences, heads, source, d_head)
                mask = torch.ones(sentences, 1, 1, source, dtype=torch.bool)
                mask[::3, ..., -3:] = False  # a third of the sentences padded
                torch.testing.assert_close(attention_by_products(q, k, v, mask), F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                           rtol=1e-4, atol=1e-5)
                sdpa, products = best_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                                         lambda: attention_by_products(q, k, v, mask))
                attention.append({"d_model": d_model, "sentences": sentences, "beam": 4, "source": source,
                                  "sdpa_ms": round(sdpa, 3), "products_ms": round(products, 3), "speedup": round(sdpa / products, 3)})
                print(f"cross-attention d_model {d_model}, S {source}: SDPA {sdpa:.3f} ms, products {products:.3f} ms = {sdpa / products:.2f}x", flush=True)
        vocabulary = vocabulary_step(rows)
    write_result("decoder-ops", {"threads": 1, "torch": torch.__version__, "onednn_used_by_nmt_here": onednn_pays_off(),
                                 "linear": linear, "cross_attention": attention, "vocabulary_step": vocabulary})


class _HiddenOnly:
    """A model for `row_candidates` whose decoder layers already ran: it hands back fixed
    decoder states and projects them with a real model's projection."""

    def __init__(self, model: Transformer, hidden: torch.Tensor):
        self.model, self.hidden, self.cfg = model, hidden, model.cfg

    def decode_step_hidden(self, tokens: torch.Tensor, state: object) -> torch.Tensor:
        return self.hidden

    def project_fp32(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.project_fp32(hidden)


def vocabulary_step(rows: int, vocab: int = 8000) -> list[dict]:
    """`row_candidates` (beam 4: 8 candidates per row) for `rows` decoder states, per block of rows."""
    results = []
    default = search.LOGIT_BLOCK_ELEMENTS
    for arch in ("mini", "small"):
        model = Transformer(build_config(arch, vocab, vocab)).eval()
        hidden = torch.randn(rows, model.cfg.d_model)
        stub, tokens = _HiddenOnly(model, hidden), torch.zeros(rows, dtype=torch.long)

        def step(block_rows: int) -> search.RowCandidates:
            search.LOGIT_BLOCK_ELEMENTS = block_rows * vocab
            return search.row_candidates([stub], [None], tokens, 8)

        whole = step(rows)
        for block_rows in (16, 32, 64, 128, default // vocab):
            torch.testing.assert_close(step(block_rows).log_probs, whole.log_probs)
            whole_ms, block_ms = best_ms(lambda: step(rows), lambda: step(block_rows), calls=5)
            results.append({"arch": arch, "d_model": model.cfg.d_model, "rows": rows, "vocab": vocab, "block_rows": block_rows,
                            "block_mib": round(block_rows * vocab * 4 / 2**20, 2), "whole_batch_ms": round(whole_ms, 3),
                            "block_ms": round(block_ms, 3), "speedup": round(whole_ms / block_ms, 3)})
            print(f"vocabulary step {arch}, {rows} rows: one block {whole_ms:.2f} ms, blocks of {block_rows} rows "
                  f"{block_ms:.2f} ms = {whole_ms / block_ms:.2f}x", flush=True)
    search.LOGIT_BLOCK_ELEMENTS = default
    return results


if __name__ == "__main__":
    main()
