// A beam search step's vocabulary work in one pass over each row of logits: log_softmax's
// normalizer, the row's best tokens and eos's log-probability (nmt/ops/vocabulary_top.py says why).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "vector_exp.h"

namespace {

constexpr int64_t kBlock = 64;  // logits per block: the ranking reads only the blocks whose maxima are high enough
constexpr int64_t kLanes = 32;  // independent partial sums, so the vectorized exp is not one long chain of adds
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// sum over j of exp(x[j] - m), x[j] <= m
float sum_exp(const float* x, int64_t V, float m) {
  float lanes[kLanes] = {0.f};
  int64_t j = 0;
  for (; j + kLanes <= V; j += kLanes) {
#pragma omp simd
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += exp_nonpositive(x[j + l] - m);
  }
  float z = 0.f;
  for (; j < V; ++j) z += exp_nonpositive(x[j] - m);
  for (int64_t l = 0; l < kLanes; ++l) z += lanes[l];
  return z;
}

struct Candidate {
  float value;
  int64_t token;
  bool beats(const Candidate& other) const { return value > other.value || (value == other.value && token < other.token); }
};

// c into best[0, w), kept best first by beats(a, b); what falls off the end is dropped.
template <class T, class Beats>
inline void insert_best(std::vector<T>& best, const T& c, Beats beats) {
  const int64_t w = static_cast<int64_t>(best.size());
  if (!beats(c, best[w - 1])) return;
  int64_t k = w - 1;
  for (; k > 0 && beats(c, best[k - 1]); --k) best[k] = best[k - 1];
  best[k] = c;
}

}  // namespace

// For each row r of logits (R, V): log P = logits - logsumexp(logits) (log_softmax); values[r]
// and tokens[r] get the row's w = values.size(1) most probable tokens other than pad and bos (which
// are never generated, but count in the normalizer), best first, ties to the lower id, as
// log_softmax + topk would; eos_out[r] gets log P(eos).
void vocabulary_top(const torch::Tensor& logits, torch::Tensor& values, torch::Tensor& tokens, torch::Tensor& eos_out,
                    int64_t eos, int64_t pad, int64_t bos) {
  TORCH_CHECK(logits.dtype() == torch::kFloat && logits.dim() == 2 && logits.stride(1) == 1, "fp32 logits (R, V), rows contiguous");
  TORCH_CHECK(values.dtype() == torch::kFloat && tokens.dtype() == torch::kLong && eos_out.dtype() == torch::kFloat,
              "fp32 values, int64 tokens, fp32 eos");
  const int64_t R = logits.size(0), V = logits.size(1), w = values.dim() == 2 ? values.size(1) : 0;
  TORCH_CHECK(values.size(0) == R && tokens.sizes() == values.sizes() && eos_out.dim() == 1 && eos_out.size(0) == R &&
              values.stride(1) == 1 && tokens.stride(1) == 1, "values, tokens (R, w) with contiguous rows, eos (R,)");
  TORCH_CHECK(w >= 1 && w <= V && 0 <= std::min({eos, pad, bos}) && std::max({eos, pad, bos}) < V, "w in [1, V], ids in the vocabulary");
  const int64_t n_blocks = (V + kBlock - 1) / kBlock;
  const int64_t l_row = logits.stride(0), v_row = values.stride(0), t_row = tokens.stride(0), e_step = eos_out.stride(0);
  const float* lp = logits.data_ptr<float>();
  float* vp = values.data_ptr<float>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  float* ep = eos_out.data_ptr<float>();
  at::parallel_for(0, R, 4, [&](int64_t begin, int64_t end) {
    std::vector<float> block_max(n_blocks);
    std::vector<float> top_max(w);
    std::vector<Candidate> best(w);
    for (int64_t r = begin; r < end; ++r) {
      const float* x = lp + r * l_row;
      for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
        float m = kNegInf;
#pragma omp simd reduction(max : m)
        for (int64_t j = lo; j < hi; ++j) m = x[j] > m ? x[j] : m;
        block_max[b] = m;
      }
      const float m = *std::max_element(block_max.begin(), block_max.end());
      const float lse = m + std::log(sum_exp(x, V, m));
      ep[r * e_step] = x[eos] - lse;
      for (int64_t id : {pad, bos}) {  // their blocks' maxima without them, for the ranking
        const int64_t b = id / kBlock, lo = b * kBlock, hi = std::min(V, lo + kBlock);
        float bm = kNegInf;
        for (int64_t j = lo; j < hi; ++j)
          if (j != pad && j != bos) bm = x[j] > bm ? x[j] : bm;
        block_max[b] = bm;
      }
      // the w-th largest block maximum: a row's w best logits are at least that, and lie in the
      // blocks whose maxima reach it (the w blocks with the largest maxima have w logits that do)
      std::fill(top_max.begin(), top_max.end(), kNegInf);
      for (int64_t b = 0; b < n_blocks; ++b) insert_best(top_max, block_max[b], [](float a, float b) { return a > b; });
      const float threshold = n_blocks >= w ? top_max[w - 1] : kNegInf;
      std::fill(best.begin(), best.end(), Candidate{kNegInf, V});
      for (int64_t b = 0; b < n_blocks; ++b) {
        if (block_max[b] < threshold) continue;
        const int64_t lo = b * kBlock, hi = std::min(V, lo + kBlock);
        for (int64_t j = lo; j < hi; ++j)
          insert_best(best, Candidate{(j == pad || j == bos) ? kNegInf : x[j], j},
                      [](const Candidate& a, const Candidate& b) { return a.beats(b); });
      }
      for (int64_t k = 0; k < w; ++k) {
        vp[r * v_row + k] = best[k].value - lse;
        tp[r * t_row + k] = best[k].token;
      }
    }
  });
}
