// TiedEmbedding: see tied_embedding.hpp.
#include "lattice/parallel/pipeline/tied_embedding.hpp"

#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"

namespace lattice::pipeline {

namespace {
constexpr int kTiedTag = (1 << 30) + (1 << 29);  // apart from the executor's tags
}

TiedEmbedding::TiedEmbedding(const Schedule& schedule, comm::Communicator& pp,
                             model::Transformer* first, model::Transformer* last)
    : pp_(pp),
      first_owner_(schedule.stage_owner.front()),
      last_owner_(schedule.stage_owner.back()) {
  const model::Transformer* any = first ? first : last;
  if (any == nullptr || !any->config().tied_embeddings || schedule.num_stages() == 1) return;
  first_ = first;
  last_ = last;
  if (first_) first_index_ = first_->token_embedding_weight();
  if (last_) {
    last_index_ = last_->head().weight();
    check(last_->parameters().info(last_index_).is_copy(),
          "tied embeddings: the last stage's head weight is not a copy of the embedding "
          "(internal error)");
  }
}

void TiedEmbedding::sum_gradients() {
  if (!active()) return;
  if (first_ && last_) {  // one rank holds both stages (the V schedule's rank 0)
    const int64_t n = first_->parameters().info(first_index_).numel;
    check(n == last_->parameters().info(last_index_).numel,
          "tied embeddings: the embedding and its copy differ in size (internal error)");
    float* e = first_->parameters().grad(first_index_);
    float* h = last_->parameters().grad(last_index_);
    for (int64_t i = 0; i < n; ++i) h[i] = e[i] = e[i] + h[i];
    return;
  }
  model::Transformer& mine = first_ ? *first_ : *last_;
  const int index = first_ ? first_index_ : last_index_;
  const int peer = first_ ? last_owner_ : first_owner_;
  const int64_t n = mine.parameters().info(index).numel;
  float* g = mine.parameters().grad(index);
  std::vector<float> theirs(static_cast<size_t>(n));
  comm::CommHandle sent = pp_.isend(g, n, DType::f32, peer, kTiedTag);
  try {
    pp_.recv(theirs.data(), n, DType::f32, peer, kTiedTag);
  } catch (const Error& e) {
    throw Error("pipeline rank " + std::to_string(pp_.rank()) +
                " waited in vain for the tied embedding's gradient from rank " +
                std::to_string(peer) + ": " + e.what());
  }
  sent.wait();  // it reads g, which is written next
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] + theirs[static_cast<size_t>(i)];
}

}  // namespace lattice::pipeline
