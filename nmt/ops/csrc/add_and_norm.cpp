// A sublayer's output into the residual stream, in one pass per row (nmt/ops/add_and_norm.py says why):
// "Add & Norm" (post-LN), the residual sum alone (pre-LN), and the feed-forward's bias and ReLU.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

// y := LayerNorm(x + y + bias) (normalize) or x + y + bias, row by row over y (R, C); bias (C,) or
// empty; gamma, beta (C,): LayerNorm's weight and bias (mean and biased variance over the row, as
// torch.nn.LayerNorm).
void add_and_norm_(torch::Tensor& y, const torch::Tensor& bias, const torch::Tensor& x, const torch::Tensor& gamma,
                   const torch::Tensor& beta, double eps, bool normalize) {
  TORCH_CHECK(y.dtype() == torch::kFloat && x.dtype() == torch::kFloat && y.dim() == 2 && y.is_contiguous() && x.sizes() == y.sizes() &&
              x.stride(1) == 1, "fp32 y (R, C) contiguous, x (R, C) with contiguous rows");
  const int64_t R = y.size(0), C = y.size(1), x_row = x.stride(0);
  const bool biased = bias.numel() > 0;
  TORCH_CHECK(!biased || (bias.dtype() == torch::kFloat && bias.is_contiguous() && bias.numel() == C), "bias (C,) fp32");
  TORCH_CHECK(!normalize || (gamma.dtype() == torch::kFloat && beta.dtype() == torch::kFloat && gamma.is_contiguous() &&
                             beta.is_contiguous() && gamma.numel() == C && beta.numel() == C), "gamma, beta (C,) fp32");
  float* yp = y.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  const float* bp = biased ? bias.data_ptr<float>() : nullptr;
  const float* gp = normalize ? gamma.data_ptr<float>() : nullptr;
  const float* betap = normalize ? beta.data_ptr<float>() : nullptr;
  const float inv_c = 1.0f / static_cast<float>(C), feps = static_cast<float>(eps);
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* v = yp + r * C;
      const float* res = xp + r * x_row;
      float sum = 0.f;
      if (biased) {
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < C; ++c) {
          v[c] += res[c] + bp[c];
          sum += v[c];
        }
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < C; ++c) {
          v[c] += res[c];
          sum += v[c];
        }
      }
      if (!normalize) continue;
      const float mean = sum * inv_c;
      float sq = 0.f;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < C; ++c) sq += (v[c] - mean) * (v[c] - mean);
      const float rstd = 1.0f / std::sqrt(sq * inv_c + feps);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) v[c] = (v[c] - mean) * rstd * gp[c] + betap[c];
    }
  });
}

// y := max(0, y + bias), y (R, C) contiguous, bias (C,).
void bias_relu_(torch::Tensor& y, const torch::Tensor& bias) {
  TORCH_CHECK(y.dtype() == torch::kFloat && y.dim() == 2 && y.is_contiguous() && bias.dtype() == torch::kFloat &&
              bias.is_contiguous() && bias.numel() == y.size(1), "fp32 y (R, C) contiguous, bias (C,)");
  const int64_t R = y.size(0), C = y.size(1);
  float* yp = y.data_ptr<float>();
  const float* bp = bias.data_ptr<float>();
  at::parallel_for(0, R, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* v = yp + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float s = v[c] + bp[c];
        v[c] = s > 0.f ? s : 0.f;
      }
    }
  });
}
