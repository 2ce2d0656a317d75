// Tensor-parallel state as logical tensors: see tensor_parallel_state.hpp.
#include "lattice/parallel/tensor_parallel_state.hpp"

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "lattice/core/error.hpp"

namespace lattice::parallel {

namespace {

// The point-to-point tag of gather_logical's slices (messages from one rank with one tag arrive in
// order, so each rank's slices arrive in parameter order).
constexpr int kSliceTag = 0x5450;  // "TP"

std::string quoted(const std::string& name) {
  return "'" + name + "'";
}

// The layout of a store as every rank of a tensor-parallel group must share it: names, local and
// logical shapes, slicing (all but the index) and offsets. FNV-1a over a text form.
uint64_t layout_fingerprint(const model::ParameterStore& store) {
  std::string text = std::to_string(store.size()) + ";";
  for (const model::ParameterInfo& p : store.parameters()) {
    text += p.name + "|" + shape_string(p.shape) + "|" + shape_string(p.global_shape) + "|" +
            std::to_string(p.shard.dim) + "," + std::to_string(p.shard.count) + "," +
            std::to_string(p.shard.blocks) + "|" + std::to_string(p.replicated.bits()) + "|" +
            std::to_string(p.offset) + ";";
  }
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Why `local` cannot be gathered over a group of `size` ranks as rank `rank` ("" when it can).
std::string gather_problem(const model::ParameterStore& local, const model::ParameterStore& logical,
                           const float* logical_flat, int rank, int size) {
  try {
    check_logical_store(local, logical);
  } catch (const Error& e) {
    return e.what();
  }
  if (rank == 0 && logical_flat == nullptr && logical.size() > 0)
    return "gather_logical: tensor-parallel rank 0 passed no logical buffer to fill (internal "
           "error)";
  for (const model::ParameterInfo& p : local.parameters()) {
    const bool tp_replicated = p.replicated.contains(mesh::Axis::tp);
    if (!p.shard.whole() && tp_replicated)
      return "parameter " + quoted(p.name) + " is split into " + std::to_string(p.shard.count) +
             " slices but marked replicated over tp: declare a tensor-parallel slice with every "
             "axis but tp in `replicated` (internal error)";
    if (p.shard.whole() && !tp_replicated && size > 1)
      return "parameter " + quoted(p.name) +
             " is whole but not replicated over tp, so the tensor-parallel ranks hold different "
             "tensors of one name and there is no logical tensor to assemble: declare it "
             "replicated over tp or as a slice (internal error)";
    if (is_tensor_parallel_slice(p) && (p.shard.count != size || p.shard.index != rank))
      return "parameter " + quoted(p.name) + " is slice " + std::to_string(p.shard.index) + " of " +
             std::to_string(p.shard.count) + " on tensor-parallel rank " + std::to_string(rank) +
             " of " + std::to_string(size) +
             ": rank r of the tensor-parallel group must hold slice r of tp slices";
  }
  return "";
}

}  // namespace

bool is_tensor_parallel_slice(const model::ParameterInfo& info) {
  return !info.shard.whole() && !info.replicated.contains(mesh::Axis::tp);
}

bool has_tensor_parallel_slices(const model::ParameterStore& store) {
  for (const model::ParameterInfo& p : store.parameters())
    if (is_tensor_parallel_slice(p)) return true;
  return false;
}

void check_logical_store(const model::ParameterStore& local, const model::ParameterStore& logical) {
  const std::string fix =
      ": build the logical store from the same model configuration (the tp = 1 model, e.g. "
      "model::Transformer::declared_only)";
  std::unordered_map<std::string, const model::ParameterInfo*> by_name;
  for (const model::ParameterInfo& p : logical.parameters()) by_name[p.name] = &p;
  for (const model::ParameterInfo& p : local.parameters()) {
    auto it = by_name.find(p.name);
    check(it != by_name.end(),
          "the logical model has no parameter " + quoted(p.name) + " of the sharded model" + fix);
    const model::ParameterInfo& whole = *it->second;
    check(whole.shard.whole(), "the logical model's " + quoted(p.name) + " is itself slice " +
                                   std::to_string(whole.shard.index) + " of " +
                                   std::to_string(whole.shard.count) +
                                   ": the logical store declares every parameter whole" + fix);
    check(whole.shape == p.global_shape,
          "parameter " + quoted(p.name) + " has logical shape " + shape_string(p.global_shape) +
              " in the sharded model but " + shape_string(whole.shape) + " in the logical model" +
              fix);
  }
  if (logical.parameters().size() != local.parameters().size()) {
    std::unordered_map<std::string, int> in_local;
    for (const model::ParameterInfo& p : local.parameters()) in_local[p.name] = 1;
    std::string extra;
    for (const model::ParameterInfo& p : logical.parameters())
      if (!in_local.contains(p.name)) {
        extra = p.name;
        break;
      }
    throw Error("the logical model has parameter " + quoted(extra) +
                ", which the sharded model lacks (" + std::to_string(logical.parameters().size()) +
                " parameters against " + std::to_string(local.parameters().size()) + ")" + fix);
  }
}

void place_slice(const model::ParameterInfo& slice, const float* local, float* logical) {
  const model::SliceWalk w = model::slice_walk(slice);
  for (int64_t o = 0; o < w.outer; ++o)
    std::memcpy(logical + o * w.stride + w.first, local + o * w.run,
                static_cast<size_t>(w.run) * sizeof(float));
}

void take_slice(const model::ParameterInfo& slice, const float* logical, float* local) {
  const model::SliceWalk w = model::slice_walk(slice);
  for (int64_t o = 0; o < w.outer; ++o)
    std::memcpy(local + o * w.run, logical + o * w.stride + w.first,
                static_cast<size_t>(w.run) * sizeof(float));
}

void gather_logical(const model::ParameterStore& local, const float* local_flat,
                    const model::ParameterStore& logical, float* logical_flat,
                    comm::Communicator& tp) {
  const int rank = tp.rank(), size = tp.size();
  // Every rank checks its own stores, then the group agrees (one allreduce) that all passed and
  // that all hold the same layout, before any slice moves: a refusal is an Error on every rank.
  const std::string problem = gather_problem(local, logical, logical_flat, rank, size);
  const auto fingerprint = static_cast<int64_t>(layout_fingerprint(local) >> 2);
  int64_t agreement[3] = {fingerprint, -fingerprint, problem.empty() ? 0 : 1};
  if (size > 1) tp.allreduce(agreement, 3, DType::i64, comm::ReduceOp::max);
  check(problem.empty(), problem);
  check(agreement[2] == 0,
        "another rank of the tensor-parallel group cannot gather its parameters (its error names "
        "the problem)");
  check(agreement[0] == fingerprint && agreement[1] == -fingerprint,
        "the ranks of the tensor-parallel group hold parameter stores of different layouts "
        "(names, shapes or slicing): every rank must build the same model with the same tp");

  if (rank != 0) {
    for (const model::ParameterInfo& p : local.parameters())
      if (is_tensor_parallel_slice(p) && p.numel > 0)
        tp.send(local_flat + p.offset, p.numel, DType::f32, 0, kSliceTag);
    return;
  }
  std::vector<float> received;
  std::vector<comm::CommHandle> pending;
  for (const model::ParameterInfo& p : local.parameters()) {
    float* whole = logical_flat + logical.info(logical.index_of(p.name)).offset;
    place_slice(p, local_flat + p.offset, whole);
    if (!is_tensor_parallel_slice(p) || p.numel == 0) continue;
    received.resize(static_cast<size_t>(p.numel) * static_cast<size_t>(size - 1));
    pending.clear();
    for (int r = 1; r < size; ++r)
      pending.push_back(
          tp.irecv(received.data() + (r - 1) * p.numel, p.numel, DType::f32, r, kSliceTag));
    for (comm::CommHandle& handle : pending) handle.wait();
    model::ParameterInfo theirs = p;
    for (int r = 1; r < size; ++r) {
      theirs.shard.index = r;
      place_slice(theirs, received.data() + (r - 1) * p.numel, whole);
    }
  }
}

void scatter_logical(const model::ParameterStore& logical, const float* logical_flat,
                     const model::ParameterStore& local, float* local_flat) {
  check_logical_store(local, logical);
  for (const model::ParameterInfo& p : local.parameters())
    take_slice(p, logical_flat + logical.info(logical.index_of(p.name)).offset,
               local_flat + p.offset);
}

}  // namespace lattice::parallel
