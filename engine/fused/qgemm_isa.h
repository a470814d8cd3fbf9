// Which instruction set runs qgemm: AVX-512 VNNI (qgemm.h) where the CPU has it, else AVX2 (qgemm_avx2.h), else
// none (engine/quant/vnni.py then keeps torch's kernels). Chosen once per process; a CPU with both may be told to
// run AVX2, so that tests can compare the two bit for bit.
#pragma once

#include <atomic>
#include <string>

#include "qgemm.h"
#include "qgemm_avx2.h"

namespace specstream::qgemm {

enum class Isa : int { kNone = 0, kAvx2 = 1, kAvx512Vnni = 2 };

inline Isa best_isa() {
  if (supported()) return Isa::kAvx512Vnni;
  return avx2_supported() ? Isa::kAvx2 : Isa::kNone;
}

inline std::atomic<Isa>& current_isa() {
  static std::atomic<Isa> isa{best_isa()};
  return isa;
}

inline std::string isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return "avx512vnni";
    case Isa::kAvx2: return "avx2";
    default: return "";
  }
}

// Use `name` ("avx512vnni" or "avx2") if this CPU runs it; false (and no change) otherwise.
inline bool use_isa(const std::string& name) {
  const bool runs = name == "avx512vnni" ? supported() : name == "avx2" && avx2_supported();
  if (runs) current_isa().store(name == "avx2" ? Isa::kAvx2 : Isa::kAvx512Vnni);
  return runs;
}

inline void quantize_row_isa(const float* x, int64_t in, int8_t* codes, float* d, int32_t* sums, int32_t* lo_sums,
                             float* dsums) {
  if (current_isa().load() == Isa::kAvx512Vnni) {
    quantize_row(x, in, codes, d, sums, lo_sums, dsums);
  } else {
    quantize_row_avx2(x, in, codes, d, sums, lo_sums, dsums);
  }
}

inline void linear_isa(const QuantWeights& w, const QuantRows& a, const Outputs& o) {
  if (current_isa().load() == Isa::kAvx512Vnni) {
    linear(w, a, o);
  } else {
    linear_avx2(w, a, o);
  }
}

}  // namespace specstream::qgemm
