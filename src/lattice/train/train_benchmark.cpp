// Training benchmark: see train_benchmark.hpp.
#include "lattice/train/train_benchmark.hpp"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/core/scoped_omp_threads.hpp"
#include "lattice/kernels/make_ops.hpp"
#include "lattice/model/transformer.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/parallel/data_parallel.hpp"
#include "lattice/train/peer_process.hpp"
#include "lattice/train/training_step.hpp"

namespace lattice::train {

namespace {

// `n` random token ids below `vocab` from `seed`.
std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (auto& t : tokens) t = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return tokens;
}

// Times `steps` calls of step() after `warmup` untimed ones.
template <typename Step>
double seconds_for(int64_t steps, int64_t warmup, Step&& step) {
  for (int64_t i = 0; i < warmup; ++i) step();
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// libjemalloc.so.2 as Debian's libjemalloc2 installs it ("" when absent).
std::string jemalloc_library() {
  for (const char* path :
       {"/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
        "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2"}) {
    if (std::filesystem::exists(path)) return path;
  }
  return "";
}

}  // namespace

ThroughputResult benchmark_lattice_training(const BenchmarkCase& c, kernels::Precision precision,
                                            int64_t steps, int64_t warmup, int ranks, int tp,
                                            bool tp_overlap, bool sequence_parallel) {
  check(steps > 0, "the benchmark needs at least one timed step");
  check(tp >= 1 && ranks % tp == 0,
        "the benchmark's " + std::to_string(ranks) + " ranks do not split into tensor-parallel " +
            "groups of " + std::to_string(tp) + ": use a tp that divides the rank count");
  const int replicas = ranks / tp;
  check(ranks >= 1 && c.batch % replicas == 0,
        "the benchmark batch of " + std::to_string(c.batch) + " sequences does not split over " +
            std::to_string(replicas) + " data-parallel ranks: use a rank count that divides it");
  const int64_t batch = c.batch / replicas, n = batch * c.seq_len;
  const int threads = std::max(1, omp_get_max_threads() / ranks);
  double seconds = 0, tp_comm = 0;
  comm::run_local_ranks_or_inline(ranks, [&](comm::Communicator* group) {
    // One rank: a private one-rank world, so that it runs the trainer's step as every layout does.
    std::unique_ptr<comm::LocalWorld> own_world;
    std::unique_ptr<comm::Communicator> own_group;
    if (group == nullptr) {
      own_world = std::make_unique<comm::LocalWorld>(1);
      own_group = own_world->take(0);
      group = own_group.get();
    }
    const int rank = group->rank();
    const ScopedOmpThreads kernel_threads(threads);
    MemoryTracker tracker;
    const std::unique_ptr<kernels::Ops> backend = kernels::make_ops(Device::cpu);
    kernels::Ops& ops = *backend;
    // The trainer's layout (tp innermost): the blocks split over the tp group, the batch over dp.
    mesh::Mesh mesh(*group, {.dp = replicas, .tp = tp});
    comm::Communicator& tp_group = mesh.group(mesh::Axis::tp);
    double tp_seconds = 0;
    model::TensorParallelGroup tp_layers{&tp_group, tp_group.rank(), tp_group.size(), &tp_seconds,
                                         tp_overlap};
    tp_layers.sequence_parallel = sequence_parallel && tp > 1;
    model::Transformer model(c.model, &tracker, model::StageRange{}, tp_layers, {}, ops.memory());
    model.initialize(0);
    // As the trainer does in bf16 without ZeRO-3: the weights' bf16 copies, rounded per step.
    if (precision == kernels::Precision::bf16) model.parameters().keep_bf16_copies(&tracker);
    // Each replica's own tokens; the tp ranks of a replica read the same ones.
    const auto replica = static_cast<uint64_t>(mesh.dp_cp().rank());
    const auto tokens = random_tokens(n, c.model.vocab_size, 1 + 2 * replica);
    const auto targets = random_tokens(n, c.model.vocab_size, 2 + 2 * replica);
    // Data parallelism over the local backend (each replica with its share of the
    // batch, gradients averaged by the bucketed reduction overlapping the backward), clipping to
    // norm 1 and AdamW: the trainer's step (training_step.hpp) on a fixed batch.
    parallel::DataParallel dp(ops, model, mesh, parallel::DataParallelSettings{},
                              optim::AdamWSettings{}, &tracker);
    model::LayerContext ctx{ops, precision, &tracker, &dp};
    const StepShape shape{batch, c.seq_len, 1};
    const MicroBatchSource fixed_batch = [&](int32_t* inputs, int32_t* target_ids) {
      std::copy(tokens.begin(), tokens.end(), inputs);
      std::copy(targets.begin(), targets.end(), target_ids);
    };
    int64_t step = 0;
    auto one_step = [&] { training_step(model, dp, ctx, shape, fixed_batch, 3e-4f, ++step); };
    for (int64_t i = 0; i < warmup; ++i) one_step();
    group->barrier();
    tp_seconds = 0;
    const double elapsed = seconds_for(steps, 0, one_step);
    const double timed_tp_seconds = tp_seconds;
    dp.settle_parameters();
    group->barrier();
    if (rank == 0) {
      seconds = elapsed;
      tp_comm = timed_tp_seconds;
    }
  });
  ThroughputResult r;
  r.tp_comm_seconds_per_step = tp_comm / static_cast<double>(steps);
  r.seconds_per_step = seconds / static_cast<double>(steps);
  r.tokens_per_second = static_cast<double>(c.batch * c.seq_len) / r.seconds_per_step;
  return r;
}

PytorchAllocator parse_pytorch_allocator(const std::string& name) {
  if (name == "auto")
    return jemalloc_library().empty() ? PytorchAllocator::glibc_thp : PytorchAllocator::jemalloc;
  if (name == "jemalloc") {
    check(!jemalloc_library().empty(),
          "--pytorch-allocator jemalloc: libjemalloc.so.2 not found; install Debian's libjemalloc2 "
          "(scripts/install_deps.sh does) or choose glibc-thp");
    return PytorchAllocator::jemalloc;
  }
  if (name == "glibc-thp") return PytorchAllocator::glibc_thp;
  if (name == "glibc") return PytorchAllocator::glibc;
  throw Error("unknown --pytorch-allocator '" + name + "': use auto, jemalloc, glibc-thp or glibc");
}

std::string pytorch_allocator_name(PytorchAllocator allocator) {
  switch (allocator) {
    case PytorchAllocator::jemalloc:
      return "jemalloc (" + jemalloc_library() + ", MALLOC_CONF=" + kPytorchJemallocConf + ")";
    case PytorchAllocator::glibc_thp:
      return "glibc malloc with GLIBC_TUNABLES=glibc.malloc.hugetlb=1";
    case PytorchAllocator::glibc:
      return "glibc malloc (PyTorch's default)";
  }
  return "";
}

std::string pytorch_allocator_environment(PytorchAllocator allocator) {
  switch (allocator) {
    case PytorchAllocator::jemalloc:
      return "LD_PRELOAD='" + jemalloc_library() + "' MALLOC_CONF='" + kPytorchJemallocConf + "' ";
    case PytorchAllocator::glibc_thp:
      return "GLIBC_TUNABLES=${GLIBC_TUNABLES:+$GLIBC_TUNABLES:}glibc.malloc.hugetlb=1 ";
    case PytorchAllocator::glibc:
      return "";
  }
  return "";
}

std::vector<BenchmarkCase> benchmark_cases(const std::string& which) {
  std::vector<BenchmarkCase> all;
  all.push_back(
      {"small (L4 d256 h4 V8192 T256 B8)", model::model_preset("gpt2-small-test"), 8, 256});
  all.push_back(
      {"gpt2-124m (L12 d768 h12 V50257 T1024 B4)", model::model_preset("gpt2-124m"), 4, 1024});
  if (which == "all") return all;
  if (which == "small") return {all[0]};
  if (which == "gpt2-124m") return {all[1]};
  throw Error("unknown benchmark shape '" + which + "': use small, gpt2-124m or all");
}

std::string default_pytorch_python() {
  const char* venv = std::getenv("LATTICE_PEER_VENV");
  const std::filesystem::path python =
      std::filesystem::path(venv != nullptr && *venv != '\0' ? venv : "/opt/lattice/peer-venv") /
      "bin" / "python";
  return std::filesystem::exists(python) ? python.string() : "/usr/bin/python3";
}

std::optional<PytorchPeer> probe_pytorch(const std::string& python, const std::string& script,
                                         PytorchAllocator allocator, std::string& why) {
  std::string output;
  const int status = run_captured(
      pytorch_allocator_environment(allocator) + "'" + python + "' '" + script + "' --probe",
      output);
  const auto j = last_json_line(output, "torch");
  if (status != 0 || !j.is_object() || !j.contains("blas")) {
    why = peer_failure(python, status, output);
    return std::nullopt;
  }
  PytorchPeer peer;
  peer.torch = j.value("torch", "");
  peer.blas = j.value("blas", "");
  peer.sdpa = j.value("sdpa", false);
  peer.fused_adamw = j.value("fused_adamw", false);
  peer.compile = j.value("compile", false);
  return peer;
}

std::optional<ThroughputResult> benchmark_pytorch_training(
    const BenchmarkCase& c, kernels::Precision precision, int64_t steps, int64_t warmup,
    int threads, const std::string& python, const std::string& script, std::string& why, int ranks,
    PytorchAllocator allocator, bool compile) {
  const auto& m = c.model;
  char arguments[1024];
  std::snprintf(arguments, sizeof arguments,
                " --family %s --layers %lld --d-model %lld --heads %lld --kv-heads %lld "
                "--ffn %lld --vocab %lld --seq %lld --batch %lld --precision %s --steps %lld "
                "--warmup %lld --threads %d --ranks %d%s",
                model::family_name(m.family).c_str(), static_cast<long long>(m.n_layers),
                static_cast<long long>(m.d_model), static_cast<long long>(m.n_heads),
                static_cast<long long>(m.n_kv_heads), static_cast<long long>(m.ffn_hidden),
                static_cast<long long>(m.vocab_size), static_cast<long long>(c.seq_len),
                static_cast<long long>(c.batch),
                std::string(kernels::precision_name(precision)).c_str(),
                static_cast<long long>(steps), static_cast<long long>(warmup), threads, ranks,
                compile ? " --compile" : "");
  std::string output;
  const int status = run_captured(
      pytorch_allocator_environment(allocator) + "'" + python + "' '" + script + "'" + arguments,
      output);
  const auto j = last_json_line(output, "tokens_per_second");
  if (status != 0 || !j.is_object()) {
    why = peer_failure(compile ? "torch.compile" : "PyTorch", status, output);
    return std::nullopt;
  }
  ThroughputResult r;
  r.tokens_per_second = j.at("tokens_per_second").get<double>();
  r.seconds_per_step = static_cast<double>(c.batch * c.seq_len) / r.tokens_per_second;
  if (j.contains("blas") && j.at("blas").is_string()) r.blas = j.at("blas").get<std::string>();
  r.compile_seconds = j.value("compile_seconds", 0.0);
  return r;
}

}  // namespace lattice::train
