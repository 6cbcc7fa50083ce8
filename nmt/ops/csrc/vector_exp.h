// exp(x) for x <= 0 as one expression the compiler vectorizes (std::exp is a call per element
// unless the whole build trades IEEE semantics for speed): Cephes' expf, x = n ln 2 + r with
// |r| <= ln 2 / 2, a degree-6 polynomial in r, times 2^n through the exponent bits. Within 2 ulp
// of std::exp; exactly 0 below -87 (where expf itself reaches the denormals), and for -inf.
#ifndef NMT_VECTOR_EXP_H
#define NMT_VECTOR_EXP_H

#include <cmath>
#include <cstdint>
#include <cstring>

inline float exp_nonpositive(float x) {
  const bool underflows = x < -87.0f;
  x = underflows ? -87.0f : x;
  const float n = std::nearbyint(x * 1.44269504088896341f);
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;  // ln 2 in two parts: r stays exact
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits += static_cast<int32_t>(n) * (1 << 23);
  std::memcpy(&p, &bits, sizeof p);
  return underflows ? 0.0f : p;
}

#endif  // NMT_VECTOR_EXP_H
