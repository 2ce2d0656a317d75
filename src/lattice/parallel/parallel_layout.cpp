// Parallel layouts: description, rank grid and the one validation (see parallel_layout.hpp).
#include "lattice/parallel/parallel_layout.hpp"

#include "lattice/core/error.hpp"

namespace lattice::parallel {

namespace {

std::string str(long value) {
  return std::to_string(value);
}

}  // namespace

mesh::MeshShape ParallelLayout::mesh_shape() const {
  mesh::MeshShape shape;
  shape.pp = pp;
  shape.dp = dp;
  shape.cp = cp;
  shape.tp = tp;
  shape.ep = ep;
  return shape;
}

std::string ParallelLayout::describe() const {
  std::string text = "dp=" + str(dp) + " tp=" + str(tp) + " pp=" + str(pp);
  if (cp > 1) text += " cp=" + str(cp);
  if (ep > 1) text += " ep=" + str(ep);
  text += " zero=" + str(zero_stage);
  if (hsdp_shard_size > 0) text += " hsdp=" + str(hsdp_shard_size);
  if (sequence_parallel) text += " sp";
  text += " mb=" + str(micro_batch_size);
  if (pp > 1) {
    text += ' ';
    text += pipeline::schedule_kind_name(schedule);
    if (virtual_stages > 1 && schedule == pipeline::ScheduleKind::kInterleaved)
      text += "x" + str(virtual_stages);
  }
  text += " recompute=" + model::recompute_name(recompute);
  if (recompute == Recompute::kFull && recompute_interval > 1)
    text += "/" + str(recompute_interval);
  if (flash_attention) text += " flash";
  return text;
}

void validate_layout(const model::ModelConfig& model, int64_t seq_len, const ParallelLayout& l,
                     int devices_per_node) {
  model.validate();
  check(seq_len > 0,
        "the sequence length (training.seq_len, --seq-len) must be positive, got " + str(seq_len));
  for (auto [name, value] :
       {std::pair{"tp", l.tp}, {"pp", l.pp}, {"cp", l.cp}, {"ep", l.ep}, {"dp", l.dp}})
    check(value >= 1, std::string("parallelism.") + name + " = " + str(value) +
                          " is not a parallel degree: use 1 or more");
  check(l.zero_stage >= 0 && l.zero_stage <= 3,
        "parallelism.zero = " + str(l.zero_stage) +
            " is not a ZeRO stage: use 0 (plain data parallelism), 1, 2 or 3");
  check(l.hsdp_shard_size >= 0 && (l.hsdp_shard_size == 0 || l.dp % l.hsdp_shard_size == 0),
        "parallelism.hsdp_shard_size = " + str(l.hsdp_shard_size) +
            " must divide parallelism.dp = " + str(l.dp) + " (0 shards over every rank)");
  check(
      l.hsdp_shard_size == 0 || l.zero_stage >= 1,
      "parallelism.hsdp_shard_size needs a ZeRO stage to shard with: set parallelism.zero to 1, 2 "
      "or 3");
  l.activation_checkpoint().validate();
  check(model.n_heads % l.tp == 0, "parallelism.tp = " + str(l.tp) + " does not divide the " +
                                       str(model.n_heads) +
                                       " attention heads (model.n_heads): pick a divisor");
  check(model.n_kv_heads % l.tp == 0 || l.tp % model.n_kv_heads == 0,
        "parallelism.tp = " + str(l.tp) + " and the " + str(model.n_kv_heads) +
            " key/value heads (model.n_kv_heads) do not divide one another: pick a tp that does");
  check(model.ffn_hidden % l.tp == 0,
        "parallelism.tp = " + str(l.tp) + " does not divide the MLP width " +
            str(model.ffn_hidden) + " (model.ffn_hidden): pick a tp that divides it");
  check(!l.sequence_parallel || l.tp > 1,
        "sequence parallelism splits the sequence over the tensor-parallel ranks: set "
        "parallelism.tp > 1, or turn parallelism.sequence_parallel (--sp) off");
  check(!l.sequence_parallel || seq_len % l.tp == 0,
        "sequence parallelism splits each sequence over parallelism.tp = " + str(l.tp) +
            " ranks, which does not divide the sequence length " + str(seq_len) +
            " (training.seq_len): pick a tp that divides it");
  if (devices_per_node > 0)
    check(l.tp <= devices_per_node,
          "parallelism.tp = " + str(l.tp) + " exceeds the " + str(devices_per_node) +
              " devices of a node: keep tensor parallelism inside a node");
  const int chunks = l.pp * l.virtual_stages;
  // Layer counts the stages do not divide split unevenly (pipeline/stage_partition.hpp: the
  // remainder on the middle stages, e.g. 126 layers on 16 stages).
  check(model.n_layers >= chunks,
        "parallelism.pp = " + str(l.pp) + " x virtual stages " + str(l.virtual_stages) + " = " +
            str(chunks) + " stages need at least one block each, but the model has " +
            str(model.n_layers) + " layers (model.n_layers): lower pp or the virtual stages");
  // Context parallelism's causal load balancing cuts each sequence into 2 x cp equal chunks.
  check(seq_len % (2 * l.cp) == 0 || l.cp == 1,
        "training.seq_len = " + str(seq_len) +
            " cannot be split over parallelism.cp = " + str(l.cp) +
            " ranks: the causal load balancing cuts each sequence into 2 x cp = " + str(2 * l.cp) +
            " equal chunks; pick a seq_len divisible by " + str(2 * l.cp));
  check(model.is_moe() || l.ep == 1,
        "parallelism.ep = " + str(l.ep) +
            " needs a mixture-of-experts model (model.n_experts > 1) and this one is dense: set "
            "parallelism.ep = 1");
  check((l.dp * l.cp) % l.ep == 0, "parallelism.ep = " + str(l.ep) + " must divide dp x cp = " +
                                       str(l.dp * l.cp) + " (experts are carved out of dp x cp)");
  check(model.n_experts % l.ep == 0, "parallelism.ep = " + str(l.ep) + " does not divide the " +
                                         str(model.n_experts) + " experts (model.n_experts)");
  check(l.micro_batch_size >= 1 && l.global_batch_size >= 1,
        "training.micro_batch_size and training.global_batch_size must be at least 1");
  check(l.global_batch_size % (l.micro_batch_size * l.dp) == 0,
        "training.global_batch_size (" + str(l.global_batch_size) +
            ") is not divisible by micro_batch_size (" + str(l.micro_batch_size) + ") x dp (" +
            str(l.dp) + "): change global_batch_size or micro_batch_size");
  if (l.pp > 1 && l.schedule == pipeline::ScheduleKind::kInterleaved) {
    check(l.virtual_stages >= 2, "the interleaved schedule needs virtual_stages >= 2");
    check(l.num_microbatches() % l.pp == 0, "the interleaved schedule needs microbatches (" +
                                                str(l.num_microbatches()) +
                                                ") to be a multiple of pp (" + str(l.pp) + ")");
  } else if (l.pp > 1 && l.schedule == pipeline::ScheduleKind::kZeroBubbleV) {
    check(l.virtual_stages == 2, "the zb-v schedule runs exactly 2 virtual stages per rank");
  } else {
    check(l.virtual_stages == 1,
          "virtual_stages > 1 needs the interleaved or zb-v schedule with pp > 1");
  }
}

}  // namespace lattice::parallel
