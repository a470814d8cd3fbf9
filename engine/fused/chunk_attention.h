// Attention of a prompt chunk's rows over its sequence's region: row r attends positions [0, first_len + r).
//
// Why our own kernel: SDPA's CPU flash attention splits keys into blocks of 512, so a causal chunk of up to 512
// rows computes (and then masks) every score of its square, twice the work the triangle needs; on the default
// model it was 40 % of a 635-token prefill and 16 % of a 16-concurrent run. The row kernel (row_attention.h) skips
// the masked half but sums each score across 16 lanes, a third of its work.
//
// Here each KV head's K is transposed once a call, block by block ([block][dim][16 positions]), so four rows get a
// block's 16 scores each as broadcast multiply-adds over the head's dimensions, one transposed vector serving the
// four; the values are added four rows at a time the same way. Each row keeps its own online-softmax state and
// sums in a fixed order over the same blocks from position 0, whoever shares its tile: a row's bits do not depend
// on how its prompt was cut into chunks. (They differ from a decode's, as SDPA's did: decodes and verification rows
// keep the row kernel, which rounds alike for both.)
//
// A bfloat16 arena (engine.kv_cache_dtype) is widened once a call: K as it is transposed, V into a buffer of its own,
// so the tiles read fp32 as they would from an fp32 arena and get the bits its widening gets.
#pragma once

#include <memory>

#include "row_attention.h"

namespace specstream {

constexpr int64_t kTileRows = 4;

// Kt for one KV head: [blocks][D][16], block b holding positions 16b..16b+15 of k (n positions, [n, D]) laid out
// dimension-major; the last block's missing positions are zero (their scores are masked).
template <typename KV>
void transpose_blocks(const KV* k, int64_t n, int64_t D, float* kt) {
  const int64_t blocks = (n + kLanes - 1) / kLanes;
  for (int64_t b = 0; b < blocks; ++b) {
    float* dst = kt + b * D * kLanes;
    const int64_t m = std::min<int64_t>(kLanes, n - b * kLanes);
    if (m < kLanes) std::memset(dst, 0, sizeof(float) * D * kLanes);
    for (int64_t t = 0; t < m; ++t) {
      const KV* src = k + (b * kLanes + t) * D;
      for (int64_t d = 0; d < D; ++d) dst[d * kLanes + t] = widen(src[d]);
    }
  }
}

// Rows r0..r0+R-1 (R <= 4) of call a, query head h; kt: the head's KV group's transposed K.
template <int C>
SS_INLINE void chunk_tile(const RowAttention& a, const float* kt, int64_t h, int64_t r0, int64_t R, bool narrow) {
  constexpr int64_t D = C * kLanes;
  const int64_t g = h / (a.num_heads / a.num_kv_heads);
  const float* vg = static_cast<const float*>(a.v) + g * a.kv_head;  // fp32: a bfloat16 arena is widened first
  const float* q[kTileRows];
  for (int64_t r = 0; r < kTileRows; ++r) q[r] = a.q + (r0 + std::min(r, R - 1)) * a.q_row + h * D;  // R < 4: repeats
  const v16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  v16 o[kTileRows][C] = {};
  float max_[kTileRows], sum_[kTileRows] = {};
  for (int64_t r = 0; r < kTileRows; ++r) max_[r] = -std::numeric_limits<float>::infinity();
  alignas(64) float pw[kTileRows][kLanes];
  const int64_t longest = a.first_len + r0 + R - 1;  // the tile's last row's positions
  for (int64_t p0 = 0; p0 < longest; p0 += kLanes) {
    const float* ktb = kt + (p0 / kLanes) * D * kLanes;
    v16 s[kTileRows] = {};
    // Unrolled whole: where AVX2 has no 64-byte registers, GCC kept these sums in memory across the loop's back edge
    // and copied them through general registers 8 bytes at a time (the kernel took 1.5x as long).
    _Pragma("GCC unroll 128")
    for (int64_t d = 0; d < D; ++d) {
      const v16 kv = load(ktb + d * kLanes);
      SS_UNROLL
      for (int r = 0; r < kTileRows; ++r) s[r] += q[r][d] * kv;
    }
    SS_UNROLL
    for (int r = 0; r < kTileRows; ++r) {
      const int64_t n = std::min<int64_t>(kLanes, a.first_len + r0 + r - p0);  // this row's positions here
      const v16i valid = lane < splat(static_cast<float>(n));
      v16 sv = valid ? s[r] * a.scale : splat(-std::numeric_limits<float>::infinity());
      if (a.softcap > 0) sv = capped(sv, a.softcap);
      const float m = n > 0 ? std::max(max_[r], hmax(sv)) : max_[r];
      if (m > max_[r]) {  // rescale what was summed under the old max
        const float shrink = std::exp(max_[r] - m);
        sum_[r] *= shrink;
        SS_UNROLL
        for (int c = 0; c < C; ++c) o[r][c] *= shrink;
        max_[r] = m;
      }
      const v16 p = valid ? exp16(sv - m) : v16{};
      sum_[r] += hsum(p);
      store(pw[r], p);
    }
    const float* vb = vg + p0 * D;
    const int64_t n = std::min<int64_t>(kLanes, longest - p0);  // positions of the block anyone here reads
    // Column slice by column slice: only 4 rows' accumulators of one slice are live (the 4 x C of all slices
    // spill out of AVX2's 16 registers). Each accumulator still adds the positions in order: the same bits.
    if (narrow) {  // 32-byte halves (narrow_vectors), lane for lane the same sums
      SS_UNROLL
      for (int c = 0; c < C; ++c) {
        SS_UNROLL
        for (int half = 0; half < 2; ++half) {
          v8 acc[kTileRows];
          SS_UNROLL
          for (int r = 0; r < kTileRows; ++r) acc[r] = load8(reinterpret_cast<const float*>(&o[r][c]) + half * 8);
          for (int64_t t = 0; t < n; ++t) {
            const v8 v = load8(vb + t * D + c * kLanes + half * 8);
            SS_UNROLL
            for (int r = 0; r < kTileRows; ++r) acc[r] += splat8(pw[r][t]) * v;
          }
          SS_UNROLL
          for (int r = 0; r < kTileRows; ++r) store8(reinterpret_cast<float*>(&o[r][c]) + half * 8, acc[r]);
        }
      }
    } else {
      SS_UNROLL
      for (int c = 0; c < C; ++c) {
        for (int64_t t = 0; t < n; ++t) {
          const v16 v = load(vb + t * D + c * kLanes);
          SS_UNROLL
          for (int r = 0; r < kTileRows; ++r) o[r][c] += pw[r][t] * v;
        }
      }
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float* out = a.out + (r0 + r) * a.out_row + h * D;
    SS_UNROLL
    for (int c = 0; c < C; ++c) store(out + c * kLanes, o[r][c] / sum_[r]);
  }
}

template <int C>
SS_INLINE void chunk_tiles_impl(const RowAttention& a, const float* kt, int64_t kt_head, int64_t i0, int64_t i1) {
  const int64_t tiles = (a.rows + kTileRows - 1) / kTileRows, G = a.num_heads / a.num_kv_heads;
  const bool narrow = narrow_vectors();
  for (int64_t i = i0; i < i1; ++i) {  // item i: head i / tiles, tile i % tiles
    const int64_t h = i / tiles, r0 = (i % tiles) * kTileRows;
    chunk_tile<C>(a, kt + (h / G) * kt_head, h, r0, std::min(kTileRows, a.rows - r0), narrow);
  }
}

SS_CLONES void chunk_tiles_16(const RowAttention& a, const float* kt, int64_t kh, int64_t i0, int64_t i1) {
  chunk_tiles_impl<1>(a, kt, kh, i0, i1);
}
SS_CLONES void chunk_tiles_32(const RowAttention& a, const float* kt, int64_t kh, int64_t i0, int64_t i1) {
  chunk_tiles_impl<2>(a, kt, kh, i0, i1);
}
SS_CLONES void chunk_tiles_64(const RowAttention& a, const float* kt, int64_t kh, int64_t i0, int64_t i1) {
  chunk_tiles_impl<4>(a, kt, kh, i0, i1);
}
SS_CLONES void chunk_tiles_128(const RowAttention& a, const float* kt, int64_t kh, int64_t i0, int64_t i1) {
  chunk_tiles_impl<8>(a, kt, kh, i0, i1);
}
SS_CLONES void chunk_tiles_256(const RowAttention& a, const float* kt, int64_t kh, int64_t i0, int64_t i1) {
  chunk_tiles_impl<16>(a, kt, kh, i0, i1);
}

// Several sequences' chunks (one call each) in one parallel region, items (call, head, tile of 4 rows) cut into one
// run per thread of about equal work. False where the head size has no kernel (the caller then runs SDPA).
inline bool chunk_attention(const std::vector<RowAttention>& calls, int64_t head_dim) {
  void (*kernel)(const RowAttention&, const float*, int64_t, int64_t, int64_t) = nullptr;
  switch (head_dim) {
    case 16: kernel = chunk_tiles_16; break;
    case 32: kernel = chunk_tiles_32; break;
    case 64: kernel = chunk_tiles_64; break;
    case 128: kernel = chunk_tiles_128; break;
    case 256: kernel = chunk_tiles_256; break;
    default: return false;
  }
  if (calls.empty()) return true;
  const bool bf16 = calls[0].kv_type == KvType::kBFloat16;  // one arena: every call's type
  // Each call's K, transposed per KV head.
  std::vector<int64_t> kt_at(calls.size() + 1, 0), kt_head(calls.size());
  for (size_t c = 0; c < calls.size(); ++c) {
    const int64_t n = calls[c].first_len + calls[c].rows - 1;
    kt_head[c] = (n + kLanes - 1) / kLanes * kLanes * head_dim;
    kt_at[c + 1] = kt_at[c] + calls[c].num_kv_heads * kt_head[c];
  }
  std::unique_ptr<float[]> kt(new float[kt_at.back()]);  // every element written below: no zeroing pass
  // A bfloat16 arena's V widened ([n, D] per KV head, at the same offsets as kt), and calls that read it there.
  std::unique_ptr<float[]> vt(bf16 ? new float[kt_at.back()] : nullptr);
  std::vector<RowAttention> widened = calls;
  for (size_t c = 0; bf16 && c < calls.size(); ++c) {
    widened[c].v = vt.get() + kt_at[c];
    widened[c].kv_head = kt_head[c];
    widened[c].kv_type = KvType::kFloat;
  }
  std::vector<int64_t> first_group(calls.size() + 1, 0), group_work(1, 0);  // items (call, KV head)
  for (size_t c = 0; c < calls.size(); ++c) {
    first_group[c + 1] = first_group[c] + calls[c].num_kv_heads;
    for (int64_t g = 0; g < calls[c].num_kv_heads; ++g) group_work.push_back(group_work.back() + kt_head[c]);
  }
  parallel_runs(first_group, group_work, [&](size_t c, int64_t g0, int64_t g1) {
    const RowAttention& a = calls[c];
    const int64_t n = a.first_len + a.rows - 1;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t at = kt_at[c] + g * kt_head[c];
      if (bf16) {
        transpose_blocks(static_cast<const bf16_bits*>(a.k) + g * a.kv_head, n, head_dim, kt.get() + at);
        const bf16_bits* v = static_cast<const bf16_bits*>(a.v) + g * a.kv_head;
        for (int64_t i = 0; i < n * head_dim; i += kLanes) store(vt.get() + at + i, load(v + i));
      } else {
        transpose_blocks(static_cast<const float*>(a.k) + g * a.kv_head, n, head_dim, kt.get() + at);
      }
    }
  });
  // Items: per call, head-major, then tiles; a tile's work is its rows x its last row's positions.
  std::vector<int64_t> first_item(calls.size() + 1, 0), work_before(1, 0);
  for (size_t c = 0; c < calls.size(); ++c) {
    const RowAttention& a = calls[c];
    const int64_t tiles = (a.rows + kTileRows - 1) / kTileRows;
    first_item[c + 1] = first_item[c] + a.num_heads * tiles;
    for (int64_t h = 0; h < a.num_heads; ++h)
      for (int64_t t = 0; t < tiles; ++t) {
        const int64_t rows = std::min(kTileRows, a.rows - t * kTileRows);
        work_before.push_back(work_before.back() + rows * (a.first_len + t * kTileRows + rows) * head_dim);
      }
  }
  parallel_runs(first_item, work_before, [&](size_t c, int64_t lo, int64_t hi) {
    kernel(widened[c], kt.get() + kt_at[c], kt_head[c], lo, hi);
  });
  return true;
}

}  // namespace specstream
