"""The projected loss's chunk size: forward + backward time of the label-smoothed loss over
`hidden @ weight.T` for several logits-per-chunk settings, on the CPU or a GPU.

Sets the constants `nmt.ops.projected_loss.PROJECTED_CHUNK_ELEMENTS` (CPU) and `..._CUDA` (GPU): too small a
chunk makes many small matrix products and adds the whole weight gradient once per chunk; too
large a one spills the chunk's logits out of cache (CPU) or costs memory (GPU). Prints ms per
call for each setting and the peak memory the call took on a GPU.

    python bench/bench_loss_chunks.py                                   # CPU, small's shape
    python bench/bench_loss_chunks.py --device cuda --tokens 25000 --d-model 1024 --vocab 32000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from nmt.ops import projected_loss as loss_module  # noqa: E402
from nmt.train.loss import ProjectedLogits, label_smoothed_nll_loss  # noqa: E402


def time_chunk(elements: int, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, dtype: torch.dtype,
               repeats: int) -> dict:
    """Best ms of forward + backward with `elements` logits per chunk (set on both constants)."""
    loss_module.PROJECTED_CHUNK_ELEMENTS = loss_module.PROJECTED_CHUNK_ELEMENTS_CUDA = elements
    cuda = hidden.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    best = float("inf")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(repeats + 1):  # the first call warms up (allocations, kernel choice)
        h, w = hidden.detach().requires_grad_(True), weight.detach().requires_grad_(True)
        sync()
        t = time.perf_counter()
        loss, _ = label_smoothed_nll_loss(ProjectedLogits(h, w, dtype), target, 0.1)
        loss.backward()
        sync()
        best = min(best, time.perf_counter() - t) if _ else best
    out = {"chunk_elements": elements, "rows_per_chunk": loss_module.projected_chunk_rows(weight.size(0), hidden.device),
           "ms": round(best * 1e3, 2)}
    if cuda:
        out["peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--log2-elements", type=int, nargs="+", default=None,
                    help="log2 of logits per chunk to try (default: 20..24 on CPU, 22..30 on a GPU)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    exps = args.log2_elements or (list(range(22, 31)) if device.type == "cuda" else list(range(20, 25)))
    torch.manual_seed(0)
    hidden = torch.randn(args.tokens, args.d_model, device=device)
    weight = torch.randn(args.vocab, args.d_model, device=device) * args.d_model**-0.5
    target = torch.randint(4, args.vocab, (args.tokens,), device=device)
    rows = []
    for e in exps:
        try:
            r = time_chunk(1 << e, hidden, weight, target, dtype, args.repeats)
        except torch.OutOfMemoryError:
            r = {"chunk_elements": 1 << e, "ms": None, "error": "out of memory"}
            torch.cuda.empty_cache()
        rows.append(r)
        print(f"2^{e} logits per chunk ({r.get('rows_per_chunk', '-')} rows): "
              + (f"{r['ms']:.2f} ms" if r["ms"] is not None else r["error"])
              + (f", peak {r['peak_mib']} MiB" if "peak_mib" in r else ""), flush=True)
    print(json.dumps({"bench": "loss_chunks", "device": str(device), "tokens": args.tokens, "d_model": args.d_model,
                      "vocab": args.vocab, "dtype": args.dtype, "results": rows}))


if __name__ == "__main__":
    main()
