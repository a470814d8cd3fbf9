// Attention of decode-like rows (a decode's row, a verification step's rows) over one sequence's KV region.
//
// Why our own kernel: speculation is lossless only if a verification row rounds exactly as the decode of that
// position would, and SDPA's rounding depends on how many query rows one call has. So the engine ran a
// verification of k drafts as k + 1 one-row SDPA calls per layer, each reading the sequence's K and V again and
// paying SDPA's set-up (at 450 positions ~35 us a call here, most of a decode step's attention).
//
// Here one call takes all of a sequence's rows. For the query heads of a GQA group that one thread holds, K is
// walked a span of 64 positions at a time (it stays in L1 while every row and head reads it), each (row, head)'s
// scores are kept, then turned into softmax weights with one max and one sum over all of the row's positions, and
// the values are added a span at a time. Not an online softmax: its rescaling chains every block to the one before,
// and this CPU spent more time waiting on that chain than on the multiply-adds. Each (row, head) sees the same
// positions, in the same order, through the same code, whatever the other rows are. So a row's bits do not depend
// on the row count, and a verification row gets its decode's bits.
//
// Vectors are GCC's vector extensions (no intrinsics): target_clones compiles the kernel for AVX-512, AVX2 and
// the baseline, and the loader picks one per CPU, the same one for every call of a process. Query heads are shared
// out among torch's threads (OpenMP: the library is built with -fopenmp and uses torch's own libgomp).
//
// K and V are read as fp32 or as bfloat16 (engine.kv_cache_dtype): a bfloat16 is the upper half of an fp32, so it
// widens exactly (a shift), and every sum below runs in fp32 either way. Half the bytes is what matters: at 700
// cached positions a batch-1 step reads 34 MB of fp32 K and V, as much as a third of the int4 weights. A bfloat16
// head is read in pairs of neighbouring elements (kv_vec), so its scores sum the dims in another order than an fp32
// arena's: other bits, the same for a row whatever the row count.
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace specstream {

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef int32_t v8i __attribute__((vector_size(32)));

constexpr int64_t kLanes = 16;  // positions per block = floats per vector

#define SS_INLINE inline __attribute__((always_inline))
#define SS_UNROLL _Pragma("GCC unroll 16")  // a head's vectors stay in registers, not on the stack

SS_INLINE v16 splat(float f) { return v16{} + f; }

// 32-byte vectors, for the paths that run where a 64-byte one has no register (narrow_vectors): an initializer of
// equal elements is what GCC turns into one broadcast (`v8{} + f` and `f * v` went through the stack).
SS_INLINE v8 splat8(float f) { return v8{f, f, f, f, f, f, f, f}; }
SS_INLINE v8 load8(const float* p) {
  v8 x;
  std::memcpy(&x, p, sizeof x);
  return x;
}
SS_INLINE void store8(float* p, v8 x) { std::memcpy(p, &x, sizeof x); }

SS_INLINE v16 load(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A bfloat16's bits (the arena's element with engine.kv_cache_dtype bfloat16): no arithmetic, only widened.
using bf16_bits = uint16_t;
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));

// 16 bfloat16 -> their exact fp32 values: each one's bits become the upper half of a float's.
SS_INLINE v16 load(const bf16_bits* p) {
  v16h h;
  std::memcpy(&h, p, sizeof h);
  return (v16)(__builtin_convertvector(h, v16i) << 16);
}

SS_INLINE float widen(float x) { return x; }

SS_INLINE float widen(bf16_bits b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

SS_INLINE void store(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }

// A fixed tree over the lanes: the same order on every call.
SS_INLINE float hsum(v16 a) {
  v8 s8 = __builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
          __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15);
  v4 s4 = __builtin_shufflevector(s8, s8, 0, 1, 2, 3) + __builtin_shufflevector(s8, s8, 4, 5, 6, 7);
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

SS_INLINE v16 vmax(v16 a, v16 b) { return a > b ? a : b; }

SS_INLINE float hmax(v16 a) {
  a = vmax(a, __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  a = vmax(a, __builtin_shufflevector(a, a, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  a = vmax(a, __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  a = vmax(a, __builtin_shufflevector(a, a, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return a[0];
}

// x[i] (16 vectors) -> the vector of their 16 lane sums, in i order: four levels of pairwise folding, each lane
// sum always added up in the same tree (cheaper than 16 separate horizontal sums).
SS_INLINE v16 hsum16(const v16* x) {
  v16 b[8], c[4], d[2];
  SS_UNROLL
  for (int i = 0; i < 8; ++i) {
    b[i] = __builtin_shufflevector(x[2 * i], x[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x[2 * i], x[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  }
  SS_UNROLL
  for (int i = 0; i < 4; ++i) {
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  }
  SS_UNROLL
  for (int i = 0; i < 2; ++i) {
    d[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  }
  return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

// e^x lane by lane (Cephes' expf: x = n ln2 + r, a degree-6 polynomial for e^r, 2^n from the exponent bits);
// within 2 ulp of libm for x in [-87, 88]. Inputs here are score - max score <= 0.
SS_INLINE v16 exp16(v16 x) {
  x = x < splat(-87.0f) ? splat(-87.0f) : x;
  x = x > splat(88.0f) ? splat(88.0f) : x;
  const v16 magic = splat(12582912.0f);  // 1.5 * 2^23: adding and subtracting it rounds to the nearest integer
  const v16 n = (x * 1.44269504088896341f + magic) - magic;
  const v16 r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  v16 y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
  return y * (v16)bits;  // a same-size vector cast reinterprets the bits
}

// Heads of one row whose weighted values one pass over the value vectors adds up: their sums stay in registers.
template <int C>
constexpr int64_t kValueHeads = std::max(1, std::min(4, 16 / C));

// How a bfloat16 arena's vectors are read when a head has an even number of them: 32 elements in one 64-byte load,
// each 32-bit lane holding two neighbours, the even one widened by a shift, the odd one by a mask. Two cheap
// operations per 32 elements, where widening them in order takes four and two half-width loads. A head's vectors
// then come in the order (even dims of 0..31, odd dims of 0..31, even dims of 32..63, ...): q is put in that
// order once per (row, head), and the value sums are put back in dim order once at the end.
template <int C, typename KV>
constexpr bool kSplit = std::is_same_v<KV, bf16_bits> && C % 2 == 0;

// Vector c (0..C-1) of one position's K or V row, in the order above.
template <int C, typename KV>
SS_INLINE v16 kv_vec(const KV* row, int c) {
  if constexpr (kSplit<C, KV>) {
    v16i w;
    std::memcpy(&w, row + (c / 2) * 2 * kLanes, sizeof w);
    return (v16)(c % 2 == 0 ? w << 16 : w & (v16i{} + static_cast<int32_t>(0xFFFF0000u)));
  } else {
    return load(row + c * kLanes);
  }
}

// A head's C query vectors in kv_vec's order.
template <int C, typename KV>
SS_INLINE void q_vecs(const float* q, v16 (&qv)[C]) {
  SS_UNROLL
  for (int c = 0; c < C; ++c) {
    if constexpr (kSplit<C, KV>) {
      const v16 a = load(q + (c / 2) * 2 * kLanes), b = load(q + (c / 2) * 2 * kLanes + kLanes);
      qv[c] = c % 2 == 0 ? __builtin_shufflevector(a, b, 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
                         : __builtin_shufflevector(a, b, 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    } else {
      qv[c] = load(q + c * kLanes);
    }
  }
}

// out[0..D) = a head's C value sums (in kv_vec's order) over `sum`, in dim order.
template <int C, typename KV>
SS_INLINE void store_head(float* out, const float* acc, float sum) {
  SS_UNROLL
  for (int c = 0; c < C; ++c) {
    if constexpr (kSplit<C, KV>) {
      if (c % 2) continue;
      const v16 even = load(acc + c * kLanes) / sum, odd = load(acc + (c + 1) * kLanes) / sum;
      store(out + c * kLanes,
            __builtin_shufflevector(even, odd, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23));
      store(out + (c + 1) * kLanes,
            __builtin_shufflevector(even, odd, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31));
    } else {
      store(out + c * kLanes, load(acc + c * kLanes) / sum);
    }
  }
}

// The lane-wise products of a head's query vectors and one position's key, summed over the vectors.
template <int C, typename KV>
SS_INLINE v16 dot(const v16 (&qv)[C], const KV* k) {
  v16 d = qv[0] * kv_vec<C>(k, 0);
  SS_UNROLL
  for (int c = 1; c < C; ++c) d += qv[c] * kv_vec<C>(k, c);
  return d;
}

// Gemma 2's soft cap on scaled scores (cap > 0), as engine.softcap_attention computes it: tanh(s / cap) * cap, lane
// by lane; lanes past a row's positions stay -inf.
SS_INLINE v16 capped(v16 s, float cap) {
  for (int i = 0; i < kLanes; ++i)
    if (s[i] != -std::numeric_limits<float>::infinity()) s[i] = std::tanh(s[i] / cap) * cap;
  return s;
}

// One (row, head)'s scores over blocks b0..b1-1 of its positions [0, len), scaled (and capped where softcap > 0):
// stored to p (lanes past len get -inf), their lane-wise maximum folded into top.
template <int C, typename KV>
SS_INLINE void scores(const float* q, const KV* k, int64_t b0, int64_t b1, int64_t len, float scale, float softcap,
                      float* p, v16& top) {
  constexpr int64_t D = C * kLanes;
  v16 qv[C];
  q_vecs<C, KV>(q, qv);
  for (int64_t b = b0; b < b1; ++b) {
    const KV* kb = k + b * kLanes * D;
    const int64_t n = std::min<int64_t>(kLanes, len - b * kLanes);  // the row's positions in the block
    v16 dots[kLanes];
    v16 s;
    if (n == kLanes) {  // a whole block (all but a row's last): unrolled, the dot products stay in registers
      SS_UNROLL
      for (int64_t t = 0; t < kLanes; ++t) dots[t] = dot(qv, kb + t * D);
      s = hsum16(dots) * scale;
    } else {
      const v16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
      // Past the row's positions (maybe past the arena): zero, masked below.
      for (int64_t t = 0; t < kLanes; ++t) dots[t] = t < n ? dot(qv, kb + t * D) : v16{};
      const v16i valid = lane < splat(static_cast<float>(n));
      s = valid ? hsum16(dots) * scale : splat(-std::numeric_limits<float>::infinity());
    }
    if (softcap > 0) s = capped(s, softcap);
    store(p + b * kLanes, s);
    top = vmax(top, s);
  }
}

// Scores (blocks 0..blocks-1, lanes past the row's positions -inf) -> softmax weights e^(score - max) in place;
// returns their sum. Every block's exponentials are independent of the others': no chain runs from block to block.
SS_INLINE float exponentials(float* p, int64_t blocks, v16 top) {
  const float m = hmax(top);
  v16 sum = {};
  for (int64_t b = 0; b < blocks; ++b) {
    const v16 s = load(p + b * kLanes);
    const v16 e = exp16(s - m);
    const v16i live = s > splat(-std::numeric_limits<float>::infinity());
    const v16 w = live ? e : v16{};
    store(p + b * kLanes, w);
    sum += w;
  }
  return hsum(sum);
}

// For H heads of one row (softmax weights p + h * stride, running sums acc + h * D): acc += their weighted value
// vectors at positions [t0, t1). Each value vector is read once for the H heads; each head's sum takes the positions
// in order, whatever H is and wherever a caller cuts the positions: the bits do not depend on which heads or
// positions go together.
template <int C, int H, typename KV>
SS_INLINE void add_values(float* acc, const float* p, int64_t stride, const KV* v, int64_t t0, int64_t t1) {
  constexpr int64_t D = C * kLanes;
  v16 o[H][C];
  SS_UNROLL
  for (int h = 0; h < H; ++h) {
    SS_UNROLL
    for (int c = 0; c < C; ++c) o[h][c] = load(acc + h * D + c * kLanes);
  }
  for (int64_t t = t0; t < t1; ++t) {
    SS_UNROLL
    for (int c = 0; c < C; ++c) {
      const v16 x = kv_vec<C>(v + t * D, c);
      SS_UNROLL
      for (int h = 0; h < H; ++h) o[h][c] += p[h * stride + t] * x;
    }
  }
  SS_UNROLL
  for (int h = 0; h < H; ++h) {
    SS_UNROLL
    for (int c = 0; c < C; ++c) store(acc + h * D + c * kLanes, o[h][c]);
  }
}

// Half c * 2 + half of kv_vec's vector c (8 lanes), for add_values_narrow.
template <int C, typename KV>
SS_INLINE v8 kv_half(const KV* row, int c, int half) {
  if constexpr (kSplit<C, KV>) {
    v8i w;
    std::memcpy(&w, row + (c / 2) * 2 * kLanes + half * kLanes, sizeof w);
    return (v8)(c % 2 == 0 ? w << 16 : w & (v8i{} + static_cast<int32_t>(0xFFFF0000u)));
  } else if constexpr (std::is_same_v<KV, bf16_bits>) {
    v8h h;
    std::memcpy(&h, row + c * kLanes + half * 8, sizeof h);
    return (v8)(__builtin_convertvector(h, v8i) << 16);
  } else {
    return load8(row + c * kLanes + half * 8);
  }
}

// Whether the value sums run on 32-byte vectors (add_values_narrow, chunk_attention.h): without AVX-512, GCC has no
// register for a 64-byte vector in these kernels; it kept the sums in memory and built each weight's 16 copies with
// 16 stores (perf annotate), where 32-byte vectors are registers and a broadcast one instruction.
inline bool narrow_vectors() { return !__builtin_cpu_supports("avx512f"); }

// add_values on 32-byte vectors (narrow_vectors), lane for lane the same operations in the same order: the same bits.
template <int C, int H, typename KV>
SS_INLINE void add_values_narrow(float* acc, const float* p, int64_t stride, const KV* v, int64_t t0, int64_t t1) {
  constexpr int64_t D = C * kLanes;
  v8 o[H][2 * C];
  SS_UNROLL
  for (int h = 0; h < H; ++h) {
    SS_UNROLL
    for (int i = 0; i < 2 * C; ++i) o[h][i] = load8(acc + h * D + i * 8);
  }
  for (int64_t t = t0; t < t1; ++t) {
    SS_UNROLL
    for (int c = 0; c < C; ++c) {
      SS_UNROLL
      for (int half = 0; half < 2; ++half) {
        const v8 x = kv_half<C>(v + t * D, c, half);
        SS_UNROLL
        for (int h = 0; h < H; ++h) o[h][2 * c + half] += splat8(p[h * stride + t]) * x;
      }
    }
  }
  SS_UNROLL
  for (int h = 0; h < H; ++h) {
    SS_UNROLL
    for (int i = 0; i < 2 * C; ++i) store8(acc + h * D + i * 8, o[h][i]);
  }
}

// The arena's element type.
enum class KvType { kFloat, kBFloat16 };

// One call's operands. Row r (0..rows-1) attends positions [0, first_len + r) of the region.
struct RowAttention {
  const float* q;       // row r, head h: q + r * q_row + h * head_dim
  int64_t q_row;
  const void* k;        // kv head g, position p: k + g * kv_head + p * head_dim (v likewise), elements of kv_type
  const void* v;
  KvType kv_type;
  int64_t kv_head;
  float* out;           // row r, head h: out + r * out_row + h * head_dim
  int64_t out_row;
  int64_t rows, first_len, num_heads, num_kv_heads;
  float scale;
  float softcap;        // > 0: the scaled scores are soft-capped (Gemma 2's attn_logit_softcapping); 0: none
};

// The scores' scale, 1 / sqrt(head size), as SDPA takes it: every caller builds its calls with this one.
inline float softmax_scale(int64_t head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

// Positions per span: a span's K (or V) vectors of a KV head (16 KB at head size 64) stay in L1 while every row and
// head of the share reads them.
constexpr int64_t kSpanBlocks = 4;

// Query heads h0..h1-1 (one thread's share). C = head_dim / 16 vectors per head. For a GQA group's heads in the share:
// every (row, head)'s scores, a span of key positions at a time; their softmax weights (one max and one sum over all
// of the row's positions, not an online softmax, whose rescaling chains each block to the one before); then the
// weighted values, a span of positions at a time, for up to kValueHeads heads of a row at once. KV: the arena's
// element (a bfloat16 one read as kv_vec reads it).
template <int C, typename KV>
SS_INLINE void row_attention_impl(const RowAttention& a, int64_t h0, int64_t h1) {
  constexpr int64_t D = C * kLanes;
  const int64_t G = a.num_heads / a.num_kv_heads;
  const int64_t longest = a.first_len + a.rows - 1, blocks = (longest + kLanes - 1) / kLanes, stride = blocks * kLanes;
  // Per (row, head) pair, as floats (no over-aligned allocations: vectors are loaded and stored unaligned); kept by
  // the thread between calls, so a step's 30 layers do not allocate them again.
  thread_local std::vector<float> weights, acc, sums, tops;
  const bool narrow = narrow_vectors();
  for (int64_t g = h0 / G; g * G < h1; ++g) {
    const int64_t j0 = std::max(h0, g * G) - g * G, j1 = std::min(h1, (g + 1) * G) - g * G;  // its heads here
    const int64_t heads = j1 - j0, pairs = a.rows * heads;  // pair = r * heads + (j - j0)
    weights.resize(pairs * stride);
    acc.assign(pairs * D, 0.0f);
    sums.resize(pairs);
    tops.assign(pairs * kLanes, -std::numeric_limits<float>::infinity());
    const KV* kg = static_cast<const KV*>(a.k) + g * a.kv_head;
    const KV* vg = static_cast<const KV*>(a.v) + g * a.kv_head;
    auto row_len = [&](int64_t r) { return a.first_len + r; };
    auto row_blocks = [&](int64_t r) { return (row_len(r) + kLanes - 1) / kLanes; };
    for (int64_t b0 = 0; b0 < blocks; b0 += kSpanBlocks) {
      for (int64_t r = 0; r < a.rows; ++r) {
        const int64_t b1 = std::min(b0 + kSpanBlocks, row_blocks(r));
        if (b0 >= b1) continue;  // the row ends before this span
        for (int64_t j = j0; j < j1; ++j) {
          const int64_t pair = r * heads + j - j0;
          v16 top = load(&tops[pair * kLanes]);
          scores<C>(a.q + r * a.q_row + (g * G + j) * D, kg, b0, b1, row_len(r), a.scale, a.softcap,
                    &weights[pair * stride], top);
          store(&tops[pair * kLanes], top);
        }
      }
    }
    for (int64_t pair = 0; pair < pairs; ++pair)
      sums[pair] = exponentials(&weights[pair * stride], row_blocks(pair / heads), load(&tops[pair * kLanes]));
    for (int64_t t0 = 0; t0 < longest; t0 += kSpanBlocks * kLanes) {
      for (int64_t r = 0; r < a.rows; ++r) {
        const int64_t t1 = std::min(t0 + kSpanBlocks * kLanes, row_len(r));
        if (t0 >= t1) continue;  // the row ends before this span
        for (int64_t j = 0; j < heads; j += kValueHeads<C>) {
          float* o = &acc[(r * heads + j) * D];
          const float* p = &weights[(r * heads + j) * stride];
          switch (std::min<int64_t>(kValueHeads<C>, heads - j) + (narrow ? 4 : 0)) {
            case 1: add_values<C, 1>(o, p, stride, vg, t0, t1); break;
            case 2: add_values<C, 2>(o, p, stride, vg, t0, t1); break;
            case 3: add_values<C, 3>(o, p, stride, vg, t0, t1); break;
            case 4: add_values<C, 4>(o, p, stride, vg, t0, t1); break;
            case 5: add_values_narrow<C, 1>(o, p, stride, vg, t0, t1); break;
            case 6: add_values_narrow<C, 2>(o, p, stride, vg, t0, t1); break;
            case 7: add_values_narrow<C, 3>(o, p, stride, vg, t0, t1); break;
            default: add_values_narrow<C, 4>(o, p, stride, vg, t0, t1); break;
          }
        }
      }
    }
    for (int64_t r = 0; r < a.rows; ++r) {
      for (int64_t j = j0; j < j1; ++j) {
        const int64_t pair = r * heads + j - j0;
        store_head<C, KV>(a.out + r * a.out_row + (g * G + j) * D, &acc[pair * D], sums[pair]);
      }
    }
  }
}

#define SS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
// The kernel for a head size (16, 32, 64, 128 or 256: C vectors a head) and arena element type, compiled per CPU
// level.
#define SS_ROW_KERNEL(C, KV, name) \
  SS_CLONES void name(const RowAttention& a, int64_t h0, int64_t h1) { row_attention_impl<C, KV>(a, h0, h1); }
SS_ROW_KERNEL(1, float, row_attention_16)
SS_ROW_KERNEL(2, float, row_attention_32)
SS_ROW_KERNEL(4, float, row_attention_64)
SS_ROW_KERNEL(8, float, row_attention_128)
SS_ROW_KERNEL(16, float, row_attention_256)
SS_ROW_KERNEL(1, bf16_bits, row_attention_16_bf16)
SS_ROW_KERNEL(2, bf16_bits, row_attention_32_bf16)
SS_ROW_KERNEL(4, bf16_bits, row_attention_64_bf16)
SS_ROW_KERNEL(8, bf16_bits, row_attention_128_bf16)
SS_ROW_KERNEL(16, bf16_bits, row_attention_256_bf16)

using RowKernel = void (*)(const RowAttention&, int64_t, int64_t);

// The kernel for a head size and arena element, or null where the head size has none.
inline RowKernel row_kernel(KvType kv_type, int64_t head_dim) {
  const RowKernel fp32[] = {row_attention_16, row_attention_32, row_attention_64, row_attention_128,
                            row_attention_256};
  const RowKernel bf16[] = {row_attention_16_bf16, row_attention_32_bf16, row_attention_64_bf16,
                            row_attention_128_bf16, row_attention_256_bf16};
  const int i = head_dim == 16 ? 0 : head_dim == 32 ? 1 : head_dim == 64 ? 2 : head_dim == 128 ? 3
              : head_dim == 256 ? 4 : -1;
  if (i < 0) return nullptr;
  return kv_type == KvType::kFloat ? fp32[i] : bf16[i];
}

// Below this much work (rows x keys x heads x head size) one thread: starting a parallel region costs a few us.
constexpr int64_t kParallelWork = 1 << 16;

// Items of several calls (call c's are first_item[c]..first_item[c + 1] - 1) whose work adds up to work_before
// (an entry per item boundary, from 0), cut into one run of consecutive items per thread, of about equal work, in one
// parallel region (or on this thread when the work is small). run(c, lo, hi): call c's items lo..hi - 1 of a run,
// numbered within the call.
template <typename Run>
void parallel_runs(const std::vector<int64_t>& first_item, const std::vector<int64_t>& work_before, const Run& run) {
  const int64_t items = static_cast<int64_t>(work_before.size()) - 1, work = work_before.back();
  if (items <= 0) return;
  auto run_items = [&](int64_t i0, int64_t i1) {
    for (size_t c = 0; c + 1 < first_item.size(); ++c) {
      const int64_t lo = std::max(i0, first_item[c]), hi = std::min(i1, first_item[c + 1]);
      if (lo < hi) run(c, lo - first_item[c], hi - first_item[c]);
    }
  };
  const int64_t runs = work < kParallelWork ? 1 : std::min<int64_t>(at::get_num_threads(), items);
  auto item_at = [&](int64_t r) {  // where run r starts: the first item boundary at r / runs of the work
    const int64_t target = (work * r + runs - 1) / runs;
    return static_cast<int64_t>(std::lower_bound(work_before.begin(), work_before.end(), target) - work_before.begin());
  };
  if (runs == 1) {
    run_items(0, items);
    return;
  }
  at::parallel_for(0, runs, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) run_items(item_at(r), item_at(r + 1));
  });
}

// Several sequences' calls in one parallel region (a decode batch: one call per sequence and layer, where a region
// each would cost more than a short sequence's attention). False where the head size has no kernel (the caller then
// runs SDPA row by row). The (call, query head) items are cut into one run of consecutive items per thread, of
// about equal work (rows x keys); each (row, head) is computed by one thread from start to end, with the same
// operands whatever else the region holds, so neither threads nor batching change a bit.
inline bool row_attention(const std::vector<RowAttention>& calls, int64_t head_dim) {
  // One arena: every call's element type is the first's.
  const RowKernel kernel = row_kernel(calls.empty() ? KvType::kFloat : calls[0].kv_type, head_dim);
  if (kernel == nullptr) return false;
  std::vector<int64_t> first_item(calls.size() + 1, 0);  // call c's heads are items first_item[c]..first_item[c + 1]
  std::vector<int64_t> work_before(1, 0);  // per item boundary: the work of the items before it
  for (size_t c = 0; c < calls.size(); ++c) {
    const RowAttention& a = calls[c];
    first_item[c + 1] = first_item[c] + a.num_heads;
    const int64_t per_head = a.rows * (a.first_len + a.rows) * head_dim;
    for (int64_t h = 0; h < a.num_heads; ++h) work_before.push_back(work_before.back() + per_head);
  }
  parallel_runs(first_item, work_before, [&](size_t c, int64_t lo, int64_t hi) { kernel(calls[c], lo, hi); });
  return true;
}

inline bool row_attention(const RowAttention& a, int64_t head_dim) {
  return row_attention(std::vector<RowAttention>{a}, head_dim);
}

}  // namespace specstream
