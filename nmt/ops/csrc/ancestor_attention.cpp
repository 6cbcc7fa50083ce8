// nmt's decoder attention over caches that beam search never reorders (nmt/ops/ancestor_attention.py
// says why and how), and the encoder-decoder attention of a step: one pass over the keys and values
// per query row (self-attention: all heads at once) or per row and head (encoder-decoder).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "vector_exp.h"

// out = sum over s in [0, T) of softmax(p)_s value(s), values of D floats; p holds the T scores
// (-inf: masked out, weight 0) and is overwritten; m, where given, is their maximum. kD > 0 is D known when compiling (the usual
// head sizes): the weighted sum then stays in registers instead of going through `out` at every step.
template <int64_t kD, class Value>
inline void softmax_values(int64_t D, int64_t T, Value value, float* p, float* out, float m = NAN) {
  if constexpr (kD > 0) D = kD;
  if (std::isnan(m)) {  // the caller did not give the largest score
    m = -INFINITY;
    for (int64_t s = 0; s < T; ++s) m = p[s] > m ? p[s] : m;
  }
  float z = 0.f;
#pragma omp simd reduction(+ : z)
  for (int64_t s = 0; s < T; ++s) {
    p[s] = exp_nonpositive(p[s] - m);  // 0 where masked
    z += p[s];
  }
  float fixed[kD > 0 ? kD : 1];
  float* acc = kD > 0 ? fixed : out;
  for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
  for (int64_t s = 0; s < T; ++s) {
    if (p[s] == 0.f) continue;
    const float* v = value(s);
    const float w = p[s];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) acc[d] += w * v[d];
  }
  const float inv_z = 1.0f / z;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) out[d] = acc[d] * inv_z;
}

// All H heads of one row of the self-attention: the row's keys and values at step s are one block
// (keys of every head, then values) at kv(s), read once per step for all heads rather than once per
// head, and the next steps' blocks are prefetched (they are scattered through the cache by the
// ancestor table, where the hardware prefetcher cannot follow). p holds H x T scores, out H x D.
template <int64_t kD, class Block>
inline void attend_row(const float* q, int64_t H, int64_t D, int64_t T, float scale, Block kv, int64_t value_offset,
                       float* p, float* out) {
  if constexpr (kD > 0) D = kD;
  constexpr int64_t kAhead = 2;  // steps prefetched ahead
  constexpr int64_t kLine = 64;  // bytes per cache line
  const int64_t block_bytes = 2 * value_offset * static_cast<int64_t>(sizeof(float));
  for (int64_t s = 0; s < T; ++s) {
    if (s + kAhead < T) {
      const char* next = reinterpret_cast<const char*>(kv(s + kAhead));
      for (int64_t b = 0; b < block_bytes; b += kLine) __builtin_prefetch(next + b);
    }
    const float* k = kv(s);
    for (int64_t h = 0; h < H; ++h) {
      const float* kh = k + h * D;
      const float* qh = q + h * D;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < D; ++d) dot += qh[d] * kh[d];
      p[h * T + s] = dot * scale;
    }
  }
  for (int64_t h = 0; h < H; ++h)
    softmax_values<kD>(D, T, [&](int64_t s) { return kv(s) + value_offset + h * D; }, p + h * T, out + h * D);
}

constexpr int64_t kSourceLanes = 16;  // source positions scored at once; the transposed keys are padded to a multiple

// p[s] = q k_s / sqrt(D) for the S source positions of one head, from its keys transposed, kT (D,
// S_pad): kSourceLanes scores accumulate side by side (one vector register) over d, so no score
// needs a sum across a register's lanes, as a dot product of q and k_s would. allowed: the mask, or
// null. Returns the largest score.
template <int64_t kD>
inline float source_scores(const float* q, int64_t D, const float* kT, int64_t S, int64_t S_pad, float scale,
                           const bool* allowed, float* p) {
  if constexpr (kD > 0) D = kD;
  float m = -INFINITY;
  for (int64_t s0 = 0; s0 < S; s0 += kSourceLanes) {
    float acc[kSourceLanes] = {0.f};
    for (int64_t d = 0; d < D; ++d) {
      const float qd = q[d];
      const float* kd = kT + d * S_pad + s0;
#pragma omp simd
      for (int64_t l = 0; l < kSourceLanes; ++l) acc[l] += qd * kd[l];
    }
    const int64_t n = std::min(kSourceLanes, S - s0);
    for (int64_t l = 0; l < n; ++l) {
      p[s0 + l] = allowed && !allowed[s0 + l] ? -INFINITY : acc[l] * scale;
      m = p[s0 + l] > m ? p[s0 + l] : m;
    }
  }
  return m;
}

// source_scores and softmax_values for G rows of one sentence and one head at once (kD > 0): they
// read the same keys and values, which are then loaded once for all G rows. q[i], out[i]: row i's
// query and output; p holds G x S scores.
template <int64_t kD, int64_t G>
inline void source_group(const float* const* q, const float* kT, const float* v, int64_t S, int64_t S_pad, float scale,
                         const bool* allowed, float* p, float* const* out) {
  static_assert(kD > 0, "head size known when compiling");
  float m[G], z[G];
  for (int64_t i = 0; i < G; ++i) m[i] = -INFINITY;
  for (int64_t s0 = 0; s0 < S; s0 += kSourceLanes) {
    float acc[G][kSourceLanes] = {};
    for (int64_t d = 0; d < kD; ++d) {
      const float* kd = kT + d * S_pad + s0;
      for (int64_t i = 0; i < G; ++i) {
        const float qd = q[i][d];
#pragma omp simd
        for (int64_t l = 0; l < kSourceLanes; ++l) acc[i][l] += qd * kd[l];
      }
    }
    const int64_t n = std::min(kSourceLanes, S - s0);
    for (int64_t i = 0; i < G; ++i)
      for (int64_t l = 0; l < n; ++l) {
        const float score = allowed && !allowed[s0 + l] ? -INFINITY : acc[i][l] * scale;
        p[i * S + s0 + l] = score;
        m[i] = score > m[i] ? score : m[i];
      }
  }
  for (int64_t i = 0; i < G; ++i) {
    float* pi = p + i * S;
    float zi = 0.f;
#pragma omp simd reduction(+ : zi)
    for (int64_t s = 0; s < S; ++s) {
      pi[s] = exp_nonpositive(pi[s] - m[i]);  // 0 where masked
      zi += pi[s];
    }
    z[i] = zi;
  }
  float acc[G][kD] = {};
  for (int64_t s = 0; s < S; ++s) {
    const float* vs = v + s * kD;
    for (int64_t i = 0; i < G; ++i) {
      const float w = p[i * S + s];
#pragma omp simd
      for (int64_t d = 0; d < kD; ++d) acc[i][d] += w * vs[d];
    }
  }
  for (int64_t i = 0; i < G; ++i) {
    const float inv_z = 1.0f / z[i];
#pragma omp simd
    for (int64_t d = 0; d < kD; ++d) out[i][d] = acc[i][d] * inv_z;
  }
}

constexpr int64_t kSourceGroup = 4;  // rows of a sentence attended together (a beam of 4: one sentence's rows)

// f(std::integral_constant<int64_t, kD>) with kD = D for the usual head sizes, else 0 (D at run time).
template <class F>
inline void with_head_size(int64_t D, F f) {
  if (D == 32) f(std::integral_constant<int64_t, 32>());
  else if (D == 64) f(std::integral_constant<int64_t, 64>());
  else f(std::integral_constant<int64_t, 0>());
}

// q (R, H, D), rows may be strided (a view of the qkv projection).
static void check_query(const torch::Tensor& q) {
  TORCH_CHECK(q.dtype() == torch::kFloat && q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2), "fp32 q (R, H, D), heads contiguous");
}

// Self-attention: steps[s] (rows of step s, 2, H, D), the keys and values step s computed, keys at
// [row, 0], values at [row, 1]; anc (R, capacity) int32, anc[r][s] the row of step s that row r
// descends from (a row of steps[s]: the cache's invariant, not checked here per step); steps [0, t).
torch::Tensor ancestor_attention(const torch::Tensor& q, const std::vector<torch::Tensor>& steps, const torch::Tensor& anc,
                                 int64_t t) {
  check_query(q);
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), q_row = q.stride(0);
  TORCH_CHECK(anc.dtype() == torch::kInt && anc.stride(1) == 1, "int32 anc, steps contiguous");
  TORCH_CHECK(t >= 1 && t <= static_cast<int64_t>(steps.size()) && t <= anc.size(1) && anc.size(0) == R, "shapes");
  std::vector<const float*> step_kv(t);
  for (int64_t s = 0; s < t; ++s) {
    const auto& kv = steps[s];
    TORCH_CHECK(kv.dtype() == torch::kFloat && kv.is_contiguous() && kv.dim() == 4 && kv.size(1) == 2 && kv.size(2) == H && kv.size(3) == D,
                "fp32 steps (rows, 2, H, D), contiguous");
    step_kv[s] = kv.data_ptr<float>();
  }
  const int64_t row_stride = 2 * H * D, value_offset = H * D, anc_stride = anc.stride(0);
  auto out = torch::empty({R, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const int32_t* ap = anc.data_ptr<int32_t>();
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  with_head_size(D, [&](auto kD) {
    at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> p(H * t);
      for (int64_t r = begin; r < end; ++r) {
        const int32_t* a = ap + r * anc_stride;
        attend_row<kD>(qp + r * q_row, H, D, t, scale, [&](int64_t s) { return step_kv[s] + a[s] * row_stride; }, value_offset,
                       p.data(), op + r * H * D);
      }
    });
  });
  return out;
}

// Encoder-decoder attention: the rows of live sentence i are [i R/L, (i+1) R/L), L = sentences.size(0),
// and its source is entry n = sentences[i] of: keys transposed and padded, kT (N, H, D, S_pad), S_pad a
// multiple of kSourceLanes (padding: any finite value); values v (N, H, S, D); mask (N, S) bool, true
// where attention is allowed, or empty.
torch::Tensor source_attention(const torch::Tensor& q, const torch::Tensor& kT, const torch::Tensor& v, const torch::Tensor& mask,
                               const torch::Tensor& sentences) {
  check_query(q);
  TORCH_CHECK(kT.dtype() == torch::kFloat && v.dtype() == torch::kFloat && kT.is_contiguous() && v.is_contiguous() && kT.dim() == 4 &&
              v.dim() == 4, "fp32 kT, v contiguous");
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), q_row = q.stride(0), N = v.size(0), S = v.size(2), S_pad = kT.size(3);
  TORCH_CHECK(v.size(1) == H && v.size(3) == D && kT.size(0) == N && kT.size(1) == H && kT.size(2) == D && S_pad >= S &&
              S_pad % kSourceLanes == 0, "shapes");
  TORCH_CHECK(sentences.dtype() == torch::kLong && sentences.dim() == 1 && sentences.is_contiguous(), "sentences: int64 (L,)");
  const int64_t L = sentences.size(0);
  TORCH_CHECK(L > 0 && R % L == 0, "rows: a multiple of the live sentences");
  const int64_t* sp = sentences.data_ptr<int64_t>();
  for (int64_t i = 0; i < L; ++i) TORCH_CHECK(sp[i] >= 0 && sp[i] < N, "sentences: entries of kT and v");
  const bool masked = mask.numel() > 0;
  TORCH_CHECK(!masked || (mask.dtype() == torch::kBool && mask.is_contiguous() && mask.numel() == N * S), "mask (N, S) bool");
  const int64_t per_sentence = R / L;
  auto out = torch::empty({R, H, D}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kp = kT.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const bool* mp = masked ? mask.data_ptr<bool>() : nullptr;
  float* op = out.data_ptr<float>();
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  with_head_size(D, [&](auto kD) {
    at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
      std::vector<float> p(kSourceGroup * S);
      for (int64_t r = begin; r < end;) {
        const int64_t sentence = r / per_sentence, n = sp[sentence];
        const bool* allowed = mp ? mp + n * S : nullptr;
        // the next rows of this sentence in this chunk, up to kSourceGroup
        const int64_t g = kD > 0 ? std::min({kSourceGroup, end - r, (sentence + 1) * per_sentence - r}) : 1;
        for (int64_t h = 0; h < H; ++h) {
          const float* kh = kp + (n * H + h) * D * S_pad;
          const float* vh = vp + (n * H + h) * S * D;
          if constexpr (decltype(kD)::value > 0) {
            const float* q_rows[kSourceGroup];
            float* out_rows[kSourceGroup];
            for (int64_t i = 0; i < g; ++i) {
              q_rows[i] = qp + (r + i) * q_row + h * D;
              out_rows[i] = op + ((r + i) * H + h) * D;
            }
            constexpr int64_t kd = decltype(kD)::value;
            switch (g) {
              case 4: source_group<kd, 4>(q_rows, kh, vh, S, S_pad, scale, allowed, p.data(), out_rows); continue;
              case 3: source_group<kd, 3>(q_rows, kh, vh, S, S_pad, scale, allowed, p.data(), out_rows); continue;
              case 2: source_group<kd, 2>(q_rows, kh, vh, S, S_pad, scale, allowed, p.data(), out_rows); continue;
              default: break;
            }
          }
          const float m = source_scores<kD>(qp + r * q_row + h * D, D, kh, S, S_pad, scale, allowed, p.data());
          softmax_values<kD>(D, S, [&](int64_t s) { return vh + s * D; }, p.data(), op + (r * H + h) * D, m);
        }
        r += g;
      }
    });
  });
  return out;
}
