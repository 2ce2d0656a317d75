// The `lattice simulate` verb: replays one layout's training step with the cost model and prints
// step time, TFLOP/s, MFU, bubble, exposed communication and memory; `--trace` writes a Chrome
// trace and small pipelines get an ASCII timeline. Parses options and prints; the simulator lives
// in lattice/plan.
#include <cstdio>
#include <memory>

#include "lattice/plan/cli_options.hpp"
#include "lattice/plan/report.hpp"
#include "lattice/plan/simulator.hpp"
#include "lattice/plan/timeline.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

struct SimulateOptions {
  plan::cli::ModelOptions model;
  plan::cli::LayoutOptions layout;
  plan::cli::HardwareOptions hardware;
  std::string trace_path;
  bool json = false;
  int timeline_width = 96;
};

void run_simulate(const SimulateOptions& o) {
  const plan::ModelSpec model = plan::cli::resolve_model(o.model);
  const plan::ParallelLayout layout = plan::cli::resolve_layout(o.layout);
  const plan::HardwareSpec hw = plan::cli::resolve_hardware(o.hardware);
  const plan::SimulationResult result = plan::simulate(model, layout, hw);
  if (!o.trace_path.empty()) plan::write_chrome_trace(o.trace_path, result, layout);
  if (o.json) {
    auto json = plan::simulation_json(model, layout, hw, result);
    if (!o.trace_path.empty()) json["trace"] = o.trace_path;
    std::printf("%s\n", json.dump(2).c_str());
    return;
  }
  std::printf("%s", plan::simulation_text(model, layout, hw, result).c_str());
  if (layout.pp > 1 && layout.pp <= 16 && layout.num_microbatches() <= 64)
    std::printf("\n%s", plan::ascii_timeline(result.replay, o.timeline_width).c_str());
  if (!o.trace_path.empty()) std::printf("trace written to %s\n", o.trace_path.c_str());
}

}  // namespace

void register_simulate_verb(CLI::App& app) {
  CLI::App* verb =
      app.add_subcommand("simulate", "Simulate one training step of a parallel layout");
  auto options = std::make_shared<SimulateOptions>();
  plan::cli::add_model_options(*verb, options->model);
  plan::cli::add_layout_options(*verb, options->layout);
  plan::cli::add_hardware_options(*verb, options->hardware);
  verb->add_option("--trace", options->trace_path,
                   "write the simulated timeline as a Chrome trace");
  verb->add_option("--timeline-width", options->timeline_width, "columns of the ASCII timeline");
  verb->add_flag("--json", options->json, "print JSON");
  verb->callback([options] { run_simulate(*options); });
}

}  // namespace lattice::cli
