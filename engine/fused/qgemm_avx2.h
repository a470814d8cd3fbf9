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

// qgemm.h's quantize_row with 8-float vectors: the same max, the same scale, the same rounding, the same codes.
SS_AVX2_TARGET inline void quantize_row_avx2(const float* x, int64_t in, int8_t* codes, float* d, int32_t* sums,
                                             float* dsums) {
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
    const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    d[b] = amax / 127.0f;
    sums[b] = _mm_cvtsi128_si32(t);
    dsums[b] = d[b] * static_cast<float>(sums[b]);
  }
}

// The int32 sums of one row's block against 8 weight vectors (one half-tile): q . codes (4-bit) or q . a (8-bit).
template <bool kFour>
SS_AVX2 __m256i block_dot(const __m256i* v, const int32_t* q) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (kFour) {
    __m256i s16 = _mm256_maddubs_epi16(v[0], _mm256_set1_epi32(q[0]));
    SS_VNNI_UNROLL
    for (int k = 1; k < 8; ++k) s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(v[k], _mm256_set1_epi32(q[k])));
    return _mm256_madd_epi16(s16, ones);
  } else {
    __m256i s = _mm256_setzero_si256();
    SS_VNNI_UNROLL
    for (int k = 0; k < 8; ++k) {
      const __m256i a = _mm256_sign_epi8(_mm256_set1_epi32(q[k]), v[k]);
      s = _mm256_add_epi32(s, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(v[k]), a), ones));
    }
    return s;
  }
}

// Outputs 16t + 8h .. 16t + 8h + 7 for rows r0 .. r0 + R - 1: qgemm.h's tile, one half at a time.
template <int R, bool kFour, bool kMins, bool kBlockScales>
SS_AVX2 void half_tile(const QuantWeights& w, const QuantRows& a, int64_t t, int64_t h, int64_t r0, const Outputs& o) {
  const int64_t blocks = w.in / kBlock;
  const int64_t tile_bytes = kFour ? 256 : 512;
  __m256 acc[R];
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const uint8_t* codes = w.codes + t * blocks * tile_bytes + 32 * h;
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i v[8];
    const uint8_t* p = codes + b * tile_bytes;
    if constexpr (kFour) {
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
    const int64_t at = (t * blocks + b) * kLanes + kHalf * h;
    __m256 scale = _mm256_setzero_ps(), min = _mm256_setzero_ps();
    if constexpr (kBlockScales)
      scale = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.block_scales + at)));
    if constexpr (kMins) min = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w.mins + at)));
    SS_VNNI_UNROLL
    for (int r = 0; r < R; ++r) {
      const int64_t row = r0 + r;
      const int32_t* q = reinterpret_cast<const int32_t*>(a.codes + row * a.in + b * kBlock);  // 8 x 4 codes
      __m256i s = block_dot<kFour>(v, q);
      const int64_t blk = row * blocks + b;
      if constexpr (kFour && !kMins) s = _mm256_sub_epi32(s, _mm256_set1_epi32(w.offset * a.sums[blk]));  // exact
      const __m256 d = _mm256_set1_ps(a.d[blk]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), kBlockScales ? _mm256_mul_ps(scale, d) : d, acc[r]);
      if constexpr (kMins) acc[r] = _mm256_fmadd_ps(min, _mm256_set1_ps(a.dsums[blk]), acc[r]);
    }
  }
  SS_VNNI_UNROLL
  for (int r = 0; r < R; ++r) {
    __m256 out = acc[r];
    if constexpr (!kBlockScales) out = _mm256_mul_ps(out, _mm256_loadu_ps(w.row_scales + t * kLanes + kHalf * h));
    const int64_t at = (r0 + r) * w.out + t * kLanes + kHalf * h;
    if (o.residual != nullptr) out = _mm256_add_ps(_mm256_loadu_ps(o.residual + at), out);
    _mm256_storeu_ps(o.y + at, out);
  }
}

template <int R, bool kFour, bool kMins, bool kBlockScales>
SS_AVX2 void last_pass_avx2(const QuantWeights& w, const QuantRows& a, int64_t t, int64_t h, int64_t r0, int64_t left,
                            const Outputs& o) {
  if constexpr (R > 1) {
    if (left < R) return last_pass_avx2<R - 1, kFour, kMins, kBlockScales>(w, a, t, h, r0, left, o);
  }
  half_tile<R, kFour, kMins, kBlockScales>(w, a, t, h, r0, o);
}

template <bool kFour, bool kMins, bool kBlockScales>
SS_AVX2_TARGET void tiles_avx2(const QuantWeights& w, const QuantRows& a, int64_t t0, int64_t t1, const Outputs& o) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t h = 0; h < 2; ++h) {
      int64_t r0 = 0;
      for (; a.rows - r0 > kAvx2Pass; r0 += kAvx2Pass) {
        half_tile<kAvx2Pass, kFour, kMins, kBlockScales>(w, a, t, h, r0, o);
      }
      if (r0 < a.rows) last_pass_avx2<kAvx2Pass, kFour, kMins, kBlockScales>(w, a, t, h, r0, a.rows - r0, o);
    }
  }
}

inline void linear_avx2(const QuantWeights& w, const QuantRows& a, const Outputs& o) {
  at::parallel_for(0, w.out / kLanes, 1, [&](int64_t t0, int64_t t1) {
    with_kind(w, [&]<bool kFour, bool kMins, bool kBlockScales>() {
      tiles_avx2<kFour, kMins, kBlockScales>(w, a, t0, t1, o);
    });
  });
}

}  // namespace specstream::qgemm
