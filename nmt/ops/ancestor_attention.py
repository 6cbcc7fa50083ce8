"""Decoder self-attention over a key/value cache that beam search never reorders, in C++.

A beam search step keeps each sentence's best hypotheses, and every kept row continues some
row of the step before (its parent). The stock cache (`nmt.model.incremental.SelfAttentionCache`)
follows that by gathering every layer's keys and values into the new row order, each step: on
a `mini` model that copy and the attention after it were the largest cost of a step that
PyTorch cannot fuse (#30). Here a layer's keys and values are written once, at the row and
step that computed them, and each row keeps a table of ancestors: the row of every earlier step
that it descends from. A step gathers that table (4 bytes per row and step, not 2 x d_model
floats) and the attention reads the keys through it:

    Attention(q, K, V) = softmax(q K_anc^T / sqrt(d_k)) V_anc,   K_anc[s] = K[s, anc[s]]   (3.2.1)

one query per row and head, computed in one pass over the row's keys and values by the C++
loop below (a second loop does the same for the encoder-decoder attention of the step, each row
against its sentence's source keys: `source_attention`), compiled on first use with PyTorch's extension builder (a C++ compiler and ninja are
needed; the build is cached per CPU in PyTorch's extensions folder). Where it cannot be built,
fp32 inference keeps the packed PyTorch step (`nmt.ops.cpu_decoder_step`) and says so once on
stderr: the same maths, whose float rounding may differ in the last bits.

bench/results/2026-12-06_0f4956f_sapphire-rapids_ancestor-attention-prototype.json: 3-5x
faster than the reorder and attention it replaces (1 thread, 4 heads, 300-1000 rows, 4-30
steps). tests/test_ancestor_attention.py checks the loop against
`F.scaled_dot_product_attention` over the gathered keys, and the decoder step against the
stock one.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from typing import Any, Optional

import torch
from torch import Tensor

from nmt.model.incremental import grown_capacity
from nmt.ops.cpu_features import cpu_flags, cpuinfo_field

DISABLE_ENV = "NMT_NATIVE_ATTENTION"
"""Set to 0 to decode with the PyTorch step even where the C++ loop builds (A/B, debugging)."""

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>

// softmax(q k_s / sqrt(D)) v_s summed over the steps s in [0, T), for one query q of D floats:
// key(s) and value(s) point at step s's vectors (key(s) == nullptr: s is masked out); p holds T scores.
template <class Key, class Value>
inline void attend_one(const float* q, int64_t D, int64_t T, float scale, Key key, Value value, float* p, float* out) {
  float m = -INFINITY;
  for (int64_t s = 0; s < T; ++s) {
    const float* k = key(s);
    if (k == nullptr) {
      p[s] = -INFINITY;
      continue;
    }
    float dot = 0.f;
#pragma omp simd reduction(+ : dot)
    for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
    p[s] = dot * scale;
    m = p[s] > m ? p[s] : m;
  }
  float z = 0.f;
  for (int64_t s = 0; s < T; ++s) {
    p[s] = std::exp(p[s] - m);  // 0 where masked
    z += p[s];
  }
  for (int64_t d = 0; d < D; ++d) out[d] = 0.f;
  for (int64_t s = 0; s < T; ++s) {
    if (p[s] == 0.f) continue;
    const float* v = value(s);
    const float w = p[s] / z;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) out[d] += w * v[d];
  }
}

// q (R, H, D), rows may be strided (a view of the qkv projection).
static void check_query(const torch::Tensor& q) {
  TORCH_CHECK(q.dtype() == torch::kFloat && q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2), "fp32 q (R, H, D), heads contiguous");
}

// Self-attention: kv (steps held, rows held, 2, H, D), keys at [s, row, 0], values at [s, row, 1];
// anc (R, capacity) int32, anc[r][s] the row of step s that row r descends from; steps [0, t).
torch::Tensor ancestor_attention(const torch::Tensor& q, const torch::Tensor& kv, const torch::Tensor& anc, int64_t t) {
  check_query(q);
  TORCH_CHECK(kv.dtype() == torch::kFloat && anc.dtype() == torch::kInt && kv.is_contiguous() && anc.stride(1) == 1, "fp32 kv, int32 anc");
  TORCH_CHECK(t >= 1 && t <= kv.size(0) && t <= anc.size(1) && anc.size(0) == q.size(0), "shapes");
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), q_row = q.stride(0);
  const int64_t step_stride = kv.stride(0), row_stride = kv.stride(1), value_offset = kv.stride(2), anc_stride = anc.stride(0);
  auto out = torch::empty({R, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kvp = kv.data_ptr<float>();
  const int32_t* ap = anc.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> p(t);
    for (int64_t r = begin; r < end; ++r) {
      const int32_t* a = ap + r * anc_stride;
      for (int64_t h = 0; h < H; ++h) {
        const float* head = kvp + h * D;
        attend_one(qp + r * q_row + h * D, D, t, scale,
                   [&](int64_t s) { return head + s * step_stride + a[s] * row_stride; },
                   [&](int64_t s) { return head + s * step_stride + a[s] * row_stride + value_offset; },
                   p.data(), op + (r * H + h) * D);
      }
    }
  });
  return out;
}

// Encoder-decoder attention: the rows of sentence n are [n R/N, (n+1) R/N); k, v (N, H, S, D);
// mask (N, S) bool, true where attention is allowed, or empty.
torch::Tensor source_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& mask) {
  check_query(q);
  TORCH_CHECK(k.dtype() == torch::kFloat && v.dtype() == torch::kFloat && k.is_contiguous() && v.is_contiguous(), "fp32 k, v");
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), q_row = q.stride(0), N = k.size(0), S = k.size(2);
  TORCH_CHECK(N > 0 && R % N == 0 && k.size(1) == H && k.size(3) == D && v.sizes() == k.sizes(), "shapes");
  const bool masked = mask.numel() > 0;
  TORCH_CHECK(!masked || (mask.dtype() == torch::kBool && mask.is_contiguous() && mask.numel() == N * S), "mask (N, S) bool");
  const int64_t per_sentence = R / N;
  auto out = torch::empty({R, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const bool* mp = masked ? mask.data_ptr<bool>() : nullptr;
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> p(S);
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / per_sentence;
      const bool* allowed = mp ? mp + n * S : nullptr;
      for (int64_t h = 0; h < H; ++h) {
        const float* kh = kp + (n * H + h) * S * D;
        const float* vh = vp + (n * H + h) * S * D;
        attend_one(qp + r * q_row + h * D, D, S, scale,
                   [&](int64_t s) { return allowed && !allowed[s] ? nullptr : kh + s * D; },
                   [&](int64_t s) { return vh + s * D; },
                   p.data(), op + (r * H + h) * D);
      }
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // without the interpreter lock: nmt's decoder workers (--inter-threads) run them at once
  m.def("ancestor_attention", &ancestor_attention, pybind11::call_guard<pybind11::gil_scoped_release>());
  m.def("source_attention", &source_attention, pybind11::call_guard<pybind11::gil_scoped_release>());
}
"""

_lock = threading.Lock()
_built: dict[str, Any] = {}


def native_module() -> Optional[Any]:
    """The compiled loop, built on the first call of a process (cached across processes), or
    None where it cannot be built or NMT_NATIVE_ATTENTION=0; a failed build says why once on stderr."""
    if os.environ.get(DISABLE_ENV, "1") == "0":
        return None
    with _lock:
        if "module" not in _built:
            _built["module"] = _build()
        return _built["module"]


def _build() -> Optional[Any]:
    # -march=native: the name carries the CPU, so a cache shared between machines never loads
    # another CPU's build.
    cpu = hashlib.sha1((cpuinfo_field("model name") + " ".join(sorted(cpu_flags()))).encode()).hexdigest()[:10]
    name = f"nmt_ancestor_attention_{cpu}"
    try:
        from torch.utils import cpp_extension

        if not _already_built(cpp_extension, name):
            print("nmt: building the C++ decoder attention for this CPU, once (about 30 s; cached in PyTorch's "
                  "extensions folder)", file=sys.stderr)
        return cpp_extension.load_inline(name, cpp_sources=_SOURCE, extra_cflags=["-O3", "-march=native", "-fopenmp"],
                                         verbose=False)
    except Exception as e:  # no compiler, no ninja, no headers: the PyTorch step instead
        lines = str(e).strip().splitlines() or [type(e).__name__]
        # the compiler's own complaint (missing, or an error) rather than ninja's last words
        said = [line for key in ("not found", "error:", "No such file") for line in lines if key in line]
        reason = (said or lines[-1:])[0].strip()[:200]
        print(f"nmt: the C++ decoder attention could not be built ({reason}); decoding with the PyTorch step "
              f"instead: slower, and its float rounding may differ in the last bits", file=sys.stderr)
        return None


def _already_built(cpp_extension: Any, name: str) -> bool:
    """Whether a build of `name` is in PyTorch's extensions folder (a private helper of
    PyTorch's: where it is gone, the first build is not announced)."""
    try:
        return os.path.isfile(os.path.join(cpp_extension._get_build_directory(name, verbose=False), f"{name}.so"))
    except Exception:
        return True


def _loaded() -> Any:
    """The built module for a decoding step: after the first build a dictionary lookup, not
    `native_module`'s lock and environment read on every layer of every step."""
    module = _built.get("module") or native_module()
    if module is None:
        raise RuntimeError("the C++ decoder attention is not built here (nmt.ops.ancestor_attention.native_module)")
    return module


def ancestor_attention(q: Tensor, kv: Tensor, anc: Tensor, steps: int) -> Tensor:
    """Attention of q (rows, h, d_head; rows may be strided) over `steps` steps of kv (steps
    held, rows held, 2, h, d_head), row r reading step s at row anc[r, s] (anc: int32, (rows,
    capacity)); (rows, h, d_head)."""
    return _loaded().ancestor_attention(q, kv, anc, steps)


_NO_MASK = torch.empty(0, dtype=torch.bool)


def source_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
    """The encoder-decoder attention of a step in one pass (3.2.3): q (rows, h, d_head; rows
    may be strided), a sentence's rows adjacent, against its source keys and values k, v (N, h,
    S, d_head); `mask` (N, 1, 1, S) True where attention is allowed, or None; (rows, h, d_head).
    `nmt.ops.product_attention.attention_by_products` computes the same in PyTorch."""
    flat = _NO_MASK if mask is None else mask.reshape(mask.size(0), mask.size(-1)).contiguous()
    return _loaded().source_attention(q, k, v, flat)


class AncestorSelfAttentionCache:
    """One layer's keys and values by step and the row that computed them, `kv` (capacity,
    rows held, 2, h, d_head), and each live row's ancestors, `anc` (rows, capacity) int32.

    `reorder` gathers the ancestor table only. Rows of finished hypotheses stay in `kv` until
    the live rows are fewer than half of the rows held; the cache is then compacted (every
    live row's keys and values gathered once, the table reset), so it holds at most about
    twice what a reordered cache holds. The steps' capacity grows by half when full.
    """

    def __init__(self) -> None:
        self.kv: Optional[Tensor] = None
        self.anc: Optional[Tensor] = None
        self.rows = 0
        self.length = 0

    def attend(self, q: Tensor, kv: Tensor) -> Tensor:
        """Add this step's keys and values kv (rows, 2, h, d_head) and return the attention of
        q (rows, h, d_head) over all steps so far, (rows, h, d_head)."""
        n = kv.size(0)
        t = self.length
        if self.kv is None:
            self.kv = kv.new_empty(grown_capacity(0), n, *kv.shape[1:])
            self.anc = torch.empty(n, grown_capacity(0), dtype=torch.int32)
        else:
            capacity, held = self.kv.shape[:2]
            if t == capacity or n > held:  # full, or more rows than held (the first step's fan-out)
                self._grow(max(n, held), grown_capacity(capacity) if t == capacity else capacity)
        self.kv[t, :n] = kv
        self.anc[:n, t] = torch.arange(n, dtype=torch.int32)
        self.rows, self.length = n, t + 1
        return ancestor_attention(q, self.kv, self.anc[:n], t + 1)

    def _grow(self, rows: int, capacity: int) -> None:
        kv = self.kv.new_empty(capacity, rows, *self.kv.shape[2:])
        kv[: self.length, : self.kv.size(1)] = self.kv[: self.length]
        anc = torch.empty(max(rows, self.anc.size(0)), capacity, dtype=torch.int32)
        anc[: self.anc.size(0), : self.length] = self.anc[:, : self.length]
        self.kv, self.anc = kv, anc

    def reorder(self, rows: Tensor, spare: Optional[Tensor]) -> Optional[Tensor]:
        """Row i continues row rows[i]: its ancestors become that row's. The spare buffer of
        `SelfAttentionCache` is not used and is passed on."""
        if self.kv is None:
            return spare
        n, live = rows.numel(), slice(0, self.length)
        anc = torch.empty(max(n, self.anc.size(0)), self.anc.size(1), dtype=torch.int32)
        torch.index_select(self.anc[: self.rows, live], 0, rows, out=anc[:n, live])
        self.anc, self.rows = anc, n
        if 2 * n < self.kv.size(1):
            self._compact()
        return spare

    def _compact(self) -> None:
        """Keep only the live rows' keys and values: kv[s, i] = kv[s, anc[i, s]], anc[i, s] = i."""
        n, t = self.rows, self.length
        steps = torch.arange(t)[None, :]
        live = self.kv[steps, self.anc[:n, :t].long()]  # (n, t, 2, h, d_head)
        kv = self.kv.new_empty(self.kv.size(0), n, *self.kv.shape[2:])
        kv[:t] = live.transpose(0, 1)
        self.kv = kv
        self.anc = torch.arange(n, dtype=torch.int32)[:, None].expand(n, self.anc.size(1)).contiguous()
