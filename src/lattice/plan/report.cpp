// Tables and JSON of the planning tools (see report.hpp).
#include "lattice/plan/report.hpp"

#include <cstdio>

namespace lattice::plan {
namespace {

std::string format(const char* pattern, double value) {
  char buffer[96];
  std::snprintf(buffer, sizeof(buffer), pattern, value);
  return buffer;
}

std::string gb(double bytes) {
  return format("%.2f GB", bytes / 1e9);
}

nlohmann::json layout_json(const ParallelLayout& l) {
  return {{"dp", l.dp},
          {"tp", l.tp},
          {"pp", l.pp},
          {"cp", l.cp},
          {"ep", l.ep},
          {"zero_stage", l.zero_stage},
          {"sequence_parallel", l.sequence_parallel},
          {"recompute", recompute_name(l.recompute)},
          {"recompute_interval", l.recompute_interval},
          {"hsdp_shard_size", l.hsdp_shard_size},
          {"schedule", pipeline::schedule_kind_name(l.schedule)},
          {"virtual_stages", l.virtual_stages},
          {"micro_batch_size", l.micro_batch_size},
          {"flash_attention", l.flash_attention},
          {"global_batch_size", l.global_batch_size},
          {"num_microbatches", l.num_microbatches()},
          {"world_size", l.world_size()},
          {"describe", l.describe()}};
}

}  // namespace

int smallest_zero3_device_count(const ModelSpec& model, const HardwareSpec& hw,
                                double usable_fraction) {
  for (int n = 1; n <= 65536; n *= 2) {
    ParallelLayout l;
    l.dp = n;
    l.zero_stage = n > 1 ? 3 : 0;
    l.recompute = Recompute::kFull;
    l.global_batch_size = n;
    if (estimate_memory(model, l).peak().total() <= hw.memory_bytes * usable_fraction) return n;
  }
  return 0;
}

nlohmann::json memory_json(const ModelSpec& model, const ParallelLayout& layout,
                           const MemoryEstimate& memory, const HardwareSpec& hw) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& s : memory.stages)
    stages.push_back({{"stage", s.stage},
                      {"parameters", s.parameters},
                      {"parameter_bytes", s.parameter_bytes},
                      {"gradient_bytes", s.gradient_bytes},
                      {"optimizer_bytes", s.optimizer_bytes},
                      {"activation_bytes", s.activation_bytes},
                      {"temporary_bytes", s.temporary_bytes},
                      {"total_bytes", s.total()}});
  const MinimumDevices need = minimum_devices(model, hw, layout);
  const ParameterCount count = count_parameters(model);
  return {{"model", model.name},
          {"parameters", count.total},
          {"active_parameters", count.active},
          {"layout", layout_json(layout)},
          {"gpu", hw.name},
          {"device_memory_bytes", hw.memory_bytes},
          {"stages", stages},
          {"peak_bytes", memory.peak().total()},
          {"peak_stage", memory.peak().stage},
          {"fits", memory.peak().total() <= hw.memory_bytes},
          {"weight_bytes", need.weight_bytes},
          {"model_state_bytes", need.model_state_bytes},
          {"min_devices_for_weights", need.for_weights},
          {"min_devices_for_model_state", need.for_model_state},
          {"min_zero3_devices_with_activations", smallest_zero3_device_count(model, hw, 1.0)}};
}

std::string memory_text(const ModelSpec& model, const ParallelLayout& layout,
                        const MemoryEstimate& memory, const HardwareSpec& hw) {
  const ParameterCount count = count_parameters(model);
  std::string text = model.name + ": " + format("%.3fB parameters", count.total / 1e9);
  if (model.is_moe()) text += format(" (%.3fB active)", count.active / 1e9);
  text += "\nlayout: " + layout.describe() + "\n\n";
  text += "stage  params/rank   weights    grads      optimizer  activations temporary  total\n";
  for (const auto& s : memory.stages) {
    char line[200];
    std::snprintf(line, sizeof(line), "%5d  %9.3fB  %9.2f  %9.2f  %9.2f  %10.2f  %9.2f  %9.2f GB\n",
                  s.stage, s.parameters / 1e9, s.parameter_bytes / 1e9, s.gradient_bytes / 1e9,
                  s.optimizer_bytes / 1e9, s.activation_bytes / 1e9, s.temporary_bytes / 1e9,
                  s.total() / 1e9);
    text += line;
    if (memory.stages.size() > 8 && s.stage == 3) {
      text += "  ...\n";
      // print only the last stage after the first four
      const auto& last = memory.stages.back();
      std::snprintf(line, sizeof(line),
                    "%5d  %9.3fB  %9.2f  %9.2f  %9.2f  %10.2f  %9.2f  %9.2f GB\n", last.stage,
                    last.parameters / 1e9, last.parameter_bytes / 1e9, last.gradient_bytes / 1e9,
                    last.optimizer_bytes / 1e9, last.activation_bytes / 1e9,
                    last.temporary_bytes / 1e9, last.total() / 1e9);
      text += line;
      break;
    }
  }
  const double peak = memory.peak().total();
  text += "\npeak " + gb(peak) + " on stage " + std::to_string(memory.peak().stage) + "; " +
          hw.name + " has " + gb(hw.memory_bytes) + ": " +
          (peak <= hw.memory_bytes ? "fits" : "does NOT fit") + "\n";
  const MinimumDevices need = minimum_devices(model, hw, layout);
  text += "bf16 weights alone: " + gb(need.weight_bytes) + " -> at least " +
          std::to_string(need.for_weights) + " x " + hw.name + "\n";
  text += "weights + grads + optimizer (" +
          std::to_string(layout.param_bytes + layout.grad_bytes + layout.optimizer_bytes) +
          " bytes/param): " + gb(need.model_state_bytes) + " -> at least " +
          std::to_string(need.for_model_state) + " x " + hw.name +
          " (ZeRO-3, before activations)\n";
  const int zero3 = smallest_zero3_device_count(model, hw, 1.0);
  text +=
      zero3 > 0
          ? "smallest power-of-two count that fits with ZeRO-3, full recompute, microbatch 1: " +
                std::to_string(zero3) + "\n"
          : "does not fit on 65536 devices with ZeRO-3\n";
  return text;
}

nlohmann::json compute_json(const ModelSpec& model, const ComputeReport& r) {
  const ComputeEstimate& e = r.estimate;
  return {{"model", model.name},
          {"flops_per_token", e.flops_per_token},
          {"flops_per_token_6n", 6.0 * count_parameters(model).active},
          {"palm_flops_per_token", palm_flops_per_token(model)},
          {"flops_per_step", e.flops_per_step},
          {"hardware_flops_per_step", e.hardware_flops_per_step},
          {"total_flops", e.total_flops},
          {"total_flops_6nd", e.total_flops_6nd},
          {"pf_days_6nd", e.total_flops_6nd / (1e15 * 86400)},
          {"steps", e.steps},
          {"devices", r.devices},
          {"model_flops_per_device", r.flops_per_device},
          {"throughput_source", r.throughput_source},
          {"seconds", e.seconds},
          {"days", e.days()},
          {"megatron_eq4_days", r.megatron_eq4_seconds / 86400}};
}

std::string compute_text(const ModelSpec& model, const ComputeReport& r) {
  const ComputeEstimate& e = r.estimate;
  const ParameterCount count = count_parameters(model);
  std::string text = model.name + format(": %.3fB parameters", count.total / 1e9) +
                     (model.is_moe() ? format(" (%.3fB active)", count.active / 1e9) : "") + "\n";
  text += "FLOPs per token: 6N " + format("%.4g", 6.0 * count.active) +
          ", with attention and logits " + format("%.4g", e.flops_per_token) + ", PaLM 6N+12LHQT " +
          format("%.4g", palm_flops_per_token(model)) + "\n";
  text += "FLOPs per step: " + format("%.4g", e.flops_per_step) + " model, " +
          format("%.4g", e.hardware_flops_per_step) + " with recomputation\n";
  text += "total for the token budget: " + format("%.3g", e.total_flops_6nd) + " FLOPs by 6ND (" +
          format("%.3g", e.total_flops_6nd / (1e15 * 86400)) + " PF-days), " +
          format("%.3g", e.total_flops) + " with attention; " + format("%.0f", e.steps) +
          " steps\n";
  text += "time on " + std::to_string(r.devices) + " devices at " + r.throughput_source + ": " +
          format("%.1f days", e.days()) +
          " (Megatron eq. 4, 8TP/(nX) with X counting full recompute: " +
          format("%.1f days)", r.megatron_eq4_seconds / 86400) + "\n";
  return text;
}

nlohmann::json simulation_json(const ModelSpec& model, const ParallelLayout& layout,
                               const HardwareSpec& hw, const SimulationResult& r) {
  nlohmann::json memory = nlohmann::json::array();
  for (const auto& s : r.memory.stages) memory.push_back(s.total());
  return {{"model", model.name},
          {"gpu", hw.name},
          {"layout", layout_json(layout)},
          {"step_seconds", r.step_seconds},
          {"pipeline_seconds", r.pipeline_seconds},
          {"dp_exposed_seconds", r.dp_exposed_seconds},
          {"optimizer_seconds", r.optimizer_seconds},
          {"tp_comm_seconds", r.tp_comm_seconds},
          {"exposed_comm_seconds", r.exposed_comm_seconds},
          {"bubble_fraction", r.bubble_fraction},
          {"model_tflops_per_device", r.model_tflops_per_device},
          {"hardware_tflops_per_device", r.hardware_tflops_per_device},
          {"mfu", r.mfu},
          {"hfu", r.hfu},
          {"tokens_per_second", r.tokens_per_second},
          {"memory_bytes_per_stage", memory},
          {"peak_memory_bytes", r.memory.peak().total()},
          {"fits", r.memory.peak().total() <= hw.memory_bytes}};
}

std::string simulation_text(const ModelSpec& model, const ParallelLayout& layout,
                            const HardwareSpec& hw, const SimulationResult& r) {
  std::string text = model.name + " on " + std::to_string(layout.world_size()) + " x " + hw.name +
                     ": " + layout.describe() + "\n";
  text += "step time        " + format("%.3f s", r.step_seconds) + "  (pipeline " +
          format("%.3f s", r.pipeline_seconds) + ", exposed DP " +
          format("%.3f s", r.dp_exposed_seconds) + ", optimizer " +
          format("%.3f s)", r.optimizer_seconds) + "\n";
  text += "throughput       " + format("%.1f", r.model_tflops_per_device) +
          " model TFLOP/s per device (" + format("%.1f", r.hardware_tflops_per_device) +
          " with recompute), " + format("%.0f tokens/s", r.tokens_per_second) + "\n";
  text += "MFU / HFU        " + format("%.1f%%", 100 * r.mfu) + " / " +
          format("%.1f%%", 100 * r.hfu) + "\n";
  text += "pipeline bubble  " + format("%.1f%%", 100 * r.bubble_fraction) + "\n";
  text += "exposed comm     " + format("%.3f s", r.exposed_comm_seconds) + " (TP/CP/EP " +
          format("%.3f s", r.tp_comm_seconds) + ")\n";
  const double peak = r.memory.peak().total();
  text += "memory per rank  " + gb(peak) + " peak (stage " + std::to_string(r.memory.peak().stage) +
          ") of " + gb(hw.memory_bytes) + (peak <= hw.memory_bytes ? "" : "  -- does NOT fit") +
          "\n";
  return text;
}

nlohmann::json plan_json(const PlanRequest& request, const PlanResult& result) {
  nlohmann::json layouts = nlohmann::json::array();
  for (const auto& p : result.best)
    layouts.push_back({{"layout", layout_json(p.layout)},
                       {"step_seconds", p.step_seconds},
                       {"mfu", p.mfu},
                       {"model_tflops_per_device", p.model_tflops_per_device},
                       {"tokens_per_second", p.tokens_per_second},
                       {"bubble_fraction", p.bubble_fraction},
                       {"exposed_comm_seconds", p.exposed_comm_seconds},
                       {"peak_memory_bytes", p.peak_memory_bytes}});
  return {{"model", request.model.name},
          {"gpu", request.hardware.name},
          {"devices", request.devices},
          {"global_batch_size", request.global_batch_size},
          {"considered", result.considered},
          {"fitting", result.fitting},
          {"layouts", layouts},
          {"rationale", result.rationale}};
}

std::string plan_text(const PlanRequest& request, const PlanResult& result) {
  std::string text = "plan for " + request.model.name + " on " + std::to_string(request.devices) +
                     " x " + request.hardware.name + ", global batch " +
                     std::to_string(request.global_batch_size) + ": " +
                     std::to_string(result.considered) + " layouts considered, " +
                     std::to_string(result.fitting) + " fit in memory\n\n";
  text +=
      " #  layout                                                       step (s)   MFU   mem/GPU  "
      "bubble\n";
  int index = 1;
  for (const auto& p : result.best) {
    char line[256];
    std::snprintf(line, sizeof(line), "%2d  %-60s %8.3f  %5.1f%%  %5.1f GB  %5.1f%%\n", index++,
                  p.layout.describe().c_str(), p.step_seconds, 100 * p.mfu,
                  p.peak_memory_bytes / 1e9, 100 * p.bubble_fraction);
    text += line;
  }
  text += "\n" + result.rationale + "\n";
  return text;
}

}  // namespace lattice::plan
