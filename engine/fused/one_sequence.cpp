// One sequence's decoder layers in one call: the batch-1 decode (1 row) or the verification of its drafts
// (1 + k rows, each attending like a decode), for a CPU model whose linears are int4 or int8 weight-only
// kernels (engine/quant/linear.py). Why C++: at batch 1 the eager step spent as long in Python and in
// dispatching ~5,500 small ops as in its linears (docs/benchmarks.md, issue 17). The ops below are exactly
// the eager path's (engine/model.py, engine/rotary.py, engine/quant/linear.py), in the same order and on
// the same views, so every row gets the same bits: only the Python between them is gone.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

namespace {

constexpr int64_t kInt4 = 0;
constexpr int64_t kInt8 = 1;

// One weight-only linear: x [T, in] fp32 -> [T, out] fp32 (bf16 activations for the kernel, as QuantizedLinear).
at::Tensor linear(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, int64_t kind, int64_t group,
                  int64_t out_features) {
  at::Tensor xb = x.to(at::kBFloat16);
  at::Tensor y;
  if (kind == kInt4) {
    y = at::_weight_int4pack_mm_for_cpu(xb, a, group, b);
    if (y.size(1) != out_features) y = y.slice(1, 0, out_features);
  } else {
    y = at::_weight_int8pack_mm(xb, a, b);
  }
  return y.to(x.dtype());
}

}  // namespace

// h [T, hidden] fp32 (the embedded rows); cos, sin_rot [T, 1, D] (RopeStep); slots [T] int64 arena slots;
// kv [L, 2, Hkv, N, D] the arena; norms: 2 per layer (input, post-attention) then the final one;
// wa, wb: 4 linears per layer (qkv, o, gate_up, down), the kernel's two tensors each; kinds, groups, outs: per
// linear; kv_start: the sequence's slot of position 0; kv_len: positions held once this step's rows are written.
at::Tensor one_sequence(at::Tensor h, const at::Tensor& cos, const at::Tensor& sin_rot, const at::Tensor& slots,
                        at::Tensor kv, at::TensorList norms, at::TensorList wa, at::TensorList wb,
                        at::IntArrayRef kinds, at::IntArrayRef groups, at::IntArrayRef outs, int64_t num_heads,
                        int64_t num_kv_heads, int64_t head_dim, int64_t intermediate, double eps, int64_t kv_start,
                        int64_t kv_len) {
  const int64_t T = h.size(0);
  const int64_t L = kv.size(0);
  const int64_t q_size = num_heads * head_dim;
  const int64_t hidden = h.size(1);
  for (int64_t l = 0; l < L; ++l) {
    const int64_t i = 4 * l;
    // Attention (Attention.forward).
    at::Tensor x = at::rms_norm(h, {hidden}, norms[2 * l], eps);
    at::Tensor qkv = linear(x, wa[i], wb[i], kinds[i], groups[i], outs[i]);  // [T, q + 2 kv]
    at::Tensor qk = qkv.slice(1, 0, q_size + num_kv_heads * head_dim).view({T, num_heads + num_kv_heads, head_dim});
    at::Tensor swapped = qk.unflatten(-1, {2, -1}).flip({-2}).flatten(-2);  // apply_rotary_
    at::add_out(qk, qk * cos, swapped.mul_(sin_rot));
    kv[l].index_copy_(2, slots, qkv.slice(1, q_size).view({T, 2, num_kv_heads, head_dim}).permute({1, 2, 0, 3}));
    at::Tensor k_arena = kv[l][0], v_arena = kv[l][1];                       // [Hkv, N, D]
    at::Tensor q_heads = qk.slice(1, 0, num_heads).transpose(0, 1);          // [Hq, T, D]
    at::Tensor attn_out;
    if (T == 1) {
      attn_out = at::scaled_dot_product_attention(q_heads.slice(1, 0, 1), k_arena.slice(1, kv_start, kv_start + kv_len),
                                                  v_arena.slice(1, kv_start, kv_start + kv_len), {}, 0.0, false,
                                                  std::nullopt, true)
                     .transpose(0, 1)
                     .reshape({T, q_size});
    } else {  // Attention._rows_as_decodes
      at::Tensor out = qkv.new_empty({T, num_heads, head_dim});
      at::Tensor out_heads = out.transpose(0, 1);
      const int64_t first_end = kv_start + kv_len - T + 1;
      for (int64_t r = 0; r < T; ++r) {
        out_heads.slice(1, r, r + 1).copy_(at::scaled_dot_product_attention(
            q_heads.slice(1, r, r + 1), k_arena.slice(1, kv_start, first_end + r),
            v_arena.slice(1, kv_start, first_end + r), {}, 0.0, false, std::nullopt, true));
      }
      attn_out = out.view({T, q_size});
    }
    h = h + linear(attn_out, wa[i + 1], wb[i + 1], kinds[i + 1], groups[i + 1], outs[i + 1]);
    // MLP.
    x = at::rms_norm(h, {hidden}, norms[2 * l + 1], eps);
    at::Tensor gate_up = linear(x, wa[i + 2], wb[i + 2], kinds[i + 2], groups[i + 2], outs[i + 2]);
    std::vector<at::Tensor> parts = gate_up.split(intermediate, -1);
    h = h + linear(at::silu(parts[0]) * parts[1], wa[i + 3], wb[i + 3], kinds[i + 3], groups[i + 3], outs[i + 3]);
  }
  return at::rms_norm(h, {hidden}, norms[2 * L], eps);
}

TORCH_LIBRARY(specstream, m) {
  m.def(
      "one_sequence(Tensor h, Tensor cos, Tensor sin_rot, Tensor slots, Tensor kv, Tensor[] norms, Tensor[] wa, "
      "Tensor[] wb, int[] kinds, int[] groups, int[] outs, int num_heads, int num_kv_heads, int head_dim, "
      "int intermediate, float eps, int kv_start, int kv_len) -> Tensor",
      &one_sequence);
}
