// Weight-only 4-bit and 8-bit linears on int8 activations, with AVX-512 VNNI: y [T, out] = x [T, in] W^T.
//
// Why our own kernel: torch's int4 CPU kernel dequantizes each weight to bf16 inside its inner loop, so it is
// slow at one row and costs ~4x a decode at the 9 rows of a verification step (17 ms against 4.1 on the dev
// machine), and its int8 kernel loses to the bf16 copy from 3 rows on. Here, as in llama.cpp's Q4_0 x Q8_0 dot
// products, each activation row is quantized to int8 in blocks of 32 (one fp32 scale a block), and the dot
// products are exact integer sums (vpdpbusd: unsigned weight codes times signed activation codes), scaled per
// block.
//
// Layout: one vector lane per output. A tile is 16 outputs; for each block of 32 inputs it holds 8 vectors
// (k = 0..7) whose lane j has output j's codes for inputs 4k .. 4k + 3 of the block. vpdpbusd of vector k with
// the row's 4 codes of those inputs, broadcast, adds each output's 4 products to its lane: a block is 8 of them,
// and no horizontal sum is ever needed. A tile's weights are read once for a tile of rows.
//   8-bit weights: the 8 vectors, 512 bytes a block-tile, codes q + 128 (vpdpbusd wants unsigned weights; the 128
//                  times the row's code sum comes off in integers, exactly).
//   4-bit weights: 256 bytes a block-tile: byte 4j + i of vector k (k = 0..3) holds vector k's code in its low
//                  nibble and vector k + 4's in its high nibble.
// Scales: per block and tile 16 fp16 (4-bit: GGUF's own Q4_1 d and m, or Q4_0's d with its 8 taken off in
// integers; 8-bit: Q8_0's and Q5_0's d), or one fp32 per output (8-bit quantized per row, engine/quant/tensor.py's
// int8). A Q4_1 weight reads 20 bytes a block, as in the file. K-quants' scales are a super-block's fp16 d times a
// 6- or 8-bit sub-block scale, which fp16 cannot hold: those kinds read fp32 scales (and mins), exact; Q6_K's
// sub-blocks are 16 inputs, so its kind reads two scales (and mins, fused beside a kind with them) a block, one per
// half (vectors 0..3 and 4..7).
// engine/quant/vnni.py packs weights into this layout.
//
// Row-count invariance, which keeps speculation lossless: a row's output is a function of that row and the weight
// alone. Its integer sums are exact, and its float work runs in one fixed order per (output, row), whatever the
// row count, the tile of rows or the thread that computes it.
#pragma once

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace specstream::qgemm {

constexpr int64_t kBlock = 32;  // inputs per scale
constexpr int64_t kLanes = 16;  // outputs per tile: one int32 lane each
constexpr int64_t kTile = 8;    // activation rows per pass over a tile's weights
constexpr int kLastPass = 12;   // the most rows of a tile's last pass (accumulators still fit in registers)

// Activation rows as int8 blocks: codes in input order; per block its scale d, its code sum (and that of its first
// 16 codes, for a kind with half-block scales), and d * sum.
struct QuantRows {
  const int8_t* codes;     // [rows, in]
  const float* d;          // [rows, blocks]
  const int32_t* sums;     // [rows, blocks]
  const int32_t* lo_sums;  // [rows, blocks]
  const float* dsums;      // [rows, blocks]
  int64_t rows, in;
};

// Where a linear's outputs go: y [rows, out]; with a residual [rows, out], y = residual + x W^T, the eager path's
// h + linear(x) in one IEEE add (the same bits either way), without ATen's add and its fresh tensor.
struct Outputs {
  float* y;
  const float* residual;  // or null
};

// w = (code - offset) * scale [+ min], scale per block (fp16 or fp32), per half block (fp32) or per output (fp32).
struct QuantWeights {
  const uint8_t* codes;      // [out / 16, blocks, 256 or 512] tiles
  const void* block_scales;  // [out / 16, blocks, 16] fp16 or fp32, [out / 16, blocks, 2, 16] fp32 (halves), or null
  const void* mins;          // as block_scales, or null
  const float* row_scales;   // fp32 [out], or null
  int32_t offset;            // 8 (Q4_0-like), 128 (8-bit: codes q + 128) or 0 (4-bit with mins)
  int64_t out, in;
  bool four_bit;
  bool wide_scales;  // block scales and mins in fp32
  bool halves;       // 8-bit, an fp32 scale per 16 inputs
};

// Which weights a tile reads: 4 or 8-bit codes, with or without mins, scales per block (fp16 or fp32, whole or
// half blocks) or per output.
struct Kind {
  bool four, mins, block_scales, wide, halves;
};
// Every kind with_kind makes, for the kernels' instantiation.
constexpr Kind kQ4_0{true, false, true, false, false};   // Q4_0-like: (q - 8) * d
constexpr Kind kQ4_1{true, true, true, false, false};    // q * d + m, fp16
constexpr Kind kQ4_K{true, true, true, true, false};     // q * d + m, fp32 (K-quant sub-blocks)
constexpr Kind kQ8_0{false, false, true, false, false};  // Q8_0, Q5_0: q * d, fp16
constexpr Kind kQ8_R{false, false, false, false, false}; // q * scale per output
constexpr Kind kQ8_M{false, true, true, true, false};    // Q5_1, Q5_K: q * d + m, fp32
constexpr Kind kQ6_K{false, false, true, true, true};    // Q6_K: q * d per 16 inputs, fp32
constexpr Kind kQ6_M{false, true, true, true, true};     // per 16 inputs with mins (Q6_K fused beside Q4_K)

inline bool supported() {
  return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}

#define SS_VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define SS_VNNI SS_VNNI_TARGET __attribute__((always_inline)) inline
// Unrolled so that the weight vectors and the accumulators stay in registers (GCC at -O2 keeps such loops rolled).
#define SS_VNNI_UNROLL _Pragma("GCC unroll 16")

// x [in] -> one row's codes, d, sums, lo_sums and dsums. Ties round to even (vcvtps2dq under the default rounding
// mode); every step is exact or one IEEE operation, so a row's codes depend on that row only.
SS_VNNI_TARGET inline void quantize_row(const float* x, int64_t in, int8_t* codes, float* d, int32_t* sums,
                                        int32_t* lo_sums, float* dsums) {
  for (int64_t b = 0; b < in / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, inv)), q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, inv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * kBlock), _mm512_cvtepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b * kBlock + 16), _mm512_cvtepi32_epi8(q1));
    d[b] = amax / 127.0f;
    sums[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    lo_sums[b] = _mm512_reduce_add_epi32(q0);
    dsums[b] = d[b] * static_cast<float>(sums[b]);
  }
}

SS_VNNI __m512 halves(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// 16 scales (or mins) at element `at` of a weight's fp16 or fp32 table.
template <bool kWide>
SS_VNNI __m512 lane_scales(const void* table, int64_t at) {
  if constexpr (kWide) return _mm512_loadu_ps(static_cast<const float*>(table) + at);
  return halves(static_cast<const uint16_t*>(table) + at);
}

// Outputs 16t .. 16t + 15 for rows r0 .. r0 + R - 1 into y [rows, out]. R up to 12 (kLastPass): the accumulators
// and the 8 weight vectors stay in registers; 8 rows a pass took 9-128-row steps 16-21 % below 4, and one pass of
// 9 rows 8-11 % below 8 + 1 (bench/qgemm_bench.py).
template <int R, Kind K>
SS_VNNI void tile(const QuantWeights& w, const QuantRows& a, int64_t t, int64_t r0, const Outputs& o) {
  const int64_t blocks = w.in / kBlock;
  const int64_t tile_bytes = K.four ? 256 : 512;
  __m512 acc[R];
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* codes = w.codes + t * blocks * tile_bytes;
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i v[8];
    const uint8_t* p = codes + b * tile_bytes;
    if constexpr (K.four) {
      const __m512i low = _mm512_set1_epi8(0x0F);
      SS_VNNI_UNROLL
      for (int k = 0; k < 4; ++k) {
        const __m512i raw = _mm512_loadu_si512(p + 64 * k);
        v[k] = _mm512_and_si512(raw, low);
        v[k + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
      }
    } else {
      SS_VNNI_UNROLL
      for (int k = 0; k < 8; ++k) v[k] = _mm512_loadu_si512(p + 64 * k);
    }
    const int64_t at = (t * blocks + b) * kLanes * (K.halves ? 2 : 1);
    __m512 scale = _mm512_setzero_ps(), scale_hi = _mm512_setzero_ps();
    __m512 min = _mm512_setzero_ps(), min_hi = _mm512_setzero_ps();
    if constexpr (K.block_scales) scale = lane_scales<K.wide>(w.block_scales, at);
    if constexpr (K.halves) scale_hi = lane_scales<true>(w.block_scales, at + kLanes);
    if constexpr (K.mins) min = lane_scales<K.wide>(w.mins, at);
    if constexpr (K.mins && K.halves) min_hi = lane_scales<true>(w.mins, at + kLanes);
    SS_VNNI_UNROLL
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int32_t* q = reinterpret_cast<const int32_t*>(a.codes + row * a.in + b * kBlock);  // 8 x 4 codes
      // Two chains of four (vpdpbusd's latency would serialize one of eight); integer sums: the split is exact.
      // With half-block scales the chains are the halves (vectors 0..3, 4..7), each scaled on its own.
      __m512i s = _mm512_setzero_si512(), u = _mm512_setzero_si512();
      SS_VNNI_UNROLL
      for (int k = 0; k < 4; ++k) {
        const int lo = K.halves ? k : 2 * k, hi = K.halves ? k + 4 : 2 * k + 1;
        s = _mm512_dpbusd_epi32(s, v[lo], _mm512_set1_epi32(q[lo]));
        u = _mm512_dpbusd_epi32(u, v[hi], _mm512_set1_epi32(q[hi]));
      }
      const int64_t blk = row * blocks + b;
      const __m512 d = _mm512_set1_ps(a.d[blk]);
      if constexpr (K.halves) {  // exact: the offset off each half in integers
        s = _mm512_sub_epi32(s, _mm512_set1_epi32(w.offset * a.lo_sums[blk]));
        u = _mm512_sub_epi32(u, _mm512_set1_epi32(w.offset * (a.sums[blk] - a.lo_sums[blk])));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scale, d), acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(u), _mm512_mul_ps(scale_hi, d), acc[r]);
        if constexpr (K.mins) {
          const float lo = a.d[blk] * static_cast<float>(a.lo_sums[blk]);
          const float hi = a.d[blk] * static_cast<float>(a.sums[blk] - a.lo_sums[blk]);
          acc[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(lo), acc[r]);
          acc[r] = _mm512_fmadd_ps(min_hi, _mm512_set1_ps(hi), acc[r]);
        }
        continue;
      }
      s = _mm512_add_epi32(s, u);
      if constexpr (!K.four || !K.mins) s = _mm512_sub_epi32(s, _mm512_set1_epi32(w.offset * a.sums[blk]));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), K.block_scales ? _mm512_mul_ps(scale, d) : d, acc[r]);
      if constexpr (K.mins) acc[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(a.dsums[blk]), acc[r]);
    }
  }
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) {
    __m512 out = acc[r];
    if constexpr (!K.block_scales) out = _mm512_mul_ps(out, _mm512_loadu_ps(w.row_scales + t * kLanes));
    const int64_t at = (r0 + r) * w.out + t * kLanes;
    if (o.residual != nullptr) out = _mm512_add_ps(_mm512_loadu_ps(o.residual + at), out);
    _mm512_storeu_ps(o.y + at, out);
  }
}

// The last pass over a tile: R = left rows, 1 <= left <= R.
template <int R, Kind K>
SS_VNNI void last_pass(const QuantWeights& w, const QuantRows& a, int64_t t, int64_t r0, int64_t left,
                       const Outputs& o) {
  if constexpr (R > 1) {
    if (left < R) return last_pass<R - 1, K>(w, a, t, r0, left, o);
  }
  tile<R, K>(w, a, t, r0, o);
}

// Tiles t0 .. t1 - 1 for every row: passes of kTile rows while more than kLastPass are left, then one pass for the
// rest. Each pass unpacks the tile's weights again, so the 9 rows of a verification step with 8 drafts take one
// pass, not 8 + 1 (which cost as much as 2 more rows).
template <Kind K>
SS_VNNI_TARGET void tiles(const QuantWeights& w, const QuantRows& a, int64_t t0, int64_t t1, const Outputs& o) {
  for (int64_t t = t0; t < t1; ++t) {
    int64_t r0 = 0;
    for (; a.rows - r0 > kLastPass; r0 += kTile) tile<kTile, K>(w, a, t, r0, o);
    if (r0 < a.rows) last_pass<kLastPass, K>(w, a, t, r0, a.rows - r0, o);
  }
}

// run.template operator()<K>() for the weights' kind (the wrapper checks that it is one of these).
template <typename Run>
void with_kind(const QuantWeights& w, Run&& run) {
  const bool mins = w.mins != nullptr;
  if (w.four_bit) {
    if (!mins) return run.template operator()<kQ4_0>();
    return w.wide_scales ? run.template operator()<kQ4_K>() : run.template operator()<kQ4_1>();
  }
  if (w.block_scales == nullptr) return run.template operator()<kQ8_R>();
  if (w.halves) return mins ? run.template operator()<kQ6_M>() : run.template operator()<kQ6_K>();
  return mins ? run.template operator()<kQ8_M>() : run.template operator()<kQ8_0>();
}

// Every output of every row (plus its residual, if any), tiles shared out among torch's threads (no bit depends
// on the split).
inline void linear(const QuantWeights& w, const QuantRows& a, const Outputs& o) {
  at::parallel_for(0, w.out / kLanes, 1, [&](int64_t t0, int64_t t1) {
    with_kind(w, [&]<Kind K>() { tiles<K>(w, a, t0, t1, o); });
  });
}

}  // namespace specstream::qgemm
