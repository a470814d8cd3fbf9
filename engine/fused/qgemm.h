// Weight-only 4-bit and 8-bit linears on int8 activations, with AVX-512 VNNI: y [T, out] = x [T, in] W^T.
//
// Why our own kernel: torch's int4 CPU kernel dequantizes each weight to bf16 inside its inner loop, so it is
// memory bound at one row but costs ~4x a decode at the 9 rows of a verification step (17 ms against 4.1 on the
// dev machine), and its int8 kernel loses to the bf16 copy from 3 rows on. Here, as in llama.cpp's Q4_0 x Q8_0
// dot products, each activation row is quantized to int8 in blocks of 32 (one fp32 scale a block) and the dot
// products are exact integer sums (vpdpbusd: unsigned weight codes times signed activation codes), scaled per
// block. A weight vector is loaded and unpacked once for a tile of rows.
//
// Row-count invariance, which keeps speculation lossless: a row's output is a function of that row and the weight
// alone. Its integer sums are exact; its float sums run in one fixed order per (output, row), whatever the tile,
// the row count or the thread that computes it.
//
// Layout, chosen so that one vector lane holds one block: a group is up to 16 consecutive blocks of 32 inputs (the
// last group of a row may hold fewer, b). Element e = 4k + j (k = 0..7, j = 0..3) of the group's block l sits at
// byte 4b * k + 4l + j of the group's int8 codes; so vector k of a group, 4b bytes, gives lane l four consecutive
// elements of block l, and the 8 vpdpbusd of a group leave each lane the exact sum of its whole block.
//   activations, 8-bit weights: that layout (8-bit weights store q + 128: vpdpbusd wants unsigned codes; the
//                  128 times the row's code sum comes off in integers, exactly)
//   4-bit weights: half the bytes; byte 4b * k + 4l + j (k = 0..3) holds element 4k + j in its low nibble and
//                  element 16 + 4k + j in its high nibble, so a load gives vector k (low) and vector k + 4 (high).
// Scales: fp16 per block for 4-bit weights (GGUF's own: Q4_1's d and m, Q4_0's d with the 8 taken off in integers),
// fp32 per output for 8-bit ones (engine/quant/tensor.py's int8). So a Q4_1 weight reads 20 bytes a block, as in
// the file. engine/quant/vnni.py packs weights into this layout; quantize_row packs the activations.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace specstream::qgemm {

constexpr int64_t kBlock = 32;  // inputs per scale
constexpr int64_t kGroup = 16;  // blocks per vector: one int32 lane per block
constexpr int64_t kTile = 4;    // activation rows per weight vector load

// Activation rows as int8 blocks: codes in the group layout; per block its scale d, its code sum, and d * sum.
struct QuantRows {
  const int8_t* codes;  // [rows, in]
  const float* d;       // [rows, blocks]
  const int32_t* sums;  // [rows, blocks]
  const float* dsums;   // [rows, blocks]
  int64_t rows, in;
};

// w = (code - offset) * scale [+ min], scale per block (fp16) or per output (fp32).
struct QuantWeights {
  const uint8_t* codes;          // [out, in / 2] (4-bit) or [out, in] (8-bit), group layout
  const uint16_t* block_scales;  // fp16 [out, blocks], or null
  const uint16_t* mins;          // fp16 [out, blocks] (4-bit with a min: offset 0), or null
  const float* row_scales;       // fp32 [out], or null
  int32_t offset;                // 8 (Q4_0-like), 128 (8-bit) or 0 (with mins)
  int64_t out, in;
  bool four_bit;
};

inline bool supported() {
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}

#define SS_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define SS_VNNI SS_VNNI_TARGET __attribute__((always_inline)) inline
// Unrolled so that the weight vectors and the accumulators stay in registers (GCC at -O2 keeps such loops rolled).
#define SS_VNNI_UNROLL _Pragma("GCC unroll 8")


// x [in] -> one row's codes (group layout), d, sums and dsums. Ties round to even (vcvtps2dq under the default
// rounding mode); every step of it is exact or one IEEE operation, so a row's codes depend on that row only.
SS_VNNI_TARGET inline void quantize_row(const float* x, int64_t in, int8_t* codes, float* d, int32_t* sums,
                                        float* dsums) {
  const int64_t blocks = in / kBlock;
  for (int64_t g0 = 0; g0 < blocks; g0 += kGroup) {
    const int64_t b = std::min(kGroup, blocks - g0);
    int8_t* group = codes + g0 * kBlock;
    for (int64_t l = 0; l < b; ++l) {
      const float* xb = x + (g0 + l) * kBlock;
      const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
      const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
      const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, inv));
      alignas(16) int32_t words[8];  // element 4k + j is byte j of word k
      _mm_store_si128(reinterpret_cast<__m128i*>(words), _mm512_cvtepi32_epi8(q0));
      _mm_store_si128(reinterpret_cast<__m128i*>(words + 4), _mm512_cvtepi32_epi8(q1));
      for (int k = 0; k < 8; ++k) std::memcpy(group + 4 * b * k + 4 * l, words + k, 4);
      d[g0 + l] = amax / 127.0f;
      sums[g0 + l] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
      dsums[g0 + l] = d[g0 + l] * static_cast<float>(sums[g0 + l]);
    }
  }
}

// A group of b blocks runs on 512-bit vectors, or on 128-bit ones when b <= 4: a model dimension of 18 blocks (576)
// is one full group and a tail of 2, which a 512-bit vector would pay for as a full group.
struct Zmm {
  using I = __m512i;
  using F = __m512;
  static constexpr int64_t kLanes = 16;
  // Full groups (m all ones) load without a mask: the masked forms cost more on some CPUs.
  static SS_VNNI I bytes(uint64_t m, const void* p) {
    return m == ~0ULL ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(m, p);
  }
  static SS_VNNI I ints(uint32_t m, const int32_t* p) {
    return m == 0xFFFF ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi32(m, p);
  }
  static SS_VNNI F floats(uint32_t m, const float* p) {
    return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
  }
  static SS_VNNI F halves(uint32_t m, const uint16_t* p) {
    const __m256i h = m == 0xFFFF ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
    return _mm512_cvtph_ps(h);
  }
  static SS_VNNI I nibbles(I raw, int high) {
    const I low = _mm512_set1_epi8(0x0F);
    return _mm512_and_si512(high ? _mm512_srli_epi16(raw, 4) : raw, low);
  }
  static SS_VNNI I dot(I acc, I u, I s) { return _mm512_dpbusd_epi32(acc, u, s); }
  static SS_VNNI I add(I x, I y) { return _mm512_add_epi32(x, y); }
  static SS_VNNI I sub_scaled(I x, I y, int32_t k) { return _mm512_sub_epi32(x, _mm512_mullo_epi32(y, _mm512_set1_epi32(k))); }
  static SS_VNNI I zero_i() { return _mm512_setzero_si512(); }
  static SS_VNNI F zero_f() { return _mm512_setzero_ps(); }
  static SS_VNNI F to_float(I x) { return _mm512_cvtepi32_ps(x); }
  static SS_VNNI F mul(F x, F y) { return _mm512_mul_ps(x, y); }
  static SS_VNNI F fma(F x, F y, F z) { return _mm512_fmadd_ps(x, y, z); }
  static SS_VNNI float sum(F x) { return _mm512_reduce_add_ps(x); }
};

struct Xmm {
  using I = __m128i;
  using F = __m128;
  static constexpr int64_t kLanes = 4;
  static SS_VNNI I bytes(uint64_t m, const void* p) { return _mm_maskz_loadu_epi8(static_cast<__mmask16>(m), p); }
  static SS_VNNI I ints(uint32_t m, const int32_t* p) { return _mm_maskz_loadu_epi32(static_cast<__mmask8>(m), p); }
  static SS_VNNI F floats(uint32_t m, const float* p) { return _mm_maskz_loadu_ps(static_cast<__mmask8>(m), p); }
  static SS_VNNI F halves(uint32_t m, const uint16_t* p) {
    return _mm_cvtph_ps(_mm_maskz_loadu_epi16(static_cast<__mmask8>(m), p));
  }
  static SS_VNNI I nibbles(I raw, int high) {
    const I low = _mm_set1_epi8(0x0F);
    return _mm_and_si128(high ? _mm_srli_epi16(raw, 4) : raw, low);
  }
  static SS_VNNI I dot(I acc, I u, I s) { return _mm_dpbusd_epi32(acc, u, s); }
  static SS_VNNI I add(I x, I y) { return _mm_add_epi32(x, y); }
  static SS_VNNI I sub_scaled(I x, I y, int32_t k) { return _mm_sub_epi32(x, _mm_mullo_epi32(y, _mm_set1_epi32(k))); }
  static SS_VNNI I zero_i() { return _mm_setzero_si128(); }
  static SS_VNNI F zero_f() { return _mm_setzero_ps(); }
  static SS_VNNI F to_float(I x) { return _mm_cvtepi32_ps(x); }
  static SS_VNNI F mul(F x, F y) { return _mm_mul_ps(x, y); }
  static SS_VNNI F fma(F x, F y, F z) { return _mm_fmadd_ps(x, y, z); }
  static SS_VNNI float sum(F x) {  // a fixed order: (x0 + x2) + (x1 + x3)
    const F s = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
  }
};

// Rows r0 .. r0 + R - 1 times output n's group at block g0 (b blocks), added to acc. Per (n, row) the float work
// runs in one fixed order.
template <class V, int R, bool kFour, bool kMins, bool kBlockScales>
SS_VNNI void group(const QuantWeights& w, const QuantRows& a, int64_t n, int64_t r0, int64_t g0, int64_t b,
                   typename V::F (&acc)[R]) {
  using I = typename V::I;
  using F = typename V::F;
  const int64_t blocks = w.in / kBlock;
  const uint32_t lanes = (1U << b) - 1;
  const uint64_t bytes = 4 * b == 64 ? ~0ULL : (1ULL << (4 * b)) - 1;
  I v[8];  // the group's weight vectors, unsigned codes
  if constexpr (kFour) {
    const uint8_t* p = w.codes + n * (w.in / 2) + g0 * (kBlock / 2);
    SS_VNNI_UNROLL
    for (int k = 0; k < 4; ++k) {
      const I raw = V::bytes(bytes, p + 4 * b * k);
      v[k] = V::nibbles(raw, 0);
      v[k + 4] = V::nibbles(raw, 1);
    }
  } else {
    const uint8_t* p = w.codes + n * w.in + g0 * kBlock;
    SS_VNNI_UNROLL
    for (int k = 0; k < 8; ++k) v[k] = V::bytes(bytes, p + 4 * b * k);
  }
  F scale = V::zero_f(), min = V::zero_f();
  if constexpr (kBlockScales) scale = V::halves(lanes, w.block_scales + n * blocks + g0);
  if constexpr (kMins) min = V::halves(lanes, w.mins + n * blocks + g0);
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) {
    const int64_t row = (r0 + r) * blocks + g0;
    const int8_t* p = a.codes + (r0 + r) * a.in + g0 * kBlock;
    // Two chains of four (vpdpbusd's latency would serialize one of eight); integer sums: the split is exact.
    I s = V::zero_i(), t = V::zero_i();
    SS_VNNI_UNROLL
    for (int k = 0; k < 8; k += 2) {
      s = V::dot(s, v[k], V::bytes(bytes, p + 4 * b * k));
      t = V::dot(t, v[k + 1], V::bytes(bytes, p + 4 * b * (k + 1)));
    }
    s = V::add(s, t);
    if constexpr (!kMins) s = V::sub_scaled(s, V::ints(lanes, a.sums + row), w.offset);  // exact, in integers
    const F d = V::floats(lanes, a.d + row);
    acc[r] = V::fma(V::to_float(s), kBlockScales ? V::mul(scale, d) : d, acc[r]);
    if constexpr (kMins) acc[r] = V::fma(min, V::floats(lanes, a.dsums + row), acc[r]);
  }
}

// Output n for rows r0 .. r0 + R - 1 into y [rows, out]: full groups, then the tail.
template <int R, bool kFour, bool kMins, bool kBlockScales>
SS_VNNI void tile(const QuantWeights& w, const QuantRows& a, int64_t n, int64_t r0, float* y) {
  const int64_t blocks = w.in / kBlock, tail = blocks % kGroup, full = blocks - tail;
  Zmm::F acc[R];
  Xmm::F small[R];
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = Zmm::zero_f(), small[r] = Xmm::zero_f();
  for (int64_t g0 = 0; g0 < full; g0 += kGroup) group<Zmm, R, kFour, kMins, kBlockScales>(w, a, n, r0, g0, kGroup, acc);  // b constant: no masks
  if (tail > Xmm::kLanes) group<Zmm, R, kFour, kMins, kBlockScales>(w, a, n, r0, full, tail, acc);
  if (tail > 0 && tail <= Xmm::kLanes) group<Xmm, R, kFour, kMins, kBlockScales>(w, a, n, r0, full, tail, small);
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) {
    const float sum = Zmm::sum(acc[r]) + Xmm::sum(small[r]);
    y[(r0 + r) * w.out + n] = kBlockScales ? sum : sum * w.row_scales[n];
  }
}

// Outputs n0 .. n1 - 1 of every row, in slices whose weights stay in L1 while every row tile passes over them.
template <bool kFour, bool kMins, bool kBlockScales>
SS_VNNI_TARGET void outputs(const QuantWeights& w, const QuantRows& a, int64_t n0, int64_t n1, float* y) {
  constexpr int64_t kSlice = 16;
  for (int64_t s0 = n0; s0 < n1; s0 += kSlice) {
    const int64_t s1 = std::min(n1, s0 + kSlice);
    int64_t r0 = 0;
    for (; r0 + kTile <= a.rows; r0 += kTile)
      for (int64_t n = s0; n < s1; ++n) tile<kTile, kFour, kMins, kBlockScales>(w, a, n, r0, y);
    for (int64_t n = s0; n < s1; ++n) {
      switch (a.rows - r0) {
        case 3: tile<3, kFour, kMins, kBlockScales>(w, a, n, r0, y); break;
        case 2: tile<2, kFour, kMins, kBlockScales>(w, a, n, r0, y); break;
        case 1: tile<1, kFour, kMins, kBlockScales>(w, a, n, r0, y); break;
        default: break;
      }
    }
  }
}

// y [rows, out] for every output, shared out among torch's threads (no bit depends on the split).
inline void linear(const QuantWeights& w, const QuantRows& a, float* y) {
  // The kinds the wrapper makes: 4-bit with block scales (and mins, or not), 8-bit with row scales.
  auto run = [&](int64_t n0, int64_t n1) {
    if (w.four_bit && w.mins != nullptr) {
      outputs<true, true, true>(w, a, n0, n1, y);
    } else if (w.four_bit) {
      outputs<true, false, true>(w, a, n0, n1, y);
    } else {
      outputs<false, false, false>(w, a, n0, n1, y);
    }
  };
  at::parallel_for(0, w.out, 16, run);
}

}  // namespace specstream::qgemm
