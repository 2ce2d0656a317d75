// Where MatmulEngine's bf16 products run off Lattice's AMX kernels (Bf16FallbackGemm): what oneDNN
// builds on this CPU, the engine's choice, and the phrase run banners print.
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/matmul_engine.hpp"

namespace lattice::kernels {
namespace matmul_detail {

// Whether oneDNN's bf16 GEMMs run on AMX here: its effective ISA (a bit mask that contains the
// lower ISAs) includes avx512_core_amx.
bool onednn_has_amx() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto amx = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_amx);
  return (isa & amx) == amx;
}

// Whether oneDNN builds bf16 matmul primitives on this CPU at all: oneDNN 2.6 has them from
// AVX-512 (avx512_core) up and none below, so on an AVX2-only CPU (AMD Zen 3), or under
// ONEDNN_MAX_CPU_ISA=AVX2, creating one fails ("could not create a primitive descriptor
// iterator"). Probed once on a small shape; oneDNN fixes its ISA at first use, so the answer holds
// for the process.
bool onednn_builds_bf16_gemms() {
  static const bool builds = [] {
    try {
      const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
      using dt = dnnl::memory::data_type;
      const dnnl::memory::desc a({32, 32}, dt::bf16, {32, 1}), b({32, 32}, dt::bf16, {32, 1});
      const dnnl::memory::desc c({32, 32}, dt::f32, {32, 1});
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine);
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return builds;
}

namespace {

// A request for oneDNN's bf16 matmul, refused with the fix where oneDNN has none.
Bf16FallbackGemm checked_bf16_fallback(Bf16FallbackGemm chosen, const std::string& source) {
  if (chosen == Bf16FallbackGemm::onednn_bf16 && !onednn_builds_bf16_gemms())
    throw Error("matmul: " + source +
                " asks for oneDNN's bf16 matmul, which oneDNN builds only on CPUs with AVX-512 "
                "(not on this one, or not under this ONEDNN_MAX_CPU_ISA): use the widened fp32 "
                "fallback (LATTICE_MATMUL_BF16_FALLBACK=fp32, Bf16FallbackGemm::widened_fp32) "
                "or the automatic choice");
  return chosen;
}

}  // namespace

// The engine's bf16 fallback: the requested one, or for automatic oneDNN's bf16 matmul where
// oneDNN has AMX (oneDNN's AMX implies its bf16 primitives; checked anyway, so automatic never
// picks a path that cannot run) and the widened fp32 one elsewhere.
Bf16FallbackGemm resolve_bf16_fallback(Bf16FallbackGemm requested) {
  if (requested != Bf16FallbackGemm::automatic)
    return checked_bf16_fallback(requested, "Bf16FallbackGemm::onednn_bf16");
  return onednn_has_amx() && onednn_builds_bf16_gemms() ? Bf16FallbackGemm::onednn_bf16
                                                        : Bf16FallbackGemm::widened_fp32;
}

}  // namespace matmul_detail

bool MatmulEngine::onednn_bf16_available() {
  return onednn_builds_bf16_gemms();
}

Bf16FallbackGemm MatmulEngine::bf16_fallback() const {
  return impl_->widen_bf16 ? Bf16FallbackGemm::widened_fp32 : Bf16FallbackGemm::onednn_bf16;
}

bool MatmulEngine::bf16_on_fp32_units() const {
  return impl_->widen_bf16 && !impl_->amx;
}

std::string MatmulEngine::bf16_gemms() const {
  const bool amx = onednn_has_amx();
  if (bf16_on_fp32_units())
    return amx ? "bf16 GEMMs on fp32 units (operands widened: LATTICE_MATMUL_BF16_FALLBACK=fp32)"
               : "bf16 GEMMs on fp32 units (operands widened: oneDNN finds no AMX on this CPU)";
  if (impl_->widen_bf16)
    return "bf16 GEMMs on Lattice's AMX kernels where they apply, else widened to fp32 "
           "(LATTICE_MATMUL_BF16_FALLBACK=fp32)";
  if (impl_->amx) return "bf16 GEMMs on AMX (Lattice's kernels and oneDNN)";
  return amx ? "bf16 GEMMs on oneDNN's AMX matmul"
             : "bf16 GEMMs on oneDNN's AVX512-BF16 matmul (no AMX on this CPU; "
               "LATTICE_MATMUL_BF16_FALLBACK=onednn)";
}

}  // namespace lattice::kernels
