// The `lattice parity` verb: the parity harness. Trains one config from the same initial weights
// on the same global batches under several layouts (`dp<N>` plain data parallelism over N ranks,
// `t<T>` tensor parallelism over T ranks per replica, `s` with sequence parallelism, `c<C>` context
// parallelism over C ranks per sequence (ring attention; `c<C>u` Ulysses), `e<E>` a MoE model's
// experts split over E of the dp x cp ranks (expert parallelism), `p<P>` a pipeline of P
// ranks with an optional schedule (`p2-zb-v`; 1f1b by default), `z<S>` ZeRO stage S, `h<G>` HSDP
// with shard groups of G ranks: dp2t2sz1 is 4 ranks, dp2t2p2 8, dp1c4 4) and compares per-step
// losses, gradient norms and the final (logical) parameters against the first layout: layouts with
// the same dp, tp, sequence and context parallelism must agree bit for bit (ZeRO only changes where
// state lives, not the arithmetic), others within --tolerance (the gradient sum order differs
// between dp counts, the row-parallel layers' sums between tp counts, the attention's partial
// results are merged across the cp ranks), and so must HSDP (it sums within groups first). Ranks
// are threads of this process, or, under mpirun with at least as many processes as the largest
// layout needs, MPI processes (a layout of N ranks runs on world ranks 0..N-1). Prints one line per
// layout and fails with one error line; `--json` prints one JSON object instead of the table (each
// layout's reference, relative differences, verdict and whether it holds), for scripts and tests.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/comm/backends/mpi.hpp"
#include "lattice/comm/launch.hpp"
#include "lattice/core/error.hpp"
#include "lattice/train/trainer.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

struct Layout {
  std::string name;
  int dp = 1;
  int tp = 1;
  bool sp = false;  // sequence parallelism (with tp > 1)
  int zero = 0;
  int hsdp = 0;  // shard group size (0: not hybrid)
  int pp = 1;    // pipeline ranks
  std::string schedule = "1f1b";
  int cp = 1;            // context-parallel ranks per sequence
  bool ulysses = false;  // context_parallel.mode = ulysses (else ring)
  int ep = 1;            // expert-parallel ranks (carved out of dp x cp: adds none)
  int ranks() const { return dp * tp * pp * cp; }
};

std::vector<Layout> parse_layouts(const std::string& text) {
  std::vector<Layout> layouts;
  const std::regex pattern(
      R"(dp(\d+)(?:t(\d+)(s?))?(?:c(\d+)(u?))?(?:e(\d+))?(?:p(\d+)(?:-(gpipe|1f1b|interleaved|zb-h1|zb-v))?)?(?:z(\d+))?(?:h(\d+))?)");
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    std::smatch m;
    check(std::regex_match(item, m, pattern),
          "layout '" + item +
              "' is not understood: write "
              "dp<N>[t<tp>[s]][c<cp>[u]][e<ep>][p<pp>[-schedule]][z<stage>][h<group>], e.g. "
              "\"dp1,dp2,dp2z1,dp1t2,dp1t2s,dp2t2z3,dp4z3h2,dp1p2,dp2t2p2-zb-v,dp1c2,dp1c2u,"
              "dp2e2\"");
    Layout layout{item,
                  std::stoi(m[1].str()),
                  m[2].matched ? std::stoi(m[2].str()) : 1,
                  m[3].matched && m[3].length() > 0,
                  m[9].matched ? std::stoi(m[9].str()) : 0,
                  m[10].matched ? std::stoi(m[10].str()) : 0,
                  m[7].matched ? std::stoi(m[7].str()) : 1,
                  m[8].matched ? m[8].str() : "1f1b",
                  m[4].matched ? std::stoi(m[4].str()) : 1,
                  m[5].matched && m[5].length() > 0,
                  m[6].matched ? std::stoi(m[6].str()) : 1};
    check(layout.ep >= 1 && (layout.dp * layout.cp) % layout.ep == 0,
          "layout '" + item + "': e<ep> must divide the dp x cp ranks");
    check(layout.cp >= 1, "layout '" + item + "': c<cp> needs at least one context-parallel rank");
    check(layout.pp >= 1, "layout '" + item + "': p<pp> needs at least one pipeline rank");
    check(layout.pp == 1 || layout.zero < 3,
          "layout '" + item + "': ZeRO-3 with a pipeline is refused (see parallelism.zero)");
    check(!layout.sp || layout.tp > 1,
          "layout '" + item + "': sequence parallelism (s) needs t<tp> with tp > 1");
    check(layout.dp >= 1 && layout.tp >= 1, "layout '" + item + "' needs at least one rank");
    check(layout.zero >= 0 && layout.zero <= 3,
          "layout '" + item + "': ZeRO stage must be 0, 1, 2 or 3");
    check(layout.hsdp == 0 || (layout.zero >= 1 && layout.dp % layout.hsdp == 0),
          "layout '" + item + "': HSDP needs a ZeRO stage and a group size that divides the ranks");
    layouts.push_back(layout);
    start = comma + 1;
  }
  check(!layouts.empty(), "--layouts is empty: give e.g. \"dp1,dp2,dp2z1\"");
  return layouts;
}

struct Outcome {
  std::vector<double> losses, grad_norms;
  std::vector<float> parameters;
};

train::TrainConfig layout_config(const train::TrainConfig& base, const Layout& layout) {
  train::TrainConfig c = base;
  const int64_t per_step = c.training.global_batch_size / c.training.gradient_accumulation_steps;
  check(per_step % layout.dp == 0,
        "layout " + layout.name + ": global_batch_size / gradient_accumulation_steps = " +
            std::to_string(per_step) + " is not divisible by " + std::to_string(layout.dp) +
            " ranks: choose a global batch every layout divides");
  c.parallelism.dp = layout.dp;
  c.parallelism.tp = layout.tp;
  c.parallelism.sequence_parallel = layout.sp;
  c.parallelism.zero = layout.zero;
  c.parallelism.hsdp_shard_size = layout.hsdp;
  c.parallelism.pp = layout.pp;
  c.parallelism.cp = layout.cp;
  c.parallelism.ep = layout.ep;
  c.context_parallel.mode =
      layout.ulysses ? parallel::ContextParallelMode::ulysses : parallel::ContextParallelMode::ring;
  c.parallelism.pipeline_schedule = layout.schedule;
  // The schedule's own virtual stages: 2 for interleaved and zb-v.
  c.parallelism.virtual_stages =
      layout.schedule == "interleaved" || layout.schedule == "zb-v" ? 2 : 1;
  c.training.micro_batch_size = per_step / layout.dp;
  c.checkpoint.enable = false;
  c.checkpoint.resume = false;
  c.metrics.jsonl = false;
  c.validation.freq = 0;
  c.metrics.log_freq = c.training.steps;
  c.job.run_dir = (std::filesystem::path(base.job.run_dir) / ("parity-" + layout.name)).string();
  return c;
}

// Runs one layout on `group` (null: a one-rank private group); fills `out` on group rank 0.
void run_layout(const train::TrainConfig& config, comm::Communicator* group, Outcome& out) {
  train::Trainer trainer(config, group);
  train::TrainResult result = trainer.run();
  std::vector<float> logical = trainer.logical_parameters();
  if (group && group->rank() != 0) return;
  out.losses = result.losses;
  out.grad_norms = result.grad_norms;
  out.parameters = std::move(logical);
}

double max_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]) / std::max(std::abs(b[i]), 1e-30));
  return worst;
}

// Largest |a - b| relative to the largest |b| (parameters near zero make elementwise ratios
// meaningless).
double max_relative_to_scale(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

void run_parity(const std::string& config_path, const std::vector<std::string>& overrides,
                const std::string& layout_text, double tolerance, bool json) {
  const std::vector<Layout> layouts = parse_layouts(layout_text);
  train::TrainConfig base = train::load_train_config(config_path, overrides);
  check(base.parallelism.dp == 1,
        "lattice parity sets the ranks per layout: leave parallelism.dp at 1");
  // Between rank counts (the gradient sum order differs): relative 1e-4 in fp32. In bf16 every
  // GEMM reads the weights rounded to bf16, and a last-bit difference in an fp32 weight moves its
  // rounding by one bf16 step (2^-8 relative) where it sits on a boundary, so the runs drift
  // apart faster: 1e-3 (configs/demo.toml, 5 steps, dp2 against dp1: 5.6e-4).
  if (tolerance <= 0) tolerance = base.training.precision == kernels::Precision::bf16 ? 1e-3 : 1e-4;
  int largest = 1;
  for (const Layout& l : layouts) largest = std::max(largest, l.ranks());

  const comm::LaunchInfo launch = comm::detect_launch();
  const bool mpi =
      base.parallelism.backend == "mpi" ||
      (base.parallelism.backend == "auto" && launch.launched() && launch.world_size > 1);
  std::unique_ptr<comm::MpiSession> session;
  std::unique_ptr<comm::Communicator> world;
  if (mpi) {
    session = std::make_unique<comm::MpiSession>();
    world = session->world();
    check(world->size() >= largest, "the largest layout needs " + std::to_string(largest) +
                                        " ranks but mpirun started " +
                                        std::to_string(world->size()) + ": raise -np");
  }
  const bool printing = !world || world->rank() == 0;
  const int total_threads =
      base.training.threads > 0 ? static_cast<int>(base.training.threads) : omp_get_num_procs();

  std::vector<Outcome> outcomes(layouts.size());
  for (size_t i = 0; i < layouts.size(); ++i) {
    const train::TrainConfig config = layout_config(base, layouts[i]);
    const int ranks = layouts[i].ranks();
    if (world) {
      std::unique_ptr<comm::Communicator> group =
          world->split(world->rank() < ranks ? 0 : -1, world->rank());
      if (group) {
        omp_set_num_threads(std::max(1, total_threads / std::max(1, launch.local_size)));
        run_layout(config, ranks == 1 ? nullptr : group.get(), outcomes[i]);
      }
      world->barrier();
    } else {
      comm::run_local_ranks_or_inline(ranks, [&](comm::Communicator* group) {
        omp_set_num_threads(std::max(1, total_threads / ranks));
        run_layout(config, group, outcomes[i]);
      });
    }
  }
  if (!printing) return;

  if (!json) {
    std::printf("parity of %zu layouts, %lld steps, global batch %lld (%s backend)\n",
                layouts.size(), static_cast<long long>(base.training.steps),
                static_cast<long long>(base.training.global_batch_size), mpi ? "mpi" : "local");
  }
  int width = 10;  // the layout column: as wide as the longest name
  for (const Layout& l : layouts) width = std::max(width, static_cast<int>(l.name.size()));
  if (!json) {
    std::printf("%-*s %-10s %14s %14s %14s  %s\n", width, "layout", "reference", "loss rel",
                "norm rel", "param rel", "verdict");
  }
  nlohmann::json report = {
      {"steps", base.training.steps},
      {"global_batch_size", base.training.global_batch_size},
      {"backend", mpi ? "mpi" : "local"},
      {"precision", std::string(kernels::precision_name(base.training.precision))},
      {"tolerance", tolerance},
      {"layouts", nlohmann::json::array()}};
  std::string failures;
  for (size_t i = 0; i < layouts.size(); ++i) {
    // The reference: the first layout with the same dp, tp, sequence and context parallelism,
    // one with the same expert parallelism first (bit-equality unless either is HSDP, whose
    // two-level reduction adds in another order), else the first.
    size_t ref = 0;
    bool matched = false;
    for (size_t j = 0; j < i; ++j) {
      if (layouts[j].dp != layouts[i].dp || layouts[j].tp != layouts[i].tp ||
          layouts[j].sp != layouts[i].sp || layouts[j].cp != layouts[i].cp ||
          layouts[j].ulysses != layouts[i].ulysses)
        continue;
      if (!matched || (layouts[j].ep == layouts[i].ep && layouts[ref].ep != layouts[i].ep)) ref = j;
      matched = true;
    }
    // Expert parallelism computes each copy in a GEMM with other ranks' copies beside it, whose
    // row count moves the blocking and so the rounding: against another ep, the tolerance.
    bool exact = matched && layouts[i].hsdp == 0 && layouts[ref].hsdp == 0 &&
                 layouts[i].ep == layouts[ref].ep;
    // A pipeline runs each microbatch's arithmetic unchanged, so losses and weights stay bit for
    // bit; the gradient norm's double partial sums are added per stage and then across stages
    // (relative 1e-12 covers that regrouping: measured 2e-16). Tied embeddings are the exception:
    // the first and last stage each accumulate their half of the tied gradient and add the two,
    // where one rank adds the head's and the embedding's parts microbatch by microbatch, so a
    // tied model is held to the tolerance.
    const bool pipelined = layouts[i].pp != layouts[ref].pp;
    if (pipelined && base.model.tied_embeddings) exact = false;
    const Outcome &a = outcomes[i], &b = outcomes[ref];
    const double loss = max_relative(a.losses, b.losses),
                 norm = max_relative(a.grad_norms, b.grad_norms);
    const double param = max_relative_to_scale(a.parameters, b.parameters);
    const bool bits = a.losses == b.losses && a.parameters == b.parameters &&
                      (pipelined ? norm <= 1e-12 : a.grad_norms == b.grad_norms);
    bool ok =
        i == 0 || (exact ? bits : loss <= tolerance && norm <= tolerance && param <= tolerance);
    // The verdict, as the table words it and as the JSON names it.
    const char* verdict =
        i == 0  ? "reference"
        : exact ? (bits ? (pipelined ? "bit-identical weights" : "bit-identical") : "DIFFERS")
                : (ok ? "within tolerance" : "OUT OF TOLERANCE");
    const char* verdict_key =
        i == 0  ? "reference"
        : exact ? (bits ? (pipelined ? "bit_identical_weights" : "bit_identical") : "differs")
                : (ok ? "within_tolerance" : "out_of_tolerance");
    if (json) {
      report["layouts"].push_back({{"layout", layouts[i].name},
                                   {"ranks", layouts[i].ranks()},
                                   {"reference", layouts[ref].name},
                                   {"loss_rel", loss},
                                   {"norm_rel", norm},
                                   {"param_rel", param},
                                   {"exact_expected", i == 0 || exact},
                                   {"verdict", verdict_key},
                                   {"ok", ok}});
    } else {
      std::printf("%-*s %-10s %14.3e %14.3e %14.3e  %s\n", width, layouts[i].name.c_str(),
                  layouts[ref].name.c_str(), loss, norm, param, verdict);
    }
    if (!ok) failures += (failures.empty() ? "" : ", ") + layouts[i].name;
  }
  if (json) {
    report["ok"] = failures.empty();
    std::printf("%s\n", report.dump().c_str());
  }
  std::fflush(stdout);
  check(failures.empty(), "parity failed for " + failures +
                              " (bit-identical expected for the same "
                              "dp, tp and sequence parallelism, weights bit-identical for an "
                              "untied model's pipeline, relative " +
                              std::to_string(tolerance) + " otherwise)");
  if (!json) std::printf("parity ok\n");
}

}  // namespace

void register_parity_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand(
      "parity", "Train one config under several parallel layouts and compare the results");
  auto config_path = std::make_shared<std::string>();
  auto layouts = std::make_shared<std::string>("dp1,dp2,dp2z1,dp2z2,dp2z3");
  auto tolerance = std::make_shared<double>(0.0);
  auto json = std::make_shared<bool>(false);
  verb->add_option("config", *config_path, "TOML configuration file");
  verb->add_option(
          "--layouts", *layouts,
          "comma-separated dp<N>[t<tp>[s]][c<cp>[u]][e<ep>][p<pp>[-schedule]][z<stage>][h<group>] "
          "layouts (s: "
          "sequence parallelism; schedules gpipe, 1f1b, interleaved, zb-h1, zb-v)")
      ->capture_default_str();
  verb->add_option("--tolerance", *tolerance,
                   "relative tolerance between different rank counts (sum order differs); "
                   "default 1e-4 in fp32, 1e-3 in bf16");
  verb->add_flag("--json", *json,
                 "print one JSON object (every layout's reference, relative differences, verdict "
                 "and ok) instead of the table");
  verb->allow_extras();
  verb->callback([verb, config_path, layouts, tolerance, json] {
    std::vector<std::string> overrides;
    for (const std::string& arg : verb->remaining()) {
      check(arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos,
            "unexpected argument '" + arg + "': overrides look like --section.key=value");
      overrides.push_back(arg);
    }
    run_parity(*config_path, overrides, *layouts, *tolerance, *json);
  });
}

}  // namespace lattice::cli
