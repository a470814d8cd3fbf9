// The decoder layers of one engine step in one call, for a CPU model in fp32 whose linears are weight-only
// int4/int8 kernels (with their bf16 copy for wide steps) or bf16 (engine/quant/linear.py).
//
// Why C++: at batch 1 the eager step spent as long in Python and in dispatching ~5,500 small ops as in its
// linears, and a batch adds a Python loop over its sequences in every layer (issue 17, 54e26a1:docs/benchmarks.md).
// The ops here are exactly the eager path's (engine/model.py, engine/rotary.py, engine/quant/linear.py), in the
// same order, on the same views, with the same kernel chosen for each row count, so every row gets the eager
// path's bits: speculation stays lossless, and the eager path stays the reference the tests compare with.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/Version.h>
#include <immintrin.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "chunk_attention.h"
#include "lora_delta.h"
#include "qgemm_isa.h"
#include "row_attention.h"
#include "step_ops.h"

// SLEEF's 16-lane exp, the one ATen's AVX-512 kernels call (libtorch_cpu exports it).
extern "C" __m512 Sleef_expf16_u10(__m512);

namespace {

constexpr int64_t kInt4 = 0;  // _weight_int4pack_mm_for_cpu: packed codes, [in / group, out, 2] scale and zero
constexpr int64_t kInt8 = 1;  // _weight_int8pack_mm: int8 codes, per-row scales
constexpr int64_t kBf16 = 2;  // oneDNN-prepacked bf16 weight only (the bf16 format)
constexpr int64_t kQ4 = 3;    // qgemm.h 4-bit: tiled codes, scales, mins (or none)
constexpr int64_t kQ8 = 4;    // qgemm.h 8-bit: tiled codes, scales per output or block, mins (or none)

// engine.quant.linear._gemm_call: one oneDNN call; a single row runs as two, the copy's output dropped.
at::Tensor gemm_call(const at::Tensor& packed, const at::Tensor& x) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                         c10::string_view, c10::List<std::optional<c10::Scalar>>,
                                         std::optional<c10::string_view>)>();
  const c10::List<std::optional<c10::Scalar>> none;
  if (x.size(0) == 1) {
    return op.call(x.expand({2, -1}).contiguous(), packed, std::nullopt, "none", none, "").slice(0, 0, 1);
  }
  return op.call(x.contiguous(), packed, std::nullopt, "none", none, "");
}

// engine.quant.linear.Bf16Kernel: pieces of at most `window` rows keep a row's bits independent of the row count.
at::Tensor bf16_kernel(const at::Tensor& packed, const at::Tensor& x, int64_t window) {
  if (x.size(0) <= window) return gemm_call(packed, x);
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& piece : x.split(window)) pieces.push_back(gemm_call(packed, piece));
  return at::cat(pieces);
}

// x [T, in] fp32 -> [T, out] fp32 through qgemm.h, on weights packed by engine/quant/vnni.py in tiles of 16
// outputs (out: 16 x tiles, padded): 4-bit codes [tiles, in / 32 * 256] or 8-bit codes [tiles, in / 32 * 512], with
//   scales per block [tiles, in / 32, 16], fp16 or fp32, and mins alike (or none: Q4_0-like, 8-bit symmetric),
//   8-bit only: fp32 scales (and mins, or none) per half block [tiles, in / 32, 2, 16] (Q6_K), or one fp32 scale
//   per output [out].
// With a residual [T, out] (out a whole number of tiles), residual + x W^T.
at::Tensor qlinear_add(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const std::optional<at::Tensor>& mins, int64_t bits, const at::Tensor* residual) {
  namespace q = specstream::qgemm;
  TORCH_CHECK(q::current_isa().load() != q::Isa::kNone,
              "qlinear: this CPU has neither AVX512-VNNI (with BW, VL, F16C, FMA) nor AVX2 (with FMA, F16C)");
  TORCH_CHECK(bits == 4 || bits == 8, "qlinear: bits must be 4 or 8, got ", bits);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "qlinear: x must be [T, in] fp32");
  const int64_t rows = x.size(0), in = x.size(1), out = codes.size(0) * q::kLanes, blocks = in / q::kBlock;
  const bool four = bits == 4;
  TORCH_CHECK(in % q::kBlock == 0, "qlinear: in_features ", in, " is not a multiple of 32");
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() && codes.size(1) == blocks * (four ? 256 : 512),
              "qlinear: codes must be contiguous uint8 [tiles, ", blocks * (four ? 256 : 512), "]");
  TORCH_CHECK(scales.is_contiguous() && (scales.scalar_type() == at::kHalf || scales.scalar_type() == at::kFloat),
              "qlinear: scales must be contiguous fp16 or fp32");
  const bool wide = scales.scalar_type() == at::kFloat;
  const bool row_scales = !four && wide && !mins.has_value() && scales.numel() == out;
  const bool halves = !four && wide && scales.numel() == 2 * out * blocks;
  TORCH_CHECK(row_scales || halves || scales.numel() == out * blocks,
              "qlinear: scales must be [tiles, in / 32, 16]",
              four ? "" : ", [tiles, in / 32, 2, 16] fp32 or [out] fp32");
  TORCH_CHECK(four || !wide || mins.has_value() || row_scales || halves,
              "qlinear: 8-bit fp32 block scales come with mins");
  TORCH_CHECK(!four || !wide || mins.has_value(), "qlinear: 4-bit fp32 scales come with mins");
  TORCH_CHECK(four || !mins.has_value() || wide, "qlinear: 8-bit mins come in fp32");
  if (mins.has_value()) {
    TORCH_CHECK(mins->scalar_type() == scales.scalar_type() && mins->is_contiguous() && mins->numel() == scales.numel(),
                "qlinear: mins must be contiguous, of the scales' dtype and shape");
  }
  const at::Tensor xc = x.contiguous();
  // The quantized rows live in this thread's scratch, grown as needed: a step makes ~120 of these calls, and five
  // fresh tensors each cost more than quantizing a row.
  thread_local std::vector<int32_t> scratch;
  scratch.resize(static_cast<size_t>(rows * (in / 4 + 4 * blocks)));
  int8_t* codes_a = reinterpret_cast<int8_t*>(scratch.data());  // [rows, in]
  float* d = reinterpret_cast<float*>(scratch.data() + rows * in / 4);  // [rows, blocks]
  int32_t* sums = scratch.data() + rows * (in / 4 + blocks);  // [rows, blocks]
  float* dsums = reinterpret_cast<float*>(scratch.data() + rows * (in / 4 + 2 * blocks));  // [rows, blocks]
  int32_t* lo_sums = scratch.data() + rows * (in / 4 + 3 * blocks);  // [rows, blocks]
  const float* xp = xc.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t at = r * blocks;
      q::quantize_row_isa(xp + r * in, in, codes_a + r * in, d + at, sums + at, lo_sums + at, dsums + at);
    }
  });
  at::Tensor y = at::empty({rows, out}, x.options());
  const q::QuantRows a{codes_a, d, sums, lo_sums, dsums, rows, in};
  const q::QuantWeights w{codes.data_ptr<uint8_t>(),
                          row_scales ? nullptr : scales.data_ptr(),
                          mins.has_value() ? mins->data_ptr() : nullptr,
                          row_scales ? scales.data_ptr<float>() : nullptr,
                          four ? (mins.has_value() ? 0 : 8) : 128,
                          out, in, four, wide && !row_scales, halves};
  const float* rp = nullptr;
  if (residual != nullptr) {
    TORCH_CHECK(residual->scalar_type() == at::kFloat && residual->is_contiguous() && residual->size(0) == rows &&
                    residual->size(1) == out, "qlinear: the residual must be contiguous fp32 [", rows, ", ", out, "]");
    rp = residual->data_ptr<float>();
  }
  q::linear_isa(w, a, {y.data_ptr<float>(), rp});
  return y;
}

at::Tensor qlinear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                   const std::optional<at::Tensor>& mins, int64_t bits) {
  return qlinear_add(x, codes, scales, mins, bits, nullptr);
}

struct Linears {
  at::TensorList wa, wb;                                // the kernel's tensors
  const c10::List<std::optional<at::Tensor>>& wc;      // a third one (qgemm.h's 4-bit mins), if any
  const c10::List<std::optional<at::Tensor>>& wide;    // the bf16 copy for wide steps, if kept
  const c10::List<std::optional<at::Tensor>>& biases;  // b, added to the product as the layer adds it, if any
  at::IntArrayRef kinds, groups, outs, max_quant_rows, windows;
  bool prompt;  // the step holds prompt rows: the bf16 copy for every row (engine.quant.linear.StepKind)

  // QuantizedLinear.forward / Bf16Linear.forward: x [T, in] fp32 -> [T, out] fp32; bf16 activations inside,
  // but for qgemm.h, which takes fp32 ones.
  // Linear i runs its quantized kernel at this many rows (else the bf16 format or the bf16 copy for wide steps).
  bool quantized(int64_t i, int64_t rows) const {
    return kinds[i] != kBf16 && !((prompt || rows > max_quant_rows[i]) && wide.get(i).has_value());
  }
  bool on_qgemm(int64_t i, int64_t rows) const { return (kinds[i] == kQ4 || kinds[i] == kQ8) && quantized(i, rows); }

  at::Tensor operator()(int64_t i, const at::Tensor& x) const {
    const std::optional<at::Tensor> bias = biases.get(i);
    return bias.has_value() ? product(i, x) + *bias : product(i, x);
  }

  at::Tensor product(int64_t i, const at::Tensor& x) const {
    const int64_t rows = x.size(0);
    if (on_qgemm(i, rows)) {
      at::Tensor y = qlinear(x, wa[i], wb[i], wc.get(i), kinds[i] == kQ4 ? 4 : 8);
      return y.size(1) == outs[i] ? y : y.slice(1, 0, outs[i]);  // outputs padded to a tile
    }
    at::Tensor xb = x.to(at::kBFloat16);
    at::Tensor y;
    if (kinds[i] == kBf16) {
      y = bf16_kernel(wa[i], xb, windows[i]);
    } else if (!quantized(i, rows)) {
      y = bf16_kernel(*wide.get(i), xb, windows[i]);
    } else if (kinds[i] == kInt4) {
      y = at::_weight_int4pack_mm_for_cpu(xb, wa[i], groups[i], wb[i]);
      if (y.size(1) != outs[i]) y = y.slice(1, 0, outs[i]);
    } else {
      y = at::_weight_int8pack_mm(xb, wa[i], wb[i]);
    }
    return y.to(x.dtype());
  }

  // h + linear(i, x): on qgemm.h the add is in the kernel's store (the same bits, no ATen add and no fresh h); with
  // a bias, h + (x W^T + b) as the layer rounds it.
  at::Tensor add(int64_t i, const at::Tensor& x, const at::Tensor& h) const {
    if (!biases.get(i).has_value() && on_qgemm(i, x.size(0)) && outs[i] % specstream::qgemm::kLanes == 0 &&
        h.is_contiguous()) {
      return qlinear_add(x, wa[i], wb[i], wc.get(i), kinds[i] == kQ4 ? 4 : 8, &h);
    }
    return h + (*this)(i, x);
  }
};

// out = silu(gate) * up for n floats, n a multiple of 16, as ATen's AVX-512 kernels compute it: silu x / (1 + e^-x)
// with SLEEF's exp, stored, then the product.
__attribute__((target("avx512f,avx512dq"))) void silu_mul_avx512(const float* gate, const float* up, float* out,
                                                                  int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, Sleef_expf16_u10(_mm512_xor_ps(sign, g))));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(silu, _mm512_loadu_ps(up + i)));
  }
}

// MLP.forward's act(gate) * up from gate_up [T, 2n]: one loop, where it gives ATen's bits, i.e. where ATen runs its
// AVX-512 kernels, would not split the rows among threads (under GRAIN_SIZE elements) and has no scalar tail (n a
// multiple of two vectors). Elsewhere ATen's split, silu and mul, as the eager MLP runs them.
at::Tensor silu_mul(const at::Tensor& gate_up, int64_t n) {
  const int64_t T = gate_up.size(0);
  static const bool avx512 = at::get_cpu_capability() == "AVX512";  // ATEN_CPU_CAPABILITY may have lowered it
  const bool exact = avx512 && n % 32 == 0 &&
                     T * n < at::internal::GRAIN_SIZE && gate_up.is_contiguous() && gate_up.size(1) == 2 * n;
  if (!exact) {
    std::vector<at::Tensor> parts = gate_up.split(n, -1);
    return at::silu(parts[0]) * parts[1];
  }
  at::Tensor out = at::empty({T, n}, gate_up.options());
  const float* gu = gate_up.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) silu_mul_avx512(gu + t * 2 * n, gu + t * 2 * n + n, out.data_ptr<float>() + t * n, n);
  return out;
}

// Gemma's GeGLU from gate_up [T, 2n]: gelu_tanh(gate) * up, as MLP.forward runs it (ATen's ops on the same views).
at::Tensor gelu_mul(const at::Tensor& gate_up, int64_t n) {
  std::vector<at::Tensor> parts = gate_up.split(n, -1);
  return at::gelu(parts[0], "tanh") * parts[1];
}

// The MLP's activation of gate times up: engine.fused.decoder_step's codes.
constexpr int64_t kSilu = 0;
constexpr int64_t kGeluTanh = 1;

// SDPA over K and V in q's dtype: a bfloat16 arena's region widened first (exactly, as the kernels read it).
// engine.softcap_attention.softcapped_sdpa, op for op, so that the layers' SDPA routes and the step's round alike:
// scale, cap, mask, softmax in fp32, weights @ V; K and V repeated per GQA group as transformers' repeat_kv.
at::Tensor softcapped_sdpa(const at::Tensor& q, at::Tensor k, at::Tensor v, const std::optional<at::Tensor>& mask,
                           bool causal, std::optional<double> scale, double cap) {
  const int64_t groups = q.size(0) / k.size(0);
  if (groups > 1) {
    k = k.repeat_interleave(groups, 0);
    v = v.repeat_interleave(groups, 0);
  }
  const double by = scale.value_or(std::pow(static_cast<double>(q.size(-1)), -0.5));
  at::Tensor scores = at::matmul(q, k.transpose(-1, -2)) * by;
  scores = at::tanh(scores / cap) * cap;  // [Hq, q, kv]
  std::optional<at::Tensor> allowed = mask;
  if (causal) allowed = at::ones({q.size(-2), k.size(-2)}, q.options().dtype(at::kBool)).tril();
  if (allowed.has_value())
    scores = scores.masked_fill(allowed->logical_not(), -std::numeric_limits<double>::infinity());
  return at::matmul(at::softmax(scores, -1, at::kFloat).to(q.scalar_type()), v);
}

// softcap: Gemma 2's cap on the scores (none: SDPA's own attention).
at::Tensor sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
                bool causal, std::optional<double> scale, std::optional<double> softcap = std::nullopt) {
  if (softcap.has_value())
    return softcapped_sdpa(q, k.to(q.scalar_type()), v.to(q.scalar_type()), mask, causal, scale, *softcap);
  return at::scaled_dot_product_attention(q, k.to(q.scalar_type()), v.to(q.scalar_type()), mask, 0.0, causal, scale,
                                          /*enable_gqa=*/true);
}

specstream::KvType kv_type(const at::Tensor& kv) {
  return kv.scalar_type() == at::kBFloat16 ? specstream::KvType::kBFloat16 : specstream::KvType::kFloat;
}

// q [rows, Hq, D] (any row stride), k and v [Hkv, n, D] with n >= first_len + rows - 1 -> [rows, Hq, D]:
// row r attends positions [0, first_len + r), by the row kernel (decode-like rows: row_attention.h) or the chunk
// kernel (a prompt chunk's rows: chunk_attention.h).
at::Tensor attend_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t first_len, bool chunk,
                       double softcap) {
  const char* name = chunk ? "chunk_attention" : "row_attention";
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, name, ": q, k and v must be 3-d");
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == v.scalar_type() &&
                  (k.scalar_type() == at::kFloat || k.scalar_type() == at::kBFloat16),
              name, ": q fp32, k and v both fp32 or both bfloat16");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2), kv_heads = k.size(0);
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == dim, name, ": q's heads must be contiguous");
  TORCH_CHECK(k.stride(2) == 1 && k.stride(1) == dim && k.strides() == v.strides() && k.sizes() == v.sizes(),
              name, ": k and v must be [Hkv, n, D] with contiguous positions");
  TORCH_CHECK(heads % kv_heads == 0 && k.size(2) == dim, name, ": head counts or sizes do not match");
  TORCH_CHECK(first_len >= 1 && k.size(1) >= first_len + rows - 1, name, ": the region is too short");
  at::Tensor out = at::empty({rows, heads, dim}, q.options());
  const specstream::RowAttention a{q.data_ptr<float>(), q.stride(0), k.data_ptr(), v.data_ptr(), kv_type(k),
                                   k.stride(0), out.data_ptr<float>(), heads * dim, rows, first_len, heads, kv_heads,
                                   specstream::softmax_scale(dim), static_cast<float>(softcap)};
  const bool done = chunk ? specstream::chunk_attention({a}, dim) : specstream::row_attention(a, dim);
  TORCH_CHECK(done, name, ": no kernel for head size ", dim);
  return out;
}

// softcap > 0: the scores soft-capped (Gemma 2); 0: none.
at::Tensor row_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t first_len,
                         double softcap) {
  return attend_rows(q, k, v, first_len, false, softcap);
}

at::Tensor chunk_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t first_len,
                           double softcap) {
  return attend_rows(q, k, v, first_len, true, softcap);
}

// How a sequence's rows attend: engine.model.Route, decided by engine.model.attention_route.
enum Route : int64_t { kSdpa = 0, kSdpaRows = 1, kRowKernel = 2, kChunkKernel = 3 };

// Attention.forward's attention for every sequence of the step: q from qkv [T, q + 2 kv] (rotated), K and V from
// layer l of the arena kv [L, 2, Hkv, N, D], out [T, Hq * D]. The sequences on the row kernel in one parallel region,
// those on the chunk kernel in another, then SDPA's. The kernels take pointers: a step runs this once a layer, and
// the ATen views SDPA needs (a dozen a layer) are made only when a sequence takes SDPA. scale: Attention.scale (none:
// SDPA's 1 / sqrt(D), the kernels' only one); softcap: Gemma 2's cap on the scores, on every route (none: no cap).
at::Tensor attend(const at::Tensor& qkv, const at::Tensor& kv, int64_t l, at::IntArrayRef seqs,
                  const c10::List<std::optional<at::Tensor>>& masks, at::IntArrayRef routes, int64_t num_heads,
                  int64_t head_dim, std::optional<double> scale, std::optional<double> softcap) {
  const int64_t T = qkv.size(0), S = static_cast<int64_t>(masks.size()), q_size = num_heads * head_dim;
  TORCH_CHECK(static_cast<int64_t>(routes.size()) == S && static_cast<int64_t>(seqs.size()) == 4 * S,
              "attend: one route and four positions per sequence");
  auto views = [&] {  // (q_heads [Hq, T, D], k and v arenas [Hkv, N, D]) for SDPA
    return std::make_tuple(qkv.slice(1, 0, q_size).view({T, num_heads, head_dim}).transpose(0, 1), kv[l][0], kv[l][1]);
  };
  auto whole = [&](int64_t s, const at::Tensor& q_heads, const at::Tensor& k, const at::Tensor& v) {
    const int64_t q_start = seqs[4 * s], q_len = seqs[4 * s + 1], kv_start = seqs[4 * s + 2];
    const int64_t end = kv_start + seqs[4 * s + 3];
    const std::optional<at::Tensor> mask = masks.get(s);
    return sdpa(q_heads.slice(1, q_start, q_start + q_len), k.slice(1, kv_start, end), v.slice(1, kv_start, end),
                mask, !mask.has_value() && q_len > 1, scale, softcap);
  };
  if (S == 1 && routes[0] == kSdpa) {
    const auto [q_heads, k, v] = views();
    return whole(0, q_heads, k, v).transpose(0, 1).reshape({T, q_size});
  }
  at::Tensor out = at::empty({T, q_size}, qkv.options());
  std::vector<specstream::RowAttention> rows, chunks;  // writing straight into `out`
  const float kernel_scale = specstream::softmax_scale(head_dim);
  const float kernel_cap = static_cast<float>(softcap.value_or(0.0));
  const float* q = qkv.data_ptr<float>();
  const char* k = static_cast<const char*>(kv.data_ptr()) + l * kv.stride(0) * kv.element_size();
  const char* v = k + kv.stride(1) * kv.element_size();
  const int64_t kv_heads = kv.size(2), head_stride = kv.stride(2), position = kv.stride(3);
  const int64_t position_bytes = position * kv.element_size();
  bool any_sdpa = false;
  for (int64_t s = 0; s < S; ++s) {
    if (routes[s] != kRowKernel && routes[s] != kChunkKernel) {
      any_sdpa = true;
      continue;
    }
    const int64_t q_start = seqs[4 * s], q_len = seqs[4 * s + 1], kv_start = seqs[4 * s + 2];
    (routes[s] == kRowKernel ? rows : chunks)
        .push_back({q + q_start * qkv.stride(0), qkv.stride(0), k + kv_start * position_bytes,
                    v + kv_start * position_bytes, kv_type(kv), head_stride, out.data_ptr<float>() + q_start * q_size,
                    q_size, q_len, seqs[4 * s + 3] - q_len + 1, num_heads, kv_heads, kernel_scale, kernel_cap});
  }
  if (!rows.empty() || !chunks.empty()) {
    TORCH_CHECK(qkv.stride(1) == 1 && kv.stride(4) == 1 && position == head_dim,
                "attend: the row and chunk kernels need contiguous heads and positions");
    TORCH_CHECK(specstream::row_attention(rows, head_dim) && specstream::chunk_attention(chunks, head_dim),
                "attend: no row or chunk kernel for head size ", head_dim);
  }
  if (!any_sdpa) return out;
  const auto [q_heads, k_arena, v_arena] = views();
  at::Tensor out_heads = out.view({T, num_heads, head_dim}).transpose(0, 1);  // [Hq, T, D], writes land in `out`
  for (int64_t s = 0; s < S; ++s) {
    const int64_t q_start = seqs[4 * s], q_len = seqs[4 * s + 1], kv_start = seqs[4 * s + 2];
    if (routes[s] == kSdpa) {
      out_heads.slice(1, q_start, q_start + q_len).copy_(whole(s, q_heads, k_arena, v_arena));
    } else if (routes[s] == kSdpaRows) {
      const int64_t first_end = kv_start + seqs[4 * s + 3] - q_len + 1;  // row 0 sees the prefix and itself
      for (int64_t r = 0; r < q_len; ++r) {
        const int64_t row = q_start + r;
        out_heads.slice(1, row, row + 1)
            .copy_(sdpa(q_heads.slice(1, row, row + 1), k_arena.slice(1, kv_start, first_end + r),
                        v_arena.slice(1, kv_start, first_end + r), std::nullopt, false, scale, softcap));
      }
    }
  }
  return out;
}

bool qlinear_supported() { return specstream::qgemm::current_isa().load() != specstream::qgemm::Isa::kNone; }

// The instruction set qlinear runs ("avx512vnni", "avx2" or ""), after switching to `use` when given and runnable.
std::string qlinear_isa(const std::optional<std::string>& use) {
  namespace q = specstream::qgemm;
  TORCH_CHECK(!use.has_value() || q::use_isa(*use), "qlinear_isa: this CPU cannot run ", use.value_or(""));
  return q::isa_name(q::current_isa().load());
}

// x [..., n] fp32 -> [..., n]: RMSNorm with step_ops.h's fixed summation order (engine/fused/norm.py).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat, "rms_norm: fp32 tensors only");
  const int64_t n = weight.numel();
  TORCH_CHECK(x.size(-1) == n && weight.is_contiguous(), "rms_norm: the weight must be [", x.size(-1), "]");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty_like(xc);
  specstream::step_ops::rms_norm(xc.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), xc.numel() / n,
                                 n, static_cast<float>(eps));
  return y;
}

// The layer's norm over the last dimension: ours (fast_norm, engine/fused/norm.py installed it in the layers too) or
// ATen's.
at::Tensor norm(const at::Tensor& h, const at::Tensor& weight, double eps, bool fast_norm) {
  return fast_norm ? rms_norm(h, weight, eps) : at::rms_norm(h, {h.size(-1)}, weight, eps);
}

// Attention.forward's q/k norms (Qwen3's): heads [T, H, D], a view into qkv, normed per head in place.
void norm_heads(at::Tensor heads, const at::Tensor& weight, double eps, bool fast_norm) {
  heads.copy_(norm(heads, weight, eps, fast_norm));
}

// kv[l][0 / 1][:, slots[t]] = the K / V heads of row t of qkv [T, q + 2 kv] (index_copy_'s copies, in a loop); into
// a bfloat16 arena rounded to nearest even, as Tensor.to(torch.bfloat16) rounds (c10::BFloat16's own conversion).
template <typename KV>
void write_kv_as(const at::Tensor& qkv, int64_t q_size, const at::Tensor& kv, int64_t l, const at::Tensor& slots,
                 int64_t kv_heads, int64_t head_dim) {
  const int64_t T = qkv.size(0);
  const int64_t* slot = slots.data_ptr<int64_t>();
  const float* src = qkv.data_ptr<float>();
  KV* dst = static_cast<KV*>(kv.data_ptr()) + l * kv.stride(0);  // kv[l] without a view: a step makes 30 of these
  for (int64_t t = 0; t < T; ++t)
    for (int64_t which = 0; which < 2; ++which)
      for (int64_t h = 0; h < kv_heads; ++h) {
        const float* from = src + t * qkv.stride(0) + q_size + (which * kv_heads + h) * head_dim;
        KV* to = dst + which * kv.stride(1) + h * kv.stride(2) + slot[t] * kv.stride(3);
        if constexpr (std::is_same_v<KV, float>) std::memcpy(to, from, head_dim * sizeof(float));
        else for (int64_t d = 0; d < head_dim; ++d) to[d] = KV(from[d]);
      }
}

void write_kv(const at::Tensor& qkv, int64_t q_size, const at::Tensor& kv, int64_t l, const at::Tensor& slots,
              int64_t kv_heads, int64_t head_dim) {
  TORCH_CHECK(qkv.stride(1) == 1 && kv.stride(4) == 1, "write_kv: rows must have contiguous heads");
  if (kv.scalar_type() == at::kBFloat16) write_kv_as<c10::BFloat16>(qkv, q_size, kv, l, slots, kv_heads, head_dim);
  else write_kv_as<float>(qkv, q_size, kv, l, slots, kv_heads, head_dim);
}

// engine.lora.layers.LoRALinear: y[t, offsets[p] + c] += ((x[t] A_p[s]) B_p[s])[c] for every row t whose slot
// s = slots[t] is not 0, on each part p's weights a[p] [n_slots, max_rank, in] (A transposed), b[p] [n_slots,
// max_rank, size] and ranks[p] [n_slots] (lora_delta.h: a row's bits whatever the batch).
void lora_add_(const at::Tensor& y, const at::Tensor& x, const at::Tensor& slots, at::TensorList a, at::TensorList b,
               at::TensorList ranks, at::IntArrayRef offsets) {
  const int64_t T = x.size(0), in = x.size(1), parts = static_cast<int64_t>(offsets.size());
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.is_contiguous() && y.scalar_type() == at::kFloat && y.dim() == 2 &&
                  y.size(0) == T && y.stride(1) == 1, "lora_add_: x [T, in] contiguous and y [T, out] fp32 rows");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == T,
              "lora_add_: slots must be [T] int64");
  TORCH_CHECK(static_cast<int64_t>(a.size()) == parts && static_cast<int64_t>(b.size()) == parts &&
                  static_cast<int64_t>(ranks.size()) == parts, "lora_add_: a, b, ranks and offsets differ in length");
  std::vector<specstream::lora::Part> ps;
  int64_t max_rank = 1;
  for (int64_t p = 0; p < parts; ++p) {
    const at::Tensor &ap = a[p], &bp = b[p], &rp = ranks[p];
    TORCH_CHECK(ap.scalar_type() == at::kFloat && ap.is_contiguous() && ap.dim() == 3 && ap.size(2) == in &&
                    ap.size(0) == a[0].size(0) && bp.scalar_type() == at::kFloat && bp.is_contiguous() &&
                    bp.dim() == 3 && bp.size(0) == ap.size(0) && bp.size(1) == ap.size(1),
                "lora_add_: part ", p, "'s a [n_slots, max_rank, in] and b [n_slots, max_rank, size] do not fit x");
    TORCH_CHECK(rp.scalar_type() == at::kLong && rp.is_contiguous() && rp.numel() == ap.size(0) &&
                    offsets[p] >= 0 && offsets[p] + bp.size(2) <= y.size(1),
                "lora_add_: part ", p, "'s ranks [n_slots] int64 or columns do not fit y");
    for (int64_t s = 0; s < rp.numel(); ++s) {
      const int64_t r = rp.data_ptr<int64_t>()[s];
      TORCH_CHECK(r >= 0 && r <= ap.size(1), "lora_add_: part ", p, ", slot ", s, ": rank ", r, " past max_rank");
    }
    ps.push_back({ap.data_ptr<float>(), bp.data_ptr<float>(), rp.data_ptr<int64_t>(), ap.size(1), bp.size(2),
                  offsets[p]});
    max_rank = std::max(max_rank, ap.size(1));
  }
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(sp[t] >= 0 && (parts == 0 || sp[t] < a[0].size(0)), "lora_add_: row ", t, "'s slot is out of range");
  }
  const specstream::lora::Rows rows{y.data_ptr<float>(), y.stride(0), x.data_ptr<float>(), in, sp};
  specstream::lora::add_delta(rows, ps, T, max_rank);
}

}  // namespace

// One attention plan of a step (engine.model.Attention.plan): per piece of a sequence (q_start, q_len, kv_start,
// kv_len), its mask (none: a decode or a whole sequence) and its route (engine.model.Route).
struct Plan {
  at::IntArrayRef seqs;
  const c10::List<std::optional<at::Tensor>>& masks;
  at::IntArrayRef routes;
};

// h [T, hidden] fp32 (the embedded rows); cos, sin_rot [T, 1, D] (RopeStep); slots [T] int64 arena slots;
// kv [L, 2, Hkv, N, D] the arena. norms: per layer its input and post-attention norms (Gemma's sandwich: input,
// post-attention, pre- and post-feedforward), then the final one; qk_norms: q's and k's per layer, or none. Per
// linear (4 a layer: qkv, o, gate_up, down): wa, wb (, wc) its kernel's tensors, wide its bf16 copy (None: none),
// biases its bias (None: none), kinds, groups (int4), outs, max_quant_rows (the widest step on the quantized kernel),
// windows (bf16 rows per call). seqs, masks, routes: the global layers' attention plan; prompt: some sequence's rows
// are a prompt chunk. attn_scale: SDPA's softmax scale (Gemma's query_pre_attn_scalar ** -0.5; none: 1 / sqrt(D));
// attn_softcap: Gemma 2's cap on the attention scores (none: no cap).
// act: kSilu or kGeluTanh. local_layers: 1 for each sliding-window layer (or empty), which
// attend by the local plan (seqs_local, masks_local, routes_local) and rotate by cos_local, sin_local where given.
at::Tensor decoder_step(at::Tensor h, const at::Tensor& cos, const at::Tensor& sin_rot, const at::Tensor& slots,
                        at::Tensor kv, at::TensorList norms, at::TensorList qk_norms, at::TensorList wa,
                        at::TensorList wb, const c10::List<std::optional<at::Tensor>>& wc,
                        const c10::List<std::optional<at::Tensor>>& wide,
                        const c10::List<std::optional<at::Tensor>>& biases,
                        at::IntArrayRef kinds, at::IntArrayRef groups, at::IntArrayRef outs,
                        at::IntArrayRef max_quant_rows, at::IntArrayRef windows, at::IntArrayRef seqs,
                        const c10::List<std::optional<at::Tensor>>& masks, at::IntArrayRef routes, bool prompt,
                        bool fast_norm, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                        int64_t intermediate, double eps, std::optional<double> attn_scale, bool sandwich,
                        int64_t act, at::IntArrayRef local_layers,
                        const std::optional<at::Tensor>& cos_local, const std::optional<at::Tensor>& sin_local,
                        at::IntArrayRef seqs_local, const c10::List<std::optional<at::Tensor>>& masks_local,
                        at::IntArrayRef routes_local, std::optional<double> attn_softcap) {
  const Linears linear{wa, wb, wc, wide, biases, kinds, groups, outs, max_quant_rows, windows, prompt};
  const int64_t T = h.size(0), L = kv.size(0), per_layer = sandwich ? 4 : 2;
  const int64_t q_size = num_heads * head_dim, kv_size = num_kv_heads * head_dim;
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == per_layer * L + 1, "decoder_step: ", per_layer * L + 1,
              " norms expected, got ", norms.size());
  TORCH_CHECK(local_layers.empty() || static_cast<int64_t>(local_layers.size()) == L,
              "decoder_step: local_layers must be empty or one per layer");
  TORCH_CHECK(act == kSilu || act == kGeluTanh, "decoder_step: act must be 0 (SiLU) or 1 (GELU, tanh)");
  const at::Tensor cos_rows = cos.contiguous(), sin_rows = sin_rot.contiguous(), slot_ids = slots.contiguous();
  const at::Tensor cos_l = cos_local.has_value() ? cos_local->contiguous() : cos_rows;
  const at::Tensor sin_l = sin_local.has_value() ? sin_local->contiguous() : sin_rows;
  const Plan global{seqs, masks, routes}, local{seqs_local, masks_local, routes_local};
  auto act_mul = [&](const at::Tensor& gate_up) {
    return act == kSilu ? silu_mul(gate_up, intermediate) : gelu_mul(gate_up, intermediate);
  };
  for (int64_t l = 0; l < L; ++l) {
    const int64_t i = 4 * l, n = per_layer * l;
    const bool windowed = !local_layers.empty() && local_layers[l] != 0;
    at::Tensor x = norm(h, norms[n], eps, fast_norm);
    at::Tensor qkv = linear(i, x).contiguous();  // [T, q + 2 kv]
    TORCH_CHECK(qkv.size(1) == q_size + 2 * kv_size, "decoder_step: the qkv linear gave ", qkv.size(1), " columns");
    if (!qk_norms.empty()) {
      norm_heads(qkv.slice(1, 0, q_size).view({T, num_heads, head_dim}), qk_norms[2 * l], eps, fast_norm);
      norm_heads(qkv.slice(1, q_size, q_size + kv_size).view({T, num_kv_heads, head_dim}), qk_norms[2 * l + 1], eps,
                 fast_norm);
    }
    // engine.rotary.apply_rotary_ on q and k
    const at::Tensor& c = windowed ? cos_l : cos_rows;
    const at::Tensor& sr = windowed ? sin_l : sin_rows;
    specstream::step_ops::rotary(qkv.data_ptr<float>(), qkv.stride(0), T, num_heads + num_kv_heads, head_dim,
                                 c.data_ptr<float>(), sr.data_ptr<float>());
    write_kv(qkv, q_size, kv, l, slot_ids, num_kv_heads, head_dim);
    const Plan& plan = windowed ? local : global;
    at::Tensor attn = attend(qkv, kv, l, plan.seqs, plan.masks, plan.routes, num_heads, head_dim, attn_scale,
                             attn_softcap);
    if (sandwich) {  // engine.gemma.SandwichDecoderLayer
      h = h + norm(linear(i + 1, attn), norms[n + 1], eps, fast_norm);
      x = norm(h, norms[n + 2], eps, fast_norm);
      h = h + norm(linear(i + 3, act_mul(linear(i + 2, x))), norms[n + 3], eps, fast_norm);
      continue;
    }
    h = linear.add(i + 1, attn, h);
    x = norm(h, norms[n + 1], eps, fast_norm);
    h = linear.add(i + 3, act_mul(linear(i + 2, x)), h);
  }
  return norm(h, norms[per_layer * L], eps, fast_norm);
}

TORCH_LIBRARY(specstream, m) {
  m.def(
      "decoder_step(Tensor h, Tensor cos, Tensor sin_rot, Tensor slots, Tensor kv, Tensor[] norms, Tensor[] qk_norms, "
      "Tensor[] wa, Tensor[] wb, Tensor?[] wc, Tensor?[] wide, Tensor?[] biases, int[] kinds, int[] groups, int[] outs, int[] max_quant_rows, "
      "int[] windows, int[] seqs, Tensor?[] masks, int[] routes, bool prompt, bool fast_norm, "
      "int num_heads, int num_kv_heads, int head_dim, int intermediate, float eps, float? attn_scale, bool sandwich, "
      "int act, "
      "int[] local_layers, Tensor? cos_local, Tensor? sin_local, int[] seqs_local, Tensor?[] masks_local, "
      "int[] routes_local, float? attn_softcap=None) -> Tensor",
      &decoder_step);
  m.def("row_attention(Tensor q, Tensor k, Tensor v, int first_len, float softcap=0.0) -> Tensor", &row_attention);
  m.def("chunk_attention(Tensor q, Tensor k, Tensor v, int first_len, float softcap=0.0) -> Tensor",
        &chunk_attention);
  m.def("qlinear(Tensor x, Tensor codes, Tensor scales, Tensor? mins, int bits) -> Tensor", &qlinear);
  m.def("qlinear_supported() -> bool", &qlinear_supported);
  m.def("qlinear_isa(str? use=None) -> str", &qlinear_isa);
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor", &rms_norm);
  m.def("silu_mul(Tensor gate_up, int n) -> Tensor", &silu_mul);
  m.def("lora_add_(Tensor(a!) y, Tensor x, Tensor slots, Tensor[] a, Tensor[] b, Tensor[] ranks, int[] offsets) -> ()",
        &lora_add_);
}
