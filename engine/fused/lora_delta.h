// The LoRA delta of a step's rows (engine/lora/layers.py), each row on its own adapter's weights alone (BGMV).
//
// Why not torch's GEMMs: the masked SGMV there ([T, in] @ [in, P*S*r], then an addmm per part) rounds a row by the
// shape of the whole call. On the dev machine MKL's fp32 GEMM gives a row other bits once a call has more than 3
// rows, and the column count (active adapters x their largest rank) changes with the batch too. So an adapter row's
// output depended on which requests shared its step: with int4/int8 weights (their kernel rounds a row alike in any
// batch) the one thing that did, and what kept a mixed batch from giving each request its output alone.
//
// Here row t of slot s computes h = A_s x_t (A_s stored transposed, [r, in]: each of the r entries one dot product
// over `in`, in a fixed order) and adds h B_s to its columns (each column the r products summed in order j = 0..r-1,
// then added to y). r is the rank of the slot's adapter for that projection (0: none, the row is left alone). The
// same operations for a row whatever the other rows are, on whichever thread takes it.
//
// Vectors are GCC's vector extensions on 8 lanes, compiled per CPU level (target_clones, as row_attention.h); the
// loader picks one level per CPU, so every call of a process runs the same code.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace specstream::lora {

typedef float f8 __attribute__((vector_size(32)));
constexpr int64_t kLanes = 8;

#define SS_LORA_INLINE inline __attribute__((always_inline))

SS_LORA_INLINE f8 load(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
SS_LORA_INLINE void store(float* p, f8 v) { std::memcpy(p, &v, sizeof v); }
SS_LORA_INLINE f8 splat(float f) { return f8{f, f, f, f, f, f, f, f}; }

// Lane i's running sum, then the lanes added 0..7, then the tail (k past the last whole vector) in order.
SS_LORA_INLINE float finish(f8 acc, const float* x, const float* a, int64_t k, int64_t n) {
  float s = 0.0f;
  for (int i = 0; i < kLanes; ++i) s += acc[i];
  for (; k < n; ++k) s += x[k] * a[k];
  return s;
}

// h[j] = sum_k x[k] a[j * n + k] for j < r. Four entries at a time share the loads of x; each entry is summed
// exactly as it would be alone (lane i takes k = i mod 8).
SS_LORA_INLINE void shrink(const float* x, const float* a, int64_t r, int64_t n, float* h) {
  const int64_t whole = n - n % kLanes;
  int64_t j = 0;
  for (; j + 4 <= r; j += 4) {
    const float *a0 = a + j * n, *a1 = a0 + n, *a2 = a1 + n, *a3 = a2 + n;
    f8 s0{}, s1{}, s2{}, s3{};
    for (int64_t k = 0; k < whole; k += kLanes) {
      const f8 xv = load(x + k);
      s0 += xv * load(a0 + k);
      s1 += xv * load(a1 + k);
      s2 += xv * load(a2 + k);
      s3 += xv * load(a3 + k);
    }
    h[j] = finish(s0, x, a0, whole, n);
    h[j + 1] = finish(s1, x, a1, whole, n);
    h[j + 2] = finish(s2, x, a2, whole, n);
    h[j + 3] = finish(s3, x, a3, whole, n);
  }
  for (; j < r; ++j) {
    const float* aj = a + j * n;
    f8 s{};
    for (int64_t k = 0; k < whole; k += kLanes) s += load(x + k) * load(aj + k);
    h[j] = finish(s, x, aj, whole, n);
  }
}

// y[c] += sum_j h[j] b[j * n + c] for c < n, j = 0..r-1 in order (r >= 1).
SS_LORA_INLINE void expand_add(const float* h, const float* b, int64_t r, int64_t n, float* y) {
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes) {
    f8 d = splat(h[0]) * load(b + c);
    for (int64_t j = 1; j < r; ++j) d += splat(h[j]) * load(b + j * n + c);
    store(y + c, load(y + c) + d);
  }
  for (; c < n; ++c) {
    float d = h[0] * b[c];
    for (int64_t j = 1; j < r; ++j) d += h[j] * b[j * n + c];
    y[c] += d;
  }
}

// One projection of a fused linear: its output columns [offset, offset + size) and the slots' weights.
struct Part {
  const float* a;        // [n_slots, max_rank, in]: A transposed per slot
  const float* b;        // [n_slots, max_rank, size]
  const int64_t* ranks;  // [n_slots]: the rank of the slot's adapter here, 0 where it has none
  int64_t max_rank, size, offset;
};

// The rows' operands: y [T, out] (rows y_row apart), x [T, in] (rows in apart), slots [T] (0: the base model).
struct Rows {
  float* y;
  int64_t y_row;
  const float* x;
  int64_t in;
  const int64_t* slots;
};

// Not inline: GCC clones a function it emits (as row_attention.h's kernels, one translation unit includes this).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
void add_rows(const Rows& rows, const std::vector<Part>& parts, int64_t t0, int64_t t1, float* h) {
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t slot = rows.slots[t];
    if (slot == 0) continue;
    const float* x = rows.x + t * rows.in;
    for (const Part& p : parts) {
      const int64_t r = p.ranks[slot];
      if (r == 0) continue;
      shrink(x, p.a + slot * p.max_rank * rows.in, r, rows.in, h);
      expand_add(h, p.b + slot * p.max_rank * p.size, r, p.size, rows.y + t * rows.y_row + p.offset);
    }
  }
}

// Every row's delta added to y; rows are shared out among torch's threads (a row's bits do not depend on which).
inline void add_delta(const Rows& rows, const std::vector<Part>& parts, int64_t T, int64_t max_rank) {
  at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
    std::vector<float> h(static_cast<size_t>(max_rank));
    add_rows(rows, parts, t0, t1, h.data());
  });
}

}  // namespace specstream::lora
