// `lattice bench pp`: pipeline bubbles on this machine, measured in one invocation. For each
// schedule, pp local ranks (one kernel thread each) train the same model through the pipeline
// step (train/pipeline_step.hpp) on random tokens; the executor times every action, and the
// measured bubble (1 - the ranks' mean compute time over the longest rank's pipeline time) is
// printed beside (a) the analytic (p - 1) / (m + p - 1) of GPipe and 1F1B and (b) the simulator
// replaying the same schedule (pipeline/replay.hpp) with the F, B and W costs measured on each
// rank in the same run (their means per rank and kind), and its ratio to (b).
#include <omp.h>

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "bench_host.hpp"
#include "lattice/comm/backends/local.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/rng.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/mesh/mesh.hpp"
#include "lattice/parallel/pipeline/replay.hpp"
#include "lattice/train/pipeline_rank.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

struct Options {
  std::string model = "gpt2-demo";
  int64_t layers = 8, seq_len = 128, micro_batch = 2, microbatches = 8;
  int pp = 2;
  int64_t steps = 4, warmup = 1;
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v"};
};

struct ScheduleResult {
  double measured = 0, last = 0, replayed = 0, step_seconds = 0;
  pipeline::Schedule schedule;
};

ScheduleResult run_schedule(const Options& o, const std::string& schedule_name) {
  train::TrainConfig config;
  config.model = model::model_preset(o.model);
  config.model.n_layers = o.layers;
  config.training.seq_len = o.seq_len;
  config.training.micro_batch_size = o.micro_batch;
  config.training.gradient_accumulation_steps = o.microbatches;
  config.parallelism.pp = o.pp;
  config.parallelism.pipeline_schedule = schedule_name;
  const auto kind = pipeline::parse_schedule_kind(schedule_name);
  config.parallelism.virtual_stages =
      kind == pipeline::ScheduleKind::kInterleaved || kind == pipeline::ScheduleKind::kZeroBubbleV
          ? 2
          : 1;
  config.training.global_batch_size = o.micro_batch * o.microbatches;
  parallel::validate_layout(config.model, config.training.seq_len, config.layout());
  ScheduleResult result;
  std::mutex lock;
  std::vector<double> bubbles;
  std::vector<pipeline::StepTimeline> timelines(static_cast<size_t>(o.pp));
  comm::run_local_ranks(o.pp, [&](comm::Communicator& world) {
    omp_set_num_threads(1);
    mesh::MeshShape shape;
    shape.pp = o.pp;
    mesh::Mesh mesh(world, shape);
    MemoryTracker tracker;
    kernels::CpuOps ops;
    parallel::DataParallelSettings settings;
    train::PipelineRank pipe(config, mesh, ops, &tracker, {}, settings);
    const model::LayerContext ctx{ops, config.training.precision, &tracker, nullptr};
    Rng rng(7);  // the same tokens on every rank
    const auto vocab = static_cast<uint64_t>(config.model.vocab_size);
    const train::MicroBatchSource source = [&](int32_t* inputs, int32_t* targets) {
      for (int64_t i = 0; i < o.micro_batch * o.seq_len; ++i) {
        inputs[i] = static_cast<int32_t>(rng.below(vocab));
        targets[i] = static_cast<int32_t>(rng.below(vocab));
      }
    };
    const train::StepShape step_shape{o.micro_batch, o.seq_len, o.microbatches};
    std::vector<double> mine, seconds;
    for (int64_t step = 1; step <= o.warmup + o.steps; ++step) {
      const train::StepOutcome outcome = pipe.step(ctx, step_shape, source, 1e-4f, step);
      if (step > o.warmup) {
        mine.push_back(outcome.pp_bubble.value_or(0.0));
        seconds.push_back(outcome.seconds);
      }
    }
    std::lock_guard<std::mutex> guard(lock);
    const int rank = mesh.group(mesh::Axis::pp).rank();
    timelines[static_cast<size_t>(rank)] = pipe.executor().timeline();
    if (rank == 0) {
      bubbles = mine;
      result.step_seconds = median(seconds);
      result.schedule = pipe.schedule();
    }
  });
  // (b): the replay of the last step with each action's measured duration on its rank, scaled
  // so that they add up to the rank's busy time (what runs between the actions, posting
  // transfers and freeing sets, is busy time too: the measured bubble counts only waiting).
  std::map<std::tuple<int, int, int, int>, double> cost;  // rank, kind, stage, microbatch
  for (int r = 0; r < o.pp; ++r) {
    const pipeline::StepTimeline& timeline = timelines[static_cast<size_t>(r)];
    const double scale =
        timeline.compute_seconds > 0 ? timeline.busy_seconds() / timeline.compute_seconds : 1.0;
    for (const pipeline::TimedAction& t : timeline.actions)
      if (pipeline::is_compute(t.action.kind))
        cost[{r, static_cast<int>(t.action.kind), t.action.stage, t.action.microbatch}] =
            scale * (t.end - t.start);
  }
  pipeline::ReplayCosts costs;
  costs.compute = [&](int rank, const pipeline::Action& action) {
    return cost[{rank, static_cast<int>(action.kind), action.stage, action.microbatch}];
  };
  result.replayed = pipeline::replay(result.schedule, costs).bubble_fraction();
  result.measured = median(bubbles);
  result.last = bubbles.empty() ? 0 : bubbles.back();
  return result;
}

void run_bench(const Options& o) {
  check(o.pp >= 2, "bench pp needs --pp 2 or more");
  std::printf("lattice bench pp: %s\n", cpu_description().c_str());
  std::printf("load average at start: %s\n", load_average().c_str());
  std::printf(
      "%s with %lld layers, T%lld, microbatch %lld, m = %lld microbatches, pp = %d local ranks x "
      "1 thread; %lld timed steps after %lld warm-up (medians)\n\n",
      o.model.c_str(), static_cast<long long>(o.layers), static_cast<long long>(o.seq_len),
      static_cast<long long>(o.micro_batch), static_cast<long long>(o.microbatches), o.pp,
      static_cast<long long>(o.steps), static_cast<long long>(o.warmup));
  std::printf("%-12s %10s %10s %10s %10s %9s %10s\n", "schedule", "measured", "analytic",
              "last step", "replay", "vs replay", "step");
  const double p = o.pp, m = static_cast<double>(o.microbatches);
  for (const std::string& name : o.schedules) {
    const ScheduleResult r = run_schedule(o, name);
    const auto kind = pipeline::parse_schedule_kind(name);
    const bool analytic =
        kind == pipeline::ScheduleKind::kGPipe || kind == pipeline::ScheduleKind::kOneFOneB;
    char analytic_text[32] = "-";
    if (analytic)
      std::snprintf(analytic_text, sizeof analytic_text, "%.1f%%", 100.0 * (p - 1) / (m + p - 1));
    std::printf("%-12s %9.1f%% %10s %9.1f%% %9.1f%% %8.2fx %7.1f ms\n", name.c_str(),
                100.0 * r.measured, analytic_text, 100.0 * r.last, 100.0 * r.replayed,
                r.replayed > 0 ? r.last / r.replayed : 0.0, 1e3 * r.step_seconds);
    std::fflush(stdout);
  }
  std::printf(
      "\nmeasured: the ranks' mean idle share of the longest rank's pipeline time in a step (idle: "
      "waiting for an activation or gradient, or done before the longest rank), median of the "
      "timed steps; analytic: (p - 1) / (m + p - 1), for equal stages and free transfers; last "
      "step: the measured bubble of the last step; replay: the simulator's replay of the same "
      "action lists with every F, B and W of the last step taking its measured time (scaled to "
      "the rank's busy time; transfers free), its 1 - mean busy / makespan; vs replay: last step "
      "over replay.\n");
}

}  // namespace

void register_bench_pp(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "pp", "Pipeline bubbles: measured per schedule vs the analytic and the simulator's replay");
  auto o = std::make_shared<Options>();
  target->add_option("--model", o->model, "model preset")->capture_default_str();
  target->add_option("--layers", o->layers, "blocks (split over the stages)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--seq-len", o->seq_len, "tokens per sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--micro-batch", o->micro_batch, "sequences per microbatch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--microbatches", o->microbatches, "microbatches per step (m)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--pp", o->pp, "pipeline ranks")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  target->add_option("--steps", o->steps, "timed steps")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  target->add_option("--warmup", o->warmup, "untimed steps first")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  target->add_option("--schedule", o->schedules, "schedules to run")
      ->delimiter(',')
      ->capture_default_str();
  target->callback([o] { run_bench(*o); });
}

}  // namespace lattice::cli
