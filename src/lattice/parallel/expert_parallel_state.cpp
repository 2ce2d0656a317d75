// Expert-parallel state as one whole model: see expert_parallel_state.hpp.
#include "lattice/parallel/expert_parallel_state.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/parallel/tensor_parallel_state.hpp"

namespace lattice::parallel {

namespace {

constexpr int kExpertTag = 0x4550;  // "EP"

}  // namespace

bool is_expert_parallel_slice(const model::ParameterInfo& info) {
  return !info.replicated.contains(mesh::Axis::ep);
}

void gather_experts(const model::ParameterStore& local, const float* local_flat,
                    const model::ParameterStore& whole, float* whole_flat, comm::Communicator& ep) {
  // Each rank's experts, in store order: their names (one '\n'-separated list) and values.
  std::string names;
  std::vector<const model::ParameterInfo*> experts;
  for (const model::ParameterInfo& p : local.parameters())
    if (is_expert_parallel_slice(p)) {
      names += p.name + "\n";
      experts.push_back(&p);
    }
  if (ep.rank() != 0) {
    const int64_t length = static_cast<int64_t>(names.size());
    ep.send(&length, 1, DType::i64, 0, kExpertTag);
    ep.send(names.data(), length, DType::u8, 0, kExpertTag);
    for (const model::ParameterInfo* p : experts)
      ep.send(local_flat + p->offset, p->numel, DType::f32, 0, kExpertTag);
    return;
  }
  std::vector<bool> filled(whole.parameters().size(), false);
  auto place = [&](const std::string& name, const float* values, int64_t numel) {
    const int index = whole.index_of(name);  // throws naming a parameter `whole` lacks
    const model::ParameterInfo& target = whole.info(index);
    check(target.numel == numel, "parameter '" + name + "' holds " + std::to_string(numel) +
                                     " elements on its expert-parallel rank but " +
                                     std::to_string(target.numel) +
                                     " in the whole model (internal error)");
    std::memcpy(whole_flat + target.offset, values, sizeof(float) * static_cast<size_t>(numel));
    filled[static_cast<size_t>(index)] = true;
  };
  for (const model::ParameterInfo& p : local.parameters())
    place(p.name, local_flat + p.offset, p.numel);
  std::vector<float> received;
  for (int r = 1; r < ep.size(); ++r) {
    int64_t length = 0;
    ep.recv(&length, 1, DType::i64, r, kExpertTag);
    std::string theirs(static_cast<size_t>(length), '\0');
    ep.recv(theirs.data(), length, DType::u8, r, kExpertTag);
    for (size_t at = 0; at < theirs.size();) {
      const size_t end = theirs.find('\n', at);
      const std::string name = theirs.substr(at, end - at);
      at = end + 1;
      const int64_t numel = whole.info(whole.index_of(name)).numel;
      received.resize(static_cast<size_t>(numel));
      ep.recv(received.data(), numel, DType::f32, r, kExpertTag);
      place(name, received.data(), numel);
    }
  }
  for (size_t i = 0; i < filled.size(); ++i)
    check(filled[i], "parameter '" + whole.parameters()[i].name +
                         "' of the whole model is held by no rank of the expert-parallel group "
                         "(internal error)");
}

void gather_model_state(const model::ParameterStore& local, const float* local_flat,
                        const model::ParameterStore& tp_logical, const model::ParameterStore& whole,
                        float* whole_flat, comm::Communicator& tp, comm::Communicator& ep) {
  std::vector<float> gathered;
  const model::ParameterStore* store = &local;
  const float* flat = local_flat;
  if (tp.size() > 1) {
    if (tp.rank() == 0) gathered.resize(static_cast<size_t>(tp_logical.size()));
    gather_logical(local, local_flat, tp_logical, tp.rank() == 0 ? gathered.data() : nullptr, tp);
    store = &tp_logical;
    flat = gathered.data();
  }
  if (tp.rank() != 0) return;
  if (ep.size() > 1) {
    gather_experts(*store, flat, whole, ep.rank() == 0 ? whole_flat : nullptr, ep);
    return;
  }
  check(store->size() == whole.size(),
        "the gathered model has another layout than the whole model (internal error)");
  std::memcpy(whole_flat, flat, sizeof(float) * static_cast<size_t>(whole.size()));
}

}  // namespace lattice::parallel
