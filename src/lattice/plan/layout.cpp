// Parallel layouts: names, description and validation (see layout.hpp).
#include "lattice/plan/layout.hpp"

#include "lattice/core/error.hpp"

namespace lattice::plan {

std::string recompute_name(Recompute recompute) {
  switch (recompute) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::kNone;
  if (name == "selective") return Recompute::kSelective;
  if (name == "full") return Recompute::kFull;
  throw Error("unknown recompute '" + name + "': use none, selective or full");
}

std::string ParallelLayout::describe() const {
  std::string text =
      "dp=" + std::to_string(dp) + " tp=" + std::to_string(tp) + " pp=" + std::to_string(pp);
  if (cp > 1) text += " cp=" + std::to_string(cp);
  if (ep > 1) text += " ep=" + std::to_string(ep);
  text += " zero=" + std::to_string(zero_stage);
  if (sequence_parallel) text += " sp";
  text += " mb=" + std::to_string(micro_batch_size);
  if (pp > 1) {
    text += " " + pipeline::schedule_kind_name(schedule);
    if (virtual_stages > 1 && schedule == pipeline::ScheduleKind::kInterleaved)
      text += "x" + std::to_string(virtual_stages);
  }
  text += " recompute=" + recompute_name(recompute);
  if (flash_attention) text += " flash";
  return text;
}

void validate_layout(const ModelSpec& model, const ParallelLayout& l, int devices_per_node) {
  validate(model);
  auto s = [](long v) { return std::to_string(v); };
  check(l.dp >= 1 && l.tp >= 1 && l.pp >= 1 && l.cp >= 1 && l.ep >= 1,
        "parallel degrees dp, tp, pp, cp, ep must all be at least 1");
  check(l.zero_stage >= 0 && l.zero_stage <= 3,
        "zero stage must be 0, 1, 2 or 3 (got " + s(l.zero_stage) + ")");
  check(model.heads % l.tp == 0, "tp=" + s(l.tp) + " does not divide the " + s(model.heads) +
                                     " attention heads: pick a divisor");
  check(model.kv_heads % l.tp == 0 || l.tp % model.kv_heads == 0,
        "tp=" + s(l.tp) + " and the " + s(model.kv_heads) + " KV heads do not divide one another");
  check(model.ffn_hidden % l.tp == 0,
        "tp=" + s(l.tp) + " does not divide ffn_hidden " + s(model.ffn_hidden));
  if (devices_per_node > 0)
    check(l.tp <= devices_per_node,
          "tp=" + s(l.tp) + " exceeds the " + s(devices_per_node) +
              " devices of a node: keep tensor parallelism inside a node");
  const int chunks = l.pp * l.virtual_stages;
  check(model.layers % chunks == 0, "pp=" + s(l.pp) + " x virtual stages " + s(l.virtual_stages) +
                                        " does not divide the " + s(model.layers) + " layers");
  check(model.seq_len % l.cp == 0,
        "cp=" + s(l.cp) + " does not divide the sequence length " + s(model.seq_len));
  check((l.dp * l.cp) % l.ep == 0, "ep=" + s(l.ep) + " must divide dp*cp=" + s(l.dp * l.cp) +
                                       " (experts are carved out of dp x cp)");
  check(model.experts % l.ep == 0,
        "ep=" + s(l.ep) + " does not divide the " + s(model.experts) + " experts");
  check(l.micro_batch_size >= 1 && l.global_batch_size >= 1, "batch sizes must be at least 1");
  check(l.global_batch_size % (l.micro_batch_size * l.dp) == 0,
        "global batch " + s(l.global_batch_size) + " is not divisible by micro batch " +
            s(l.micro_batch_size) + " x dp " + s(l.dp) +
            ": change global_batch_size or micro_batch_size");
  if (l.pp > 1 && l.schedule == pipeline::ScheduleKind::kInterleaved) {
    check(l.virtual_stages >= 2, "the interleaved schedule needs virtual_stages >= 2");
    check(l.num_microbatches() % l.pp == 0, "interleaved schedule needs microbatches (" +
                                                s(l.num_microbatches()) +
                                                ") to be a multiple of pp (" + s(l.pp) + ")");
  } else if (l.pp > 1 && l.schedule == pipeline::ScheduleKind::kZeroBubbleV) {
    check(l.virtual_stages == 2, "the zb-v schedule runs exactly 2 virtual stages per rank");
  } else {
    check(l.virtual_stages == 1,
          "virtual_stages > 1 needs the interleaved or zb-v schedule with pp > 1");
  }
}

}  // namespace lattice::plan
