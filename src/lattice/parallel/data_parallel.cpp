// DataParallel (plain DP and ZeRO-1/2/3): see data_parallel.hpp.
#include "lattice/parallel/data_parallel.hpp"

#include <algorithm>
#include <string>

#include "lattice/core/error.hpp"

namespace lattice::parallel {

namespace {

uint64_t fnv1a(const void* data, size_t bytes, uint64_t hash = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) hash = (hash ^ p[i]) * 1099511628211ull;
  return hash;
}

// The mesh's data-parallel groups; refuses HSDP without a ZeRO stage to shard with.
DataParallelGroups groups_of(mesh::Mesh& mesh, const DataParallelSettings& settings) {
  validate(settings);
  DataParallelGroups groups;
  groups.batch = &mesh.dp_cp();
  groups.shard = &mesh.dp_shard_cp();
  if (mesh.size(mesh::Axis::dp_replicate) > 1) {
    check(settings.zero_stage >= 1,
          "parallelism.hsdp_shard_size needs a ZeRO stage to shard with: set parallelism.zero to "
          "1, 2 or 3");
    groups.replicate = &mesh.group(mesh::Axis::dp_replicate);
  }
  if (mesh.size(mesh::Axis::ep) > 1) groups.expert = &mesh.expert_data_parallel();
  groups.axes = mesh.axis_groups();
  return groups;
}

std::string offload_directory(const DataParallelSettings& settings, const DataParallelGroups& g) {
  return settings.offload_dir.empty()
             ? ""
             : settings.offload_dir + "/rank" + std::to_string(g.batch->rank());
}

}  // namespace

void validate(const DataParallelSettings& settings) {
  check(settings.zero_stage >= 0 && settings.zero_stage <= 3,
        "parallelism.zero = " + std::to_string(settings.zero_stage) +
            " is not a ZeRO stage: use 0 (plain data parallelism), 1, 2 or 3");
  check(settings.bucket_elements > 0,
        "parallelism.bucket_mb must be positive (25 is a good default)");
}

DataParallel::DataParallel(kernels::Ops& ops, model::Transformer& model, mesh::Mesh& mesh,
                           DataParallelSettings settings, optim::AdamWSettings adamw,
                           MemoryTracker* tracker)
    : model_(model),
      groups_(groups_of(mesh, settings)),
      settings_(settings),
      adamw_(adamw),
      layout_(model.units(), settings.bucket_elements, groups_.shard->size(),
              groups_.expert ? groups_.expert->size() : 1),
      optimizer_(ops, model.parameters(), layout_, settings.zero_stage, groups_.shard->rank(),
                 groups_.expert ? groups_.expert->rank() : 0, adamw,
                 offload_directory(settings, groups_), tracker),
      reduction_(ops, model.parameters(), layout_, settings.zero_stage, groups_, tracker, clock_),
      parameters_(ops, model.parameters(), layout_, settings.zero_stage, *groups_.shard,
                  groups_.expert, tracker, clock_) {
  check(layout_.total_elements() == model.parameters().size(),
        "data parallelism: the model's units do not cover its parameters (internal error)");
  for (comm::Communicator* g : {groups_.batch, groups_.shard, groups_.replicate, groups_.expert})
    if (g && std::find(traced_groups_.begin(), traced_groups_.end(), g) == traced_groups_.end())
      traced_groups_.push_back(g);
  traced_seq_.assign(traced_groups_.size(), 0);
}

DataParallel::~DataParallel() = default;

void DataParallel::begin_micro_batch(bool first, bool last) {
  reduction_.begin_micro_batch(first, last);
}

double DataParallel::finish_gradients() {
  return reduction_.finish();
}

void DataParallel::update(float lr, double norm) {
  float clip = 1.0f;
  if (adamw_.max_grad_norm > 0) {
    // As torch.nn.utils.clip_grad_norm_ (and AdamWOptimizer): fp32 coefficient capped at 1.
    const float coefficient = adamw_.max_grad_norm / (static_cast<float>(norm) + 1e-6f);
    clip = coefficient < 1.0f ? coefficient : 1.0f;
  }
  optimizer_.step(model_.parameters(), parameters_, reduction_.shard_gradients(), lr, clip);
  parameters_.gather_updated();
  if (settings_.check_replicas) check_replicas();
}

void DataParallel::settle_parameters(bool full) {
  parameters_.settle(full);
}

// --- hooks: ZeRO's gathers and releases first, then the gradient buckets ---

void DataParallel::before_forward(int unit) {
  parameters_.before_forward(unit);
}

void DataParallel::after_forward(int unit) {
  parameters_.after_forward(unit);
}

void DataParallel::before_backward(int unit) {
  parameters_.before_backward(unit);
  for (int b : layout_.buckets_of_unit(unit))
    if (unit == layout_.buckets()[static_cast<size_t>(b)].last_unit) reduction_.before_backward(b);
}

void DataParallel::after_backward(int unit) {
  parameters_.after_backward(unit);
  // Every gradient of a bucket is final once its lowest unit's backward is done (a tied head's
  // weight is the embedding's, whose unit comes last in backward).
  for (int b : layout_.buckets_of_unit(unit))
    if (unit == layout_.buckets()[static_cast<size_t>(b)].first_unit) reduction_.after_backward(b);
}

// --- metrics, checks, checkpoints ---

double DataParallel::average(double value) {
  std::vector<double> all(static_cast<size_t>(ranks()));
  const auto start = CommunicationClock::Clock::now();
  groups_.batch->all_gather(&value, all.data(), 1, DType::i64);  // doubles as 64-bit integers
  clock_.add_since(start);
  double sum = 0;
  for (double v : all) sum += v;
  return sum / static_cast<double>(ranks());
}

void DataParallel::check_replicas() {
  settle_parameters();
  const model::ParameterStore& store = model_.parameters();
  // The dense buckets are replicated over the batch group, the expert buckets over the expert
  // group (the ranks holding the same experts).
  for (bool expert : {false, true}) {
    comm::Communicator* group = expert ? groups_.expert : groups_.batch;
    if (group == nullptr) continue;
    uint64_t hash = 1469598103934665603ull;
    for (size_t b = 0; b < layout_.buckets().size(); ++b) {
      const Bucket& bucket = layout_.buckets()[b];
      if (bucket.expert == expert && parameters_.resident(static_cast<int>(b)))  // not ZeRO-3's
        hash = fnv1a(store.values() + bucket.begin, static_cast<size_t>(bucket.size()) * 4, hash);
    }
    std::vector<uint64_t> all(static_cast<size_t>(group->size()));
    group->all_gather(&hash, all.data(), 1, DType::i64);
    for (int r = 1; r < group->size(); ++r)
      check(all[static_cast<size_t>(r)] == all[0],
            "replica check: the " + std::string(expert ? "experts" : "parameters") + " of " +
                (expert ? "expert-data-parallel" : "data-parallel") + " rank " + std::to_string(r) +
                " differ from rank 0's after step " + std::to_string(steps_taken()) +
                ": the ranks diverged (non-deterministic kernel or corrupted reduction)");
  }
}

void DataParallel::import_state(const optim::AdamWOptimizer& full) {
  optimizer_.import_state(full);
  parameters_.take_whole_values();
}

std::vector<std::pair<int64_t, int64_t>> DataParallel::checkpoint_ranges() const {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  const bool first_replica = groups_.replicate == nullptr || groups_.replicate->rank() == 0;
  for (const Bucket& bucket : layout_.buckets()) {
    if (!bucket.expert && !first_replica) continue;
    const int rank = bucket.expert ? groups_.expert->rank() : groups_.shard->rank();
    const int64_t begin = bucket.shard_begin(rank), end = bucket.shard_end(rank);
    if (begin < end) ranges.emplace_back(begin, end);
  }
  return ranges;
}

DataParallelTimes DataParallel::take_communication_times() {
  DataParallelTimes times;
  times.exposed_seconds = clock_.take();
  for (size_t g = 0; g < traced_groups_.size(); ++g) {
    uint64_t newest = traced_seq_[g];
    for (const comm::CollectiveRecord& r : traced_groups_[g]->trace().recent()) {
      if (r.seq <= traced_seq_[g] || r.state != comm::RecordState::completed) continue;
      times.total_seconds += static_cast<double>(r.finished_ns - r.entered_ns) * 1e-9;
      newest = std::max(newest, r.seq);
    }
    traced_seq_[g] = newest;
  }
  return times;
}

}  // namespace lattice::parallel
