// `lattice bench moe`: expert parallelism on this machine, measured in one invocation. One MoE
// layer's forward and backward (SwiGLU experts, top-k softmax routing, dropless) on P local ranks
// of one kernel thread each, every rank with its own tokens: EP P (each rank holds E/P experts and
// the copies travel by all-to-all) against EP 1 on the same P ranks (each holds every expert and
// computes its own copies: data parallelism). Per layer call: tokens/s over the P ranks, EP P's
// speedup, the all-to-all time rank 0 waited for (the exchanges block, so all of it is exposed)
// against the planner's all-to-all cost for the same bytes on this machine's measured copy
// bandwidth (plan/cost_model: what `lattice simulate --ep` charges), the bytes each rank sent and
// the expert parameters each rank holds. Rounds alternate the runs; medians are reported.
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
#include "lattice/model/moe_mlp.hpp"
#include "lattice/plan/cost_model.hpp"
#include "lattice/plan/hardware.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

struct Options {
  int64_t d_model = 256, ffn_hidden = 512, experts = 8, top_k = 2, tokens = 1024;
  int ep = 2;
  int64_t steps = 3, warmup = 1, rounds = 3;
};

struct Timing {
  double seconds = 0, exchange = 0;  // per forward + backward, rank 0
  double isolated = 0;            // the same four all-to-alls alone, after a barrier each (rank 0)
  int64_t sent_rows = 0;          // copies rank 0 sent to other ranks per call
  int64_t expert_parameters = 0;  // expert weights rank 0 holds
};

std::vector<float> random_values(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  Rng rng(seed);
  for (float& x : v) x = rng.normal();
  return v;
}

// Forward and backward of one MoE layer on `ranks` local ranks, each with its own tokens; the
// experts split over them (ep = ranks) or held whole by each (ep = 1).
Timing time_layer(const Options& o, int ranks, bool expert_parallel) {
  Timing rank0;
  comm::LocalWorld world(ranks);
  world.run([&](comm::Communicator& group) {
    omp_set_num_threads(1);
    const int rank = group.rank();
    double exchange = 0;
    model::ExpertParallelGroup ep;
    if (expert_parallel) ep = {&group, rank, ranks, &exchange};
    model::MoeSettings settings;
    settings.experts = o.experts;
    settings.top_k = o.top_k;
    model::ParameterStore store;
    model::MoeMlp layer(store, "model.layers.0.block_sparse_moe.", o.d_model, o.ffn_hidden,
                        settings, model::MoeNames::mixtral, ep);
    store.allocate(nullptr);
    store.initialize(3, 0.02f, 1);
    const int64_t n = o.tokens * o.d_model;
    std::vector<float> x = random_values(n, 10 + rank), d_y = random_values(n, 20 + rank);
    std::vector<float> y(static_cast<size_t>(n)), d_x(y.size());
    kernels::CpuOps ops;
    const model::LayerContext ctx{ops};
    model::MoeMlpActivations a;
    double seconds = 0, exchanged = 0;
    for (int64_t step = 0; step < o.warmup + o.steps; ++step) {
      group.barrier();
      exchange = 0;
      const auto start = std::chrono::steady_clock::now();
      layer.forward(ctx, a, y.data(), x.data(), o.tokens);
      layer.backward(ctx, a, d_x.data(), d_y.data(), x.data(), o.tokens);
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (step >= o.warmup) {
        seconds += s;
        exchanged += exchange;
      }
    }
    // The all-to-alls alone: the last call's row counts, each after a barrier (no waiting for a
    // slower rank's compute), four per call as in the layer.
    double isolated = 0;
    if (expert_parallel) {
      std::vector<int64_t> send, recv;
      for (int q = 0; q < ranks; ++q) {
        send.push_back(a.exchange.send_rows[q] * o.d_model);
        recv.push_back(a.exchange.recv_rows[q] * o.d_model);
      }
      std::vector<float> out(static_cast<size_t>(a.dispatch.slots() * o.d_model) + 1),
          in(static_cast<size_t>(a.exchange.received() * o.d_model) + 1);
      for (int64_t step = 0; step < o.warmup + o.steps; ++step)
        for (int call = 0; call < 4; ++call) {
          const bool outbound = call % 2 == 0;
          group.barrier();
          const auto start = std::chrono::steady_clock::now();
          if (outbound)
            group.all_to_all_v(out.data(), send, in.data(), recv, DType::f32);
          else
            group.all_to_all_v(in.data(), recv, out.data(), send, DType::f32);
          if (step >= o.warmup)
            isolated +=
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
    }
    if (rank != 0) return;
    rank0.isolated = isolated / o.steps;
    rank0.seconds = seconds / o.steps;
    rank0.exchange = exchanged / o.steps;
    if (expert_parallel)
      for (int q = 1; q < ranks; ++q) rank0.sent_rows += a.exchange.send_rows[q];
    rank0.expert_parameters = layer.local_experts() * 3 * o.d_model * o.ffn_hidden;
  });
  return rank0;
}

void run_bench(const Options& o) {
  check(o.experts % o.ep == 0, "--experts " + std::to_string(o.experts) +
                                   " is not divisible by --ep " + std::to_string(o.ep) +
                                   ": pick an ep that divides the experts");
  check(o.top_k <= o.experts, "--top-k must not exceed --experts");
  std::printf("lattice bench moe: %s\n", cpu_description().c_str());
  std::printf("load average at start: %s\n", load_average().c_str());
  std::printf(
      "one MoE layer (d_model %lld, %lld SwiGLU experts of %lld, top-%lld softmax, dropless, "
      "fp32), forward + backward, %lld tokens per rank on %d local ranks x 1 thread; EP %d vs "
      "EP 1 on the same ranks; %lld timed calls after %lld warm-up, %lld rounds (medians)\n",
      static_cast<long long>(o.d_model), static_cast<long long>(o.experts),
      static_cast<long long>(o.ffn_hidden), static_cast<long long>(o.top_k),
      static_cast<long long>(o.tokens), o.ep, o.ep, static_cast<long long>(o.steps),
      static_cast<long long>(o.warmup), static_cast<long long>(o.rounds));
  // The planner's all-to-all on this machine: its measured copy bandwidth, one node.
  const plan::HardwareSpec host = plan::calibrate_this_cpu();
  const plan::CostParameters cost;
  std::printf("planner: this machine's copy bandwidth %.1f GB/s (plan::calibrate_this_cpu)\n\n",
              host.memory_bandwidth / 1e9);
  std::vector<double> one, many, exchange, isolated, speedups;
  Timing split;
  for (int64_t round = 0; round < o.rounds; ++round) {
    const Timing whole = time_layer(o, o.ep, false);
    split = time_layer(o, o.ep, true);
    one.push_back(whole.seconds);
    many.push_back(split.seconds);
    exchange.push_back(split.exchange);
    isolated.push_back(split.isolated);
    speedups.push_back(whole.seconds / split.seconds);
  }
  // Four all-to-alls per call (forward: copies out, outputs back; backward: output gradients
  // out, input gradients back), each of the rank's copies (tokens x top_k rows of fp32).
  const double a2a_bytes = static_cast<double>(o.tokens * o.top_k * o.d_model) * 4;
  const double predicted =
      4 * plan::collective_seconds(plan::Collective::kAllToAll, a2a_bytes, o.ep, o.ep, host, cost);
  const double tokens = static_cast<double>(o.tokens) * o.ep;
  const double waited = median(exchange), alone = median(isolated);
  std::printf("%-6s %12s %12s %9s %11s %11s %11s %9s %10s %12s\n", "run", "time/call", "tokens/s",
              "speedup", "a2a", "a2a alone", "predicted", "alone/pred", "sent/rank",
              "experts/rank");
  std::printf("%-6s %9.1f ms %12.0f %9s %11s %11s %11s %9s %10s %9.2f MB\n", "EP 1",
              1e3 * median(one), tokens / median(one), "1.00x", "-", "-", "-", "-", "-",
              4.0 * o.experts * 3 * o.d_model * o.ffn_hidden / 1e6);
  std::printf(
      "EP %-3d %9.1f ms %12.0f %8.2fx %8.2f ms %8.2f ms %8.2f ms %8.2fx %7.2f MB %9.2f MB\n", o.ep,
      1e3 * median(many), tokens / median(many), median(speedups), 1e3 * waited, 1e3 * alone,
      1e3 * predicted, alone / predicted,
      4.0 * static_cast<double>(split.sent_rows * o.d_model) * 4 / 1e6,
      4.0 * static_cast<double>(split.expert_parameters) / 1e6);
  std::printf(
      "\nEP 1: every rank holds all experts and computes its own copies; EP %d: each holds %lld of "
      "them and its copies go to their experts' ranks and back. time/call: rank 0's forward + "
      "backward; tokens/s: the %d ranks' tokens over it; speedup: EP 1 over EP %d (median of the "
      "rounds' ratios; the same expert FLOPs per rank when routing is balanced, so at best 1x: "
      "EP buys memory, experts/rank, and pays the all-to-all); a2a: the time rank 0 spent in the "
      "exchanges (counts and rows, blocking: all exposed; it includes waiting for slower ranks "
      "under uneven routing); a2a alone: the same four all-to-alls of the last call's rows, each "
      "after a barrier; predicted: the planner's cost of four all-to-alls of the rank's copies "
      "(plan::collective_seconds on the measured copy bandwidth); sent/rank: bytes rank 0 sent to "
      "other ranks per call. Local ranks are threads of this process (eager memory copies).\n",
      o.ep, static_cast<long long>(o.experts / o.ep), o.ep, o.ep);
}

}  // namespace

void register_bench_moe(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "moe", "Expert parallelism: one MoE layer on EP ranks vs EP 1 on the same ranks, all-to-all");
  auto o = std::make_shared<Options>();
  target->add_option("--d-model", o->d_model, "model width")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--ffn", o->ffn_hidden, "each expert's SwiGLU width")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--experts", o->experts, "routed experts")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--top-k", o->top_k, "experts per token")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--tokens", o->tokens, "tokens per rank")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--ep", o->ep, "expert-parallel ranks")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  add_timing_options(*target, o->steps, o->warmup, o->rounds);
  target->callback([o] { run_bench(*o); });
}

}  // namespace lattice::cli
