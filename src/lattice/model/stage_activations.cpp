// StageActivations: see stage_activations.hpp.
#include "lattice/model/stage_activations.hpp"

namespace lattice::model {

void HeadActivations::release() {
  for (Tensor* t : {&normed, &norm_mean, &norm_rstd, &normed16, &logits, &d_logits16,
                    &grad_partials, &d_normed, &d_normed_local})
    t->reset();
  logits_grad_bf16 = false;
  backward_in_forward = false;
}

void StageActivations::release() {
  for (auto& block : blocks) block->release();
  residual.clear();
  head.release();
  tokens.reset();
  targets.reset();
  d_residual.reset();
  gradient_ready = false;
  weight_gradients_pending = false;
}

const int32_t* stage_ids(Tensor& ids, const int32_t* host_ids, int64_t count,
                         DeviceMemory& memory) {
  if (ids.numel() != count || ids.dtype() != DType::i32 || &ids.memory() != &memory)
    ids = Tensor({count}, DType::i32, memory);
  memory.copy(ids.raw(), host_ids, ids.nbytes(), CopyKind::host_to_device);
  return static_cast<const int32_t*>(ids.raw());
}

}  // namespace lattice::model
