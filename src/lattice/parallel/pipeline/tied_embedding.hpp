// TiedEmbedding: tied input and output embeddings across pipeline stages. The first stage holds
// the token embedding and the last stage a copy of it as its head weight (ParameterInfo::is_copy;
// both start from the same values). After each step's backward the two gradients are summed —
// each owner sends its own to the other and adds what it receives, so both hold the same sum
// bit for bit (IEEE addition commutes) — and the two copies take the same optimizer step and
// stay equal, as Megatron's embedding group does. Under tensor parallelism each tp rank sums its
// vocabulary slice with the same tp rank of the other stage (the pipeline group is per tp rank).
#pragma once

#include "lattice/model/transformer.hpp"
#include "lattice/parallel/pipeline/schedule.hpp"

namespace lattice::comm {
class Communicator;
}

namespace lattice::pipeline {

class TiedEmbedding {
 public:
  // `first`: this rank's model of virtual stage 0 (null if another rank holds it); `last`: of the
  // last virtual stage (likewise). Inactive when the model's embeddings are untied or one stage
  // holds the whole model (its head reads the embedding itself).
  TiedEmbedding(const Schedule& schedule, comm::Communicator& pp, model::Transformer* first,
                model::Transformer* last);

  // True when this rank takes part: it holds the first or the last stage of a tied model split
  // over several stages.
  bool active() const { return first_ != nullptr || last_ != nullptr; }
  // The parameter units whose gradients are completed by sum_gradients(): the embedding's on the
  // first stage, the head's on the last (-1 where this rank holds no such stage).
  int first_stage_unit() const { return first_ ? 0 : -1; }
  int last_stage_unit() const { return last_ ? static_cast<int>(last_->units().size()) - 1 : -1; }

  // Sums the two gradients into both (point-to-point between the two owners, or in place when
  // one rank holds both stages). Call after the step's backward, before reducing the gradients.
  void sum_gradients();

 private:
  comm::Communicator& pp_;
  model::Transformer* first_ = nullptr;  // null when inactive or held elsewhere
  model::Transformer* last_ = nullptr;
  int first_owner_ = 0, last_owner_ = 0;
  int first_index_ = -1, last_index_ = -1;  // the parameters in the two stores
};

}  // namespace lattice::pipeline
