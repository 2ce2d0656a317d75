// `lattice bench cp`: context-parallel attention on this machine, measured in one invocation. One
// attention layer's forward and backward (causal, the load-balanced split) on cp local ranks of
// one kernel thread each, ring and Ulysses, against the one-rank attention over the whole
// sequence on one thread (the same kernels): per layer call the cp time, its speedup over one
// rank (ideal: cp), the communication rank 0 waited for (exposed) against its attention compute,
// and the bytes each rank sent. Rounds alternate the runs; medians are reported.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_host.hpp"
#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/parallel/context/context_parallel_mode.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

namespace k = lattice::kernels;

struct Options {
  std::vector<int64_t> seq_lens = {4096, 8192};
  int64_t heads = 8, kv_heads = 8, head_dim = 64, batch = 1;
  int cp = 2;
  int64_t steps = 3, warmup = 1, rounds = 3;
  std::string precision = "fp32";
};

struct Timing {
  double seconds = 0, exposed = 0;  // per forward + backward, rank 0
};

std::vector<float> random_values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng rng(seed);
  for (float& x : v) x = rng.normal();
  return v;
}

// Forward and backward of one attention layer over q, k, v [B, T, heads·D] on one rank, or on
// its share (T / cp rows) under `mode` when cp > 1.
Timing time_attention(const Options& o, int64_t T, int cp, parallel::ContextParallelMode mode,
                      k::Precision precision) {
  const int64_t n = T / cp, A = o.heads * o.head_dim, W = o.kv_heads * o.head_dim;
  Timing rank0;
  auto run = [&](comm::Communicator* group) {
    omp_set_num_threads(1);
    const int rank = group ? group->rank() : 0;
    const std::vector<float> q = random_values(o.batch * n * A, 10 + rank),
                             kk = random_values(o.batch * n * W, 20 + rank),
                             v = random_values(o.batch * n * W, 30 + rank),
                             d_out = random_values(o.batch * n * A, 40 + rank);
    std::vector<float> out(q.size()), lse(static_cast<size_t>(o.batch * o.heads * n)), dq(q.size()),
        dk(kk.size()), dv(v.size());
    const auto shape = k::AttentionShape::contiguous(o.batch, n, o.heads, o.kv_heads, o.head_dim);
    k::CpuOps ops;
    std::unique_ptr<model::ContextAttention> attention;
    if (group) attention = parallel::make_context_attention(mode, *group, ops.memory(), nullptr);
    double seconds = 0, exposed = 0;
    for (int64_t step = 0; step < o.warmup + o.steps; ++step) {
      if (group) group->barrier();
      const auto start = std::chrono::steady_clock::now();
      if (attention) {
        attention->take_wait_seconds();
        attention->forward(ops, out.data(), lse.data(), q.data(), kk.data(), v.data(), shape,
                           precision);
        attention->backward(ops, dq.data(), dk.data(), dv.data(), d_out.data(), q.data(), kk.data(),
                            v.data(), out.data(), lse.data(), shape, precision);
      } else {
        ops.attention_forward(out.data(), lse.data(), q.data(), kk.data(), v.data(), shape,
                              precision, {});
        ops.attention_backward(dq.data(), dk.data(), dv.data(), d_out.data(), q.data(), kk.data(),
                               v.data(), out.data(), lse.data(), shape, precision, {});
      }
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const double waited = attention ? attention->take_wait_seconds() : 0.0;
      if (step >= o.warmup) {
        seconds += s;
        exposed += waited;
      }
    }
    if (rank == 0) rank0 = {seconds / o.steps, exposed / o.steps};
  };
  if (cp == 1) {
    run(nullptr);
  } else {
    comm::LocalWorld world(cp);
    world.run([&](comm::Communicator& group) { run(&group); });
  }
  return rank0;
}

// Bytes one rank sends per forward + backward: ring — the [k | v] block on cp − 1 hops each way
// (bf16 under Precision::bf16) and its fp32 gradient sum on cp hops; Ulysses — fp32 all-to-alls
// of (cp − 1)/cp of q, k, v, the output and the lse forward, and of q, k, v, out, d_out, lse, dq,
// dk, dv backward.
double bytes_sent(const Options& o, int64_t T, int cp, parallel::ContextParallelMode mode,
                  k::Precision precision) {
  const double n = static_cast<double>(T) / cp, q = o.batch * n * o.heads * o.head_dim,
               kv = o.batch * n * o.kv_heads * o.head_dim, lse = o.batch * n * o.heads;
  const double block_bytes = precision == k::Precision::bf16 ? 2.0 : 4.0;
  if (mode == parallel::ContextParallelMode::ring)
    return 2 * kv * (block_bytes * (cp - 1) * 2 + 4.0 * cp);
  const double share = static_cast<double>(cp - 1) / cp;
  return 4.0 * share * ((2 * q + 2 * kv + lse) + (4 * q + 4 * kv + lse));
}

void run_bench(const Options& o) {
  const k::Precision precision = k::parse_precision(o.precision);
  for (int64_t T : o.seq_lens)
    check(T % (2 * o.cp) == 0, "--seq-len " + std::to_string(T) + " is not divisible by 2 x cp = " +
                                   std::to_string(2 * o.cp) + ": pick multiples of it");
  check(o.heads % o.cp == 0 && o.kv_heads % o.cp == 0 && o.heads % o.kv_heads == 0,
        "--heads " + std::to_string(o.heads) + " and --kv-heads " + std::to_string(o.kv_heads) +
            " must be divisible by --cp (Ulysses splits them), and heads by kv-heads");
  std::printf("lattice bench cp: %s\n", cpu_description().c_str());
  std::printf("load average at start: %s\n", load_average().c_str());
  std::printf(
      "one causal attention layer (B%lld, %lld heads, %lld key/value heads, head_dim %lld, %s), "
      "forward + backward; cp %d local ranks x 1 thread vs 1 rank x 1 thread over the whole "
      "sequence; %lld timed calls after %lld warm-up, %lld rounds (medians)\n\n",
      static_cast<long long>(o.batch), static_cast<long long>(o.heads),
      static_cast<long long>(o.kv_heads), static_cast<long long>(o.head_dim), o.precision.c_str(),
      o.cp, static_cast<long long>(o.steps), static_cast<long long>(o.warmup),
      static_cast<long long>(o.rounds));
  std::printf("%-7s %-8s %11s %11s %8s %11s %11s %8s %10s\n", "seq", "mode", "1 rank", "cp",
              "speedup", "exposed", "compute", "exposed%", "sent/rank");
  for (int64_t T : o.seq_lens) {
    for (auto mode :
         {parallel::ContextParallelMode::ring, parallel::ContextParallelMode::ulysses}) {
      std::vector<double> one, many, exposed, speedups;
      for (int64_t round = 0; round < o.rounds; ++round) {
        const Timing single = time_attention(o, T, 1, mode, precision);
        const Timing split = time_attention(o, T, o.cp, mode, precision);
        one.push_back(single.seconds);
        many.push_back(split.seconds);
        exposed.push_back(split.exposed);
        speedups.push_back(single.seconds / split.seconds);
      }
      const double step = median(many), waited = median(exposed);
      std::printf("%-7lld %-8s %8.1f ms %8.1f ms %7.2fx %8.1f ms %8.1f ms %7.1f%% %7.1f MB\n",
                  static_cast<long long>(T), parallel::context_parallel_mode_name(mode),
                  1e3 * median(one), 1e3 * step, median(speedups), 1e3 * waited,
                  1e3 * (step - waited), 100.0 * waited / step,
                  bytes_sent(o, T, o.cp, mode, precision) / 1e6);
      std::fflush(stdout);
    }
  }
  std::printf(
      "\n1 rank: the whole sequence's attention on one thread; cp: rank 0's call on its T / cp "
      "rows (two load-balanced chunks); speedup: 1 rank over cp (median of the rounds' ratios; "
      "ideal %d.00x); exposed: the time rank 0 waited on the cp group (ring: transfers not hidden "
      "behind the current block's compute, and the load imbalance; Ulysses: its blocking "
      "all-to-alls); compute: the rest of the call; sent/rank: bytes each rank sends per call. "
      "Local ranks are threads of this process (eager memory copies).\n",
      o.cp);
}

}  // namespace

void register_bench_cp(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "cp",
      "Context parallelism: ring and Ulysses attention on cp ranks vs one rank, exposed comm");
  auto o = std::make_shared<Options>();
  target->add_option("--seq-len", o->seq_lens, "sequence lengths")
      ->delimiter(',')
      ->capture_default_str();
  target->add_option("--heads", o->heads, "attention heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--kv-heads", o->kv_heads, "key/value heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--head-dim", o->head_dim, "head dimension")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--batch", o->batch, "sequences")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--cp", o->cp, "context-parallel ranks")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  add_timing_options(*target, o->steps, o->warmup, o->rounds);
  target->add_option("--precision", o->precision, "fp32 or bf16")->capture_default_str();
  target->callback([o] { run_bench(*o); });
}

}  // namespace lattice::cli
