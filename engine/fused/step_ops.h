// The small per-row operations of a decoder layer, as plain loops: RMSNorm, rotary, the KV write.
//
// Why: at batch 1 each of them is a few ATen ops of ~576 floats, and ATen's per-op cost (dispatch, a fresh output,
// TensorIterator) made them ~3 ms of an 8.4 ms int4 step (61 norms alone 1.5 ms; bench/step_profile.py). A loop
// over 576 floats takes well under a microsecond.
//
// Bits: rotary and the KV write give exactly the eager path's bits (each element is the same IEEE products and
// sum, rounded the same way: this file is compiled without FMA, so nothing is contracted). RMSNorm sums squares in
// a fixed order of its own, not ATen's: the eager layers take this same function (torch.ops.specstream.rms_norm,
// engine/fused/norm.py) wherever the fused step runs, so the two paths stay bit for bit equal.
#pragma once

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace specstream::step_ops {

// y = x / sqrt(mean(x^2) + eps) * w for one row of n floats. The squares are summed in double, 4 running sums in
// a fixed order: the same result for a row whatever else the step holds.
inline void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += static_cast<double>(x[i + j]) * x[i + j];
  for (; i < n; ++i) s[0] += static_cast<double>(x[i]) * x[i];
  const float mean = static_cast<float>(((s[0] + s[1]) + (s[2] + s[3])) / static_cast<double>(n));
  const float r = 1.0f / std::sqrt(mean + eps);
  for (i = 0; i < n; ++i) y[i] = (x[i] * r) * w[i];
}

// x [rows, n] (rows contiguous) -> y [rows, n].
inline void rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps) {
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) rms_norm_row(x + r * n, w, y + r * n, n, eps);
  });
}

// engine.rotary.apply_rotary_ in place on heads [rows, H, D] of one row stride: x * cos + swap_halves(x) * sin_rot,
// cos and sin_rot [rows, D].
inline void rotary(float* x, int64_t row_stride, int64_t rows, int64_t heads, int64_t dim, const float* cos,
                   const float* sin_rot) {
  const int64_t half = dim / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const float* c = cos + r * dim;
    const float* s = sin_rot + r * dim;
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + r * row_stride + h * dim;
      for (int64_t i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        const float ca = a * c[i], sb = b * s[i];  // two roundings, then the sum's: as ATen's mul, mul, add
        const float cb = b * c[i + half], sa = a * s[i + half];
        v[i] = ca + sb;
        v[i + half] = cb + sa;
      }
    }
  }
}

}  // namespace specstream::step_ops
