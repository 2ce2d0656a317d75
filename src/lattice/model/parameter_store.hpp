// ParameterStore: every parameter of a model (or of one pipeline stage) in one flat fp32 buffer,
// with a matching flat gradient buffer, each parameter a named view (Hugging Face names). Flat
// storage is what the optimizer, the gradient norm, checkpoints and (later) data-parallel buckets
// and ZeRO shards use. In bf16 precision the store can also keep every parameter rounded to bf16
// (the GEMMs' weight operand), rounded once per change of the values instead of once per use.
//
// Placements: each parameter records its logical (whole-model) shape, which slice of it this store
// holds (TensorShard: dimension, index, count; count 1 is the whole tensor) and the mesh axes over
// which the ranks hold identical copies of that slice (`replicated`). On the axes it is not
// replicated over, the ranks hold different elements (the other slices of a tensor-parallel split,
// another pipeline stage's parameters), so the global gradient norm adds its sums of squares over
// those axes and takes a replicated one once; data parallelism and ZeRO reduce and shard only
// parameters replicated over the batch axes; checkpoints record the placement beside the tensor.
// By default a parameter is whole and replicated over every axis.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "lattice/core/dtype.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/mesh/mesh_axis.hpp"

namespace lattice::model {

// How a parameter is initialised and whether AdamW decays it.
enum class InitKind { normal, normal_residual, zeros, ones };

// The slice of a logical tensor one store holds: slice `index` of `count` equal slices along
// dimension `dim` (count 1: the whole tensor; dim and index are then 0). With `blocks` > 1 the
// dimension is that many equal blocks laid end to end (GPT-2's packed q | k | v), each split into
// `count` slices, and the store holds slice `index` of every block, in block order (Megatron's
// partition stride): a tensor-parallel rank's q, k and v heads of one packed projection.
//
// With `padded` > 0 (dimension 0 only, no blocks) the logical extent is padded to `padded` (a
// multiple of count: a vocabulary padded to a multiple of tp x 64, Megatron's
// make-vocab-size-divisible-by) before it is split; a slice's rows past the logical extent are
// padding: zero, in no checkpoint, never read as data.
struct TensorShard {
  int dim = 0;
  int index = 0;
  int count = 1;
  int blocks = 1;
  int64_t padded = 0;

  bool whole() const { return count == 1; }
  bool operator==(const TensorShard&) const = default;
};

struct ParameterInfo;

// Where a parameter's local slice sits in its logical tensor (row-major): `outer` runs of `run`
// consecutive elements, local run o starting at logical element o * stride + first. A whole
// parameter is one run. A padded slice (TensorShard::padded) holds its outer * run logical elements
// first and padding after them. What initialisation, checkpoints and resharding walk.
struct SliceWalk {
  int64_t outer = 1, run = 0, stride = 0, first = 0;
};
SliceWalk slice_walk(const ParameterInfo& p);

struct ParameterInfo {
  std::string name;    // Hugging Face name, e.g. "transformer.h.0.attn.c_attn.weight"
  Shape shape;         // this store's tensor (the local shard)
  Shape global_shape;  // the logical parameter (equal to shape when whole)
  TensorShard shard;
  // The axes whose ranks hold identical copies of this tensor (default: every axis).
  mesh::AxisSet replicated = mesh::AxisSet::all();
  int64_t offset = 0;  // element offset into the flat buffers
  int64_t numel = 0;
  InitKind init = InitKind::normal;
  bool weight_decay = true;  // matrices and embeddings decay; biases and norm weights do not
  std::string init_stream;   // the name whose random stream initialises it (its own by default)

  // A copy of another parameter held by another store: a tied head's weight on a last pipeline
  // stage without the embedding, which starts as (init_stream), is read from checkpoints as, and
  // is counted in the gradient norm as that parameter (its gradient is summed with the
  // original's, so the two stay equal).
  bool is_copy() const { return init_stream != name; }
  // The name a checkpoint holds this parameter under (the original's, for a copy).
  const std::string& stored_name() const { return init_stream; }
};

class ParameterStore {
 public:
  // Declares a parameter; returns its index. Only before allocate(). A non-empty `init_stream`
  // makes it start as a copy of the parameter of that name (e.g. an untied copy of a tied head on a
  // stage without the embedding), whether or not that parameter lives in this store.
  // The parameter is whole and replicated over every mesh axis.
  int declare(std::string name, Shape shape, InitKind init, bool weight_decay,
              std::string init_stream = "");
  // Declares this store's slice `shard` of a logical parameter of shape `global_shape`, held
  // identically by the ranks of the axes in `replicated` (a tensor-parallel slice: every axis but
  // tp). The local shape is global_shape with dimension shard.dim divided by shard.count, which
  // must divide it. initialize() gives the slice the values it has in the whole parameter.
  int declare_shard(std::string name, Shape global_shape, TensorShard shard,
                    mesh::AxisSet replicated, InitKind init, bool weight_decay,
                    std::string init_stream = "");
  // Every parameter declared so far is held by this rank alone along `axis` (a pipeline stage's
  // parameters: the other ranks of the pp axis hold other stages). Only before allocate().
  void hold_along(mesh::Axis axis);
  // Lays the parameters not replicated over `axis` out after all the others (each group keeps its
  // declaration order): an expert-parallel rank's experts at the end of the flat buffer, so that
  // data parallelism reduces and shards them as their own contiguous region (over the ranks
  // holding the same experts). Indices do not change; offsets do. Only before allocate().
  void place_last(mesh::Axis axis);
  // The offset where the parameters placed last by place_last begin (size() when none are).
  int64_t trailing_offset() const { return trailing_offset_ < 0 ? total_ : trailing_offset_; }
  // Allocates the flat parameter and gradient buffers (zero-filled) from `memory` (the backend's,
  // kernels::Ops::memory(); the bf16 copies come from the same).
  void allocate(MemoryTracker* tracker, DeviceMemory& memory = host_memory());
  bool allocated() const { return !values_.empty() || total_ == 0; }

  // Initialises every parameter from `seed`: each parameter draws from its own generator seeded by
  // a hash of (seed, name), so the values do not depend on which parameters live on this rank;
  // a shard draws the whole logical parameter's sequence and keeps its slice.
  // normal: N(0, std); normal_residual: N(0, std/sqrt(2·n_layers)) (GPT-2's scaled projections).
  void initialize(uint64_t seed, float std, int64_t n_layers);

  int64_t size() const { return total_; }
  // Elements a parameter of `numel` elements takes in the flat buffer: each stays 64-byte aligned.
  static int64_t aligned_extent(int64_t numel) { return (numel + 15) / 16 * 16; }
  const std::vector<ParameterInfo>& parameters() const { return params_; }
  const ParameterInfo& info(int index) const { return params_.at(static_cast<size_t>(index)); }
  // Index of a parameter by name; throws lattice::Error naming it when absent.
  int index_of(const std::string& name) const;

  // The values, read only.
  const float* values() const { return values_.f32(); }
  // The memory the values and gradients live in (the host's until allocate()).
  DeviceMemory& memory() const { return values_.memory(); }
  const float* value(int index) const { return values() + info(index).offset; }
  // The values, for writing: every writer (initialisation, optimizers, checkpoint loads, ZeRO
  // gathers, tests) takes its pointer here, and taking it marks the bf16 copies stale, so a copy is
  // never older than the values it was rounded from.
  float* mutable_values();
  float* mutable_value(int index) { return mutable_values() + info(index).offset; }

  float* grads() { return grads_.f32(); }
  const float* grads() const { return grads_.f32(); }
  float* grad(int index) { return grads() + info(index).offset; }
  void zero_grads();

  // bf16 copies of the values (bf16 precision): one flat bf16 buffer beside the fp32 one (2 bytes
  // per element, tracked as parameters), each parameter's copy equal to lattice::to_bf16 of its
  // values. Off until keep_bf16_copies (the trainer turns it on for bf16 unless ZeRO-3 shards the
  // weights: a whole bf16 model would undo part of the sharding).
  void keep_bf16_copies(MemoryTracker* tracker);
  bool keeps_bf16_copies() const { return !bf16_values_.empty(); }
  // The parameter's bf16 copy, rounded again first if the values were written since it last was;
  // null when copies are not kept (the caller rounds the fp32 values itself).
  const lattice::bf16* bf16_value(int index);
  // For an optimizer that rounds every element into the copies as it updates it: the flat copy
  // buffer (null when not kept). After writing all of it, call bf16_copies_written(); values
  // written after that (through mutable_values) make the copies stale again.
  lattice::bf16* bf16_copies_for_writing() {
    return keeps_bf16_copies() ? bf16_values_.data<lattice::bf16>() : nullptr;
  }
  void bf16_copies_written();

 private:
  std::vector<ParameterInfo> params_;
  std::unordered_map<std::string, int> by_name_;
  int64_t total_ = 0;
  int64_t trailing_offset_ = -1;  // -1: no parameters placed last
  Tensor values_, grads_;
  Tensor bf16_values_;
  // values_version_ counts the times the values were handed out for writing; a parameter's copy is
  // current when its entry in bf16_versions_ equals it.
  uint64_t values_version_ = 0;
  std::vector<uint64_t> bf16_versions_;
};

}  // namespace lattice::model
