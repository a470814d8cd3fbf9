// qgemm.h's kernel for CPUs without AVX-512 VNNI but with AVX2 (AMD Zen 1-3, Intel Haswell to Comet Lake): the
// same packed weights, the same activation rounding, and the same bits.
//
// A tile of 16 outputs is read as two halves of 8 (the first and the second 32 bytes of each of qgemm.h's 64-byte
// vectors). vpmaddubsw multiplies unsigned weight codes by signed activation codes and adds adjacent pairs in int16;
// vpmaddwd by ones adds those pairs into the int32 lane of each output:
//   4-bit codes (0..15): a pair is at most 2 x 15 x 127 and a block's 8 vectors 16 x 15 x 127 < 2^15, so the int16
//                        sums of a block are exact and widen once.
//   8-bit codes (q + 128): q x a would overflow a pair, so the codes go back to signed q and multiply as |q| by
//                        a with q's sign (llama.cpp's trick); each pair widens at once. The sum is q . a, which is
//                        vpdpbusd's (q + 128) . a less 128 sum(a): the same integer.
// Every float operation per (output, row) is qgemm.h's, in its order, so a row's output has the same bits on
// either instruction set (and speculation stays lossless here for the reason it does there).
#pragma once

#include "qgemm.h"

namespace specstream::qgemm {

constexpr int64_t kHalf = 8;        // outputs per 256-bit vector
constexpr int kAvx2Pass = 4;        // rows per pass: 8 weight vectors + 4 accumulators + temporaries in 16 registers

inline bool avx2_supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

#define SS_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define SS_AVX2 SS_AVX2_TARGET __attribute__((always_inline)) inline

SS_AVX2 int32_t hsum_epi32(__m256i s) {
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  return _mm_cvtsi128_si32(t);
}

// 8 scales (or mins) at element `at` of a weight's fp16 or fp32 table.
template <bool kWide>
SS_AVX2 __m256 lane_scales_avx2(const void* table, int64_t at) {
  if constexpr (kWide) return _mm256_loadu_ps(static_cast<const float*>(table) + at);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(table) + at)));
}

// qgemm.h's quantize_row with 8-float vectors: the same max, the same scale, the same rounding, the same codes.
SS_AVX2_TARGET inline void quantize_row_avx2(const float* x, int64_t in, int8_t* codes, float* d, int32_t* sums,
                                             int32_t* lo_sums, float* dsums) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // packs_epi32 then packs_epi16 interleave 128-bit lanes; this puts the 4-code groups back in input order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < in / kBlock; ++b) {
    const float* xb = x + b * kBlock;
    __m256 v[4];
    __m256 m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + kHalf * i);
      m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));
    const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + b * kBlock), _mm256_permutevar8x32_epi32(packed, order));
    const __m256i lo = _mm256_add_epi32(q[0], q[1]);
    d[b] = amax / 127.0f;
    lo_sums[b] = hsum_epi32(lo);
    sums[b] = hsum_epi32(_mm256_add_epi32(lo, _mm256_add_epi32(q[2], q[3])));
    dsums[b] = d[b] * static_cast<float>(sums[b]);
  }
}

// The int32 sums of one row's block against weight vectors k0 .. k1 - 1 (one half-tile): q . codes (4-bit) or
// q . a (8-bit).
template <bool kFour, int k0 = 0, int k1 = 8>
SS_AVX2 __m256i block_dot(const __m256i* v, const int32_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (kFour) {
    __m256i s16 = _mm256_maddubs_epi16(v[k0], _mm256_set1_epi32(q[k0]));
    SS_VNNI_UNROLL
    for (int k = k0 + 1; k < k1; ++k) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(v[k], _mm256_set1_epi32(q[k])));
    return _mm256_madd_epi16(s16, ones);
  } else {
    __m256i s = _mm256_setzero_si256();
    SS_VNNI_UNROLL
    for (int k = k0; k < k1; ++k) {
      const __m256i a = _mm256_sign_epi8(_mm256_set1_epi32(q[k]), v[k]);
      s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v[k]), a), ones));
    }
    return s;
  }
}

// Outputs 16t + 8h .. 16t + 8h + 7 for rows r0 .. r0 + R - 1: qgemm.h's tile, one half at a time.
template <int R, Kind K>
SS_AVX2 void half_tile(const QuantWeights& w, const QuantRows& a, int64_t t, int64_t h, int64_t r0, const Outputs& o) {
  const int64_t blocks = w.in / kBlock;
  const int64_t tile_bytes = K.four ? 256 : 512;
  __m256 acc[R];
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const uint8_t* codes = w.codes + t * blocks * tile_bytes + 32 * h;
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i v[8];
    const uint8_t* p = codes + b * tile_bytes;
    if constexpr (K.four) {
      const __m256i low = _mm256_set1_epi8(0x0F);
      SS_VNNI_UNROLL
      for (int k = 0; k < 4; ++k) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * k));
        v[k] = _mm256_and_si256(raw, low);
        v[k + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      }
    } else {
      const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));  // q + 128 -> signed q
      SS_VNNI_UNROLL
      for (int k = 0; k < 8; ++k)
        v[k] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * k)), flip);
    }
    const int64_t at = (t * blocks + b) * kLanes * (K.halves ? 2 : 1) + kHalf * h;
    __m256 scale = _mm256_setzero_ps(), scale_hi = _mm256_setzero_ps();
    __m256 min = _mm256_setzero_ps(), min_hi = _mm256_setzero_ps();
    if constexpr (K.block_scales) scale = lane_scales_avx2<K.wide>(w.block_scales, at);
    if constexpr (K.halves) scale_hi = lane_scales_avx2<true>(w.block_scales, at + kLanes);
    if constexpr (K.mins) min = lane_scales_avx2<K.wide>(w.mins, at);
    if constexpr (K.mins && K.halves) min_hi = lane_scales_avx2<true>(w.mins, at + kLanes);
    SS_VNNI_UNROLL
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int32_t* q = reinterpret_cast<const int32_t*>(a.codes + row * a.in + b * kBlock);  // 8 x 4 codes
      const int64_t blk = row * blocks + b;
      const __m256 d = _mm256_set1_ps(a.d[blk]);
      if constexpr (K.halves) {  // 8-bit: signed codes, no offset to take off
        const __m256i s = block_dot<false, 0, 4>(v, q), u = block_dot<false, 4, 8>(v, q);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(scale, d), acc[r]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(u), _mm256_mul_ps(scale_hi, d), acc[r]);
        if constexpr (K.mins) {
          const float lo = a.d[blk] * static_cast<float>(a.lo_sums[blk]);
          const float hi = a.d[blk] * static_cast<float>(a.sums[blk] - a.lo_sums[blk]);
          acc[r] = _mm256_fmadd_ps(min, _mm256_set1_ps(lo), acc[r]);
          acc[r] = _mm256_fmadd_ps(min_hi, _mm256_set1_ps(hi), acc[r]);
        }
        continue;
      }
      __m256i s = block_dot<K.four>(v, q);
      if constexpr (K.four && !K.mins) s = _mm256_sub_epi32(s, _mm256_set1_epi32(w.offset * a.sums[blk]));  // exact
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), K.block_scales ? _mm256_mul_ps(scale, d) : d, acc[r]);
      if constexpr (K.mins) acc[r] = _mm256_fmadd_ps(min, _mm256_set1_ps(a.dsums[blk]), acc[r]);
    }
  }
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) {
    __m256 out = acc[r];
    if constexpr (!K.block_scales) out = _mm256_mul_ps(out, _mm256_loadu_ps(w.row_scales + t * kLanes + kHalf * h));
    const int64_t at = (r0 + r) * w.out + t * kLanes + kHalf * h;
    if (o.residual != nullptr) out = _mm256_add_ps(_mm256_loadu_ps(o.residual + at), out);
    _mm256_storeu_ps(o.y + at, out);
  }
}

template <int R, Kind K>
SS_AVX2 void last_pass_avx2(const QuantWeights& w, const QuantRows& a, int64_t t, int64_t h, int64_t r0, int64_t left,
                            const Outputs& o) {
  if constexpr (R > 1) {
    if (left < R) return last_pass_avx2<R - 1, K>(w, a, t, h, r0, left, o);
  }
  half_tile<R, K>(w, a, t, h, r0, o);
}

template <Kind K>
SS_AVX2_TARGET void tiles_avx2(const QuantWeights& w, const QuantRows& a, int64_t t0, int64_t t1, const Outputs& o) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      int64_t r0 = 0;
      for (; a.rows - r0 > kAvx2Pass; r0 += kAvx2Pass) half_tile<kAvx2Pass, K>(w, a, t, h, r0, o);
      if (r0 < a.rows) last_pass_avx2<kAvx2Pass, K>(w, a, t, h, r0, a.rows - r0, o);
    }
  }
}

inline void linear_avx2(const QuantWeights& w, const QuantRows& a, const Outputs& o) {
  at::parallel_for(0, w.out / kLanes, 1, [&](int64_t t0, int64_t t1) {
    with_kind(w, [&]<Kind K>() { tiles_avx2<K>(w, a, t0, t1, o); });
  });
}

}  // namespace specstream::qgemm
