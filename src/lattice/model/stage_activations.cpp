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
  d_residual.reset();
  gradient_ready = false;
  weight_gradients_pending = false;
}

}  // namespace lattice::model
