// MatmulEngine's fused LM head and cross-entropy on amx_vocab_blocked_head.hpp's kernel
// (matmul.hpp: head_cross_entropy_vocab_blocked), the threads taking contiguous runs of rows in
// passes.
#include <omp.h>

#include <algorithm>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/amx_packed_gemm.hpp"
#include "lattice/kernels/cpu/amx_vocab_blocked_head.hpp"
#include "lattice/kernels/cpu/matmul_engine.hpp"

namespace lattice::kernels {

bool MatmulEngine::vocab_blocked_head_applies(int64_t K) {
  static const bool amx_kernels = MatmulOptions::from_environment().amx_kernels;
  return amx_kernels && amx_packed_gemm_enabled() && vocab_blocked_head_rows_per_pass(K) > 0;
}

bool MatmulEngine::uses_vocab_blocked_head(int64_t K) const {
  return impl_->amx && vocab_blocked_head_rows_per_pass(K) > 0;
}

int MatmulEngine::vocab_blocked_lanes(int64_t M) {
  // At least 256 rows per lane: fewer would re-read the head weight for little work.
  return static_cast<int>(std::clamp<int64_t>(M / 256, 1, omp_get_max_threads()));
}

void MatmulEngine::head_cross_entropy_vocab_blocked(const lattice::bf16* in16, WeightOperand weight,
                                                    int64_t M, int64_t K, int64_t V,
                                                    const int32_t* targets, float grad_scale,
                                                    double* row_losses, float* d_in,
                                                    float* weight_grad_partials, int lanes) {
  check(M > 0 && V > 0 && amx_packed_gemm_enabled() && vocab_blocked_head_rows_per_pass(K) > 0,
        "matmul head_cross_entropy_vocab_blocked: needs M, V > 0, AMX and a width the kernel takes "
        "(vocab_blocked_head_applies), got M=" +
            std::to_string(M) + " K=" + std::to_string(K) + " V=" + std::to_string(V));
  check(lanes == vocab_blocked_lanes(M),
        "matmul head_cross_entropy_vocab_blocked: lanes must be vocab_blocked_lanes(M) (" +
            std::to_string(vocab_blocked_lanes(M)) + "), got " + std::to_string(lanes));
  const lattice::bf16* weight16 = impl_->rounded_weight(weight, V, K);  // rounded once
  const auto packed_bytes =
      static_cast<size_t>(vocab_blocked_head_packed_elements(V, K)) * sizeof(uint16_t);
  // The weight's rows are read in place where V is a multiple of 32 (no forward copy).
  auto* forward_copy = V % 32 != 0
                           ? static_cast<uint16_t*>(impl_->packed_weights[0].reserve(packed_bytes))
                           : nullptr;
  auto* backward = static_cast<uint16_t*>(impl_->packed_weights[1].reserve(packed_bytes));
  const uint16_t* forward = pack_vocab_blocked_head(forward_copy, backward, weight16, V, K);
  const int64_t pass_rows = vocab_blocked_head_rows_per_pass(K);
  impl_->reserve_thread_buffers(lanes, 0, 0, vocab_blocked_head_scratch_bytes(pass_rows, K, V));
  ChunkFailure failure;
#pragma omp parallel num_threads(lanes)
  {
    void* scratch = impl_->thread_scratchpads[static_cast<size_t>(omp_get_thread_num())].reserve(0);
    for (int lane = omp_get_thread_num(); lane < lanes; lane += omp_get_num_threads()) {
      const int64_t first = M * lane / lanes, stop = M * (lane + 1) / lanes;
      float* partial = weight_grad_partials + static_cast<int64_t>(lane) * V * K;
      for (int64_t begin = first; begin < stop; begin += pass_rows) {
        failure.run([&] {
          vocab_blocked_head_pass(row_losses + begin, d_in + begin * K, partial, begin == first,
                                  in16 + begin * K, targets + begin,
                                  std::min(pass_rows, stop - begin), K, V, grad_scale, forward,
                                  backward, scratch);
        });
      }
    }
  }
  failure.rethrow();
}

}  // namespace lattice::kernels
