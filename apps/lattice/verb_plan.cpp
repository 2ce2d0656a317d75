// The `lattice plan` verb: searches parallel layouts for a model on a device type, count and global
// batch, and prints the fastest that fit with one line on why the best wins. Parses options and
// prints; the search lives in lattice/plan.
#include <cstdio>
#include <memory>

#include "lattice/plan/cli_options.hpp"
#include "lattice/plan/planner.hpp"
#include "lattice/plan/report.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

struct PlanOptions {
  plan::cli::ModelOptions model;
  plan::cli::HardwareOptions hardware;
  int gpus = 8;
  int global_batch = 0;
  int top = 5;
  double usable_memory = 0.9;
  bool json = false;
  bool unfused_attention = false;
};

void run_plan(const PlanOptions& o) {
  plan::PlanRequest request;
  request.model = plan::cli::resolve_model(o.model);
  request.hardware = plan::cli::resolve_hardware(o.hardware);
  request.devices = o.gpus;
  request.global_batch_size = o.global_batch > 0 ? o.global_batch : o.gpus;
  request.top = o.top;
  request.usable_memory_fraction = o.usable_memory;
  request.flash_attention = !o.unfused_attention;
  const plan::PlanResult result = plan::plan_layouts(request);
  if (o.json)
    std::printf("%s\n", plan::plan_json(request, result).dump(2).c_str());
  else
    std::printf("%s", plan::plan_text(request, result).c_str());
}

}  // namespace

void register_plan_verb(CLI::App& app) {
  CLI::App* verb =
      app.add_subcommand("plan", "Search parallel layouts and rank them by simulated speed");
  auto options = std::make_shared<PlanOptions>();
  plan::cli::add_model_options(*verb, options->model);
  plan::cli::add_hardware_options(*verb, options->hardware);
  verb->add_option("--gpus", options->gpus, "number of devices");
  verb->add_option("--global-batch", options->global_batch, "sequences per step (default: --gpus)");
  verb->add_option("--top", options->top, "layouts to show");
  verb->add_option("--usable-memory", options->usable_memory,
                   "fraction of device memory a layout may use (default 0.9)");
  verb->add_flag("--no-flash-attention", options->unfused_attention,
                 "plan with unfused attention kernels (as in the Megatron-LM papers)");
  verb->add_flag("--json", options->json, "print JSON");
  verb->callback([options] { run_plan(*options); });
}

}  // namespace lattice::cli
