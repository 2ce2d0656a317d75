// Linear layer: see linear.hpp.
#include "lattice/model/linear.hpp"

#include <string>

#include "lattice/core/error.hpp"

namespace lattice::model {

namespace {

// A row piece [first, first + count) must lie in the layer's rows.
void check_row_piece(int64_t rows, int64_t first, int64_t count) {
  check(first >= 0 && count >= 0 && first + count <= rows,
        "Linear: rows [" + std::to_string(first) + ", " + std::to_string(first + count) +
            ") outside the " + std::to_string(rows) +
            " rows of the layer's input (internal error)");
}

// A bf16 tensor of exactly `shape` in the backend's memory, tracked as activations.
void ensure_bf16(Tensor& tensor, Shape shape, const LayerContext& ctx) {
  if (tensor.shape() == shape && tensor.dtype() == DType::bf16 &&
      &tensor.memory() == &ctx.ops.memory())
    return;
  tensor = Tensor(std::move(shape), DType::bf16, ctx.ops.memory(), ctx.tracker,
                  MemoryCategory::activations);
}

}  // namespace

Linear::Linear(ParameterStore& store, const std::string& prefix, int64_t in_features,
               int64_t out_features, bool bias, InitKind init, const LinearSplit& split)
    : store_(&store), in_(in_features), out_(out_features) {
  check(split.blocks == 1 || split.kind == TensorSplit::column,
        "Linear " + prefix + ": output blocks apply to a column split only (internal error)");
  if (!split.splits()) {
    weight_ = store.declare(prefix + ".weight", {out_features, in_features}, init, true);
    if (bias) bias_ = store.declare(prefix + ".bias", {out_features}, InitKind::zeros, false);
    return;
  }
  // This rank's slice of the logical weight [out, in]: rows (column split) or columns (row split),
  // replicated over every axis but tp.
  const mesh::AxisSet not_tp = mesh::AxisSet::all().without(mesh::Axis::tp);
  const bool column = split.kind == TensorSplit::column;
  const TensorShard shard{column ? 0 : 1, split.rank, split.size, column ? split.blocks : 1};
  weight_ = store.declare_shard(prefix + ".weight", {out_features, in_features}, shard, not_tp,
                                init, true);
  const Shape& local = store.info(weight_).shape;
  out_ = local[0];
  in_ = local[1];
  if (!bias) return;
  if (column) {
    bias_ = store.declare_shard(prefix + ".bias", {out_features},
                                TensorShard{0, split.rank, split.size, split.blocks}, not_tp,
                                InitKind::zeros, false);
  } else {
    bias_ = store.declare(prefix + ".bias", {out_features}, InitKind::zeros, false);
    adds_bias_ = split.rank == 0;
  }
}

const float* Linear::forward_bias() const {
  return bias_ >= 0 && adds_bias_ ? store_->value(bias_) : nullptr;
}

void LinearActivations::release() {
  in16.reset();
  rounded_from = nullptr;
  prepared = false;
  shared = false;
  rounded_rows = -1;
}

void Linear::keep_bf16(const LayerContext& ctx, LinearActivations& saved, int64_t rows,
                       int64_t first, kernels::Bf16Operands& keep) {
  ensure_bf16(saved.in16, {rows, in_}, ctx);
  keep.in = saved.in16.data<lattice::bf16>() + first * in_;
  keep.weight = store_->bf16_value(weight_);
  saved.rounded_rows = rows;
}

kernels::WeightOperand Linear::weight_operand(const LayerContext& ctx) {
  const bool bf16 = ctx.precision == kernels::Precision::bf16;
  return {store_->value(weight_), bf16 ? store_->bf16_value(weight_) : nullptr};
}

void Linear::forward(const LayerContext& ctx, LinearActivations& saved, float* out, const float* in,
                     int64_t rows) {
  forward_rows(ctx, saved, out, in, rows, 0, rows);
}

void Linear::forward_rows(const LayerContext& ctx, LinearActivations& saved, float* out,
                          const float* in, int64_t rows, int64_t first, int64_t count) {
  check_row_piece(rows, first, count);
  forward_piece(ctx, saved, out + first * out_, in + first * in_, rows, first, count);
  // The pieces read one input: a backward handed it reuses the kept bf16 rounding.
  if (ctx.precision == kernels::Precision::bf16 && rows > 0 && in_ > 0 && out_ > 0)
    saved.rounded_from = in;
}

void Linear::forward_piece(const LayerContext& ctx, LinearActivations& saved, float* out,
                           const float* in, int64_t rows, int64_t first, int64_t count) {
  check_row_piece(rows, first, count);
  kernels::Bf16Operands keep;
  saved.prepared = false;
  saved.shared = false;
  saved.rounded_from = nullptr;
  if (ctx.precision == kernels::Precision::bf16 && rows > 0 && in_ > 0 && out_ > 0)
    keep_bf16(ctx, saved, rows, first, keep);
  if (count == 0) return;
  ctx.ops.linear_forward(out, in, store_->value(weight_), forward_bias(), count, in_, out_,
                         ctx.precision, keep);
}

void Linear::forward_prepared_rows(const LayerContext& ctx, LinearActivations& saved, float* out,
                                   int64_t rows, int64_t first, int64_t count) {
  check_row_piece(rows, first, count);
  check(saved.in16.shape() == Shape{rows, in_},
        "Linear::forward_prepared_rows without prepare_bf16_input for " + std::to_string(rows) +
            " rows (internal error)");
  kernels::Bf16Operands keep;
  keep_bf16(ctx, saved, rows, first, keep);
  saved.rounded_from = nullptr;
  saved.prepared = true;
  saved.shared = false;
  if (count == 0) return;
  // No fp32 input: the backend reads the prepared bf16 one.
  ctx.ops.linear_forward(out + first * out_, nullptr, store_->value(weight_), forward_bias(), count,
                         in_, out_, ctx.precision, keep);
}

lattice::bf16* Linear::prepare_bf16_input(const LayerContext& ctx, LinearActivations& saved,
                                          int64_t rows) {
  check(ctx.precision == kernels::Precision::bf16,
        "Linear::prepare_bf16_input is for bf16 precision only (internal error)");
  ensure_bf16(saved.in16, {rows, in_}, ctx);
  return saved.in16.data<lattice::bf16>();
}

lattice::bf16* Linear::refill_prepared_input(const LayerContext& ctx, LinearActivations& saved,
                                             int64_t rows) {
  check((saved.prepared || saved.shared) && saved.rounded_rows == rows,
        "Linear::refill_prepared_input without a prepared or shared forward of " +
            std::to_string(rows) + " rows (internal error)");
  ensure_bf16(saved.in16, {rows, in_}, ctx);
  return saved.in16.data<lattice::bf16>();
}

void Linear::forward_prepared(const LayerContext& ctx, LinearActivations& saved, float* out,
                              int64_t rows) {
  forward_prepared_rows(ctx, saved, out, rows, 0, rows);
}

const lattice::bf16* Linear::prepared_input(const LayerContext& ctx, LinearActivations& saved,
                                            int64_t rows, const char* who) {
  check(ctx.precision == kernels::Precision::bf16 && saved.in16.shape() == Shape{rows, in_},
        std::string("Linear::") + who + " without prepare_bf16_input for " + std::to_string(rows) +
            " rows in bf16 (internal error)");
  saved.rounded_rows = rows;
  saved.rounded_from = nullptr;
  saved.prepared = true;
  saved.shared = false;
  return saved.in16.data<lattice::bf16>();
}

void Linear::forward_shared_rows(const LayerContext& ctx, LinearActivations& saved, float* out,
                                 const lattice::bf16* in16, int64_t rows, int64_t first,
                                 int64_t count, const lattice::bf16* piece_in16) {
  check(ctx.precision == kernels::Precision::bf16,
        "Linear::forward_shared_rows is for bf16 precision only (internal error)");
  const lattice::bf16* piece = piece_rows(in16, rows, first, count, piece_in16);
  // The input is the caller's: a copy of this layer's own (from an earlier forward) is dropped,
  // unless it is the very buffer shared (this layer's prepared input, read by the others too).
  if (!saved.in16.empty() && saved.in16.data<lattice::bf16>() != in16) saved.in16.reset();
  saved.rounded_from = nullptr;
  saved.prepared = false;
  saved.shared = true;
  saved.rounded_rows = rows;
  if (count == 0 || in_ == 0 || out_ == 0) return;
  kernels::Bf16Operands keep;
  keep.in = const_cast<lattice::bf16*>(piece);  // read only: the fp32 input is null
  keep.weight = store_->bf16_value(weight_);
  ctx.ops.linear_forward(out + first * out_, nullptr, store_->value(weight_), forward_bias(), count,
                         in_, out_, ctx.precision, keep);
}

void Linear::backward_shared(const LayerContext& ctx, const LinearActivations& saved, float* d_in,
                             const float* d_out, const lattice::bf16* in16, int64_t rows) {
  check(ctx.precision == kernels::Precision::bf16 && saved.shared && saved.rounded_rows == rows,
        "Linear::backward_shared without forward_shared_rows of " + std::to_string(rows) +
            " rows in bf16 (internal error)");
  kernels::Bf16Operands rounded;
  rounded.in = const_cast<lattice::bf16*>(in16);
  rounded.weight = weight_operand(ctx).rounded;
  if (in16 == nullptr) {
    ctx.ops.linear_backward_input(d_in, d_out, store_->value(weight_), rows, in_, out_,
                                  ctx.precision, rounded);
    return;
  }
  ctx.ops.linear_backward(d_in, store_->grad(weight_), bias_grad(), d_out, nullptr,
                          store_->value(weight_), rows, in_, out_, ctx.precision, rounded);
}

void Linear::forward_prepared_to_bf16(const LayerContext& ctx, LinearActivations& saved,
                                      lattice::bf16* out16, int64_t rows) {
  forward_prepared_to_bf16_rows(ctx, saved, out16, rows, 0, rows, nullptr);
}

void Linear::forward_prepared_to_bf16_rows(const LayerContext& ctx, LinearActivations& saved,
                                           lattice::bf16* out16, int64_t rows, int64_t first,
                                           int64_t count, const lattice::bf16* piece_in16) {
  const lattice::bf16* in16 = piece_rows(
      prepared_input(ctx, saved, rows, "forward_prepared_to_bf16"), rows, first, count, piece_in16);
  if (count == 0) return;
  ctx.ops.linear_forward_to_bf16(out16 + first * out_, in16, weight_operand(ctx), forward_bias(),
                                 count, in_, out_);
}

void Linear::forward_prepared_gelu_bf16(const LayerContext& ctx, LinearActivations& saved,
                                        lattice::bf16* gelu16, lattice::bf16* slope16,
                                        int64_t rows) {
  forward_prepared_gelu_bf16_rows(ctx, saved, gelu16, slope16, rows, 0, rows, nullptr);
}

void Linear::forward_prepared_gelu_bf16_rows(const LayerContext& ctx, LinearActivations& saved,
                                             lattice::bf16* gelu16, lattice::bf16* slope16,
                                             int64_t rows, int64_t first, int64_t count,
                                             const lattice::bf16* piece_in16) {
  const lattice::bf16* in16 =
      piece_rows(prepared_input(ctx, saved, rows, "forward_prepared_gelu_bf16"), rows, first, count,
                 piece_in16);
  if (count == 0) return;
  ctx.ops.linear_gelu_forward_bf16(gelu16 + first * out_, slope16 + first * out_, in16,
                                   weight_operand(ctx), forward_bias(), count, in_, out_);
}

const lattice::bf16* Linear::piece_rows(const lattice::bf16* in16, int64_t rows, int64_t first,
                                        int64_t count, const lattice::bf16* piece_in16) const {
  check_row_piece(rows, first, count);
  return piece_in16 != nullptr ? piece_in16 : in16 + first * in_;
}

const lattice::bf16* Linear::kept_input(const LayerContext& ctx, const LinearActivations& saved,
                                        const float* in, int64_t rows) {
  const lattice::bf16* kept_in = nullptr;
  const bool kept = saved.prepared || (saved.rounded_from != nullptr && saved.rounded_from == in);
  if (ctx.precision == kernels::Precision::bf16 && kept && saved.rounded_rows == rows) {
    kept_in = saved.in16.data<lattice::bf16>();
  }
  check(!saved.prepared || kept_in != nullptr,
        "Linear::backward after forward_prepared needs bf16 precision and the same rows (internal "
        "error)");
  return kept_in;
}

void Linear::backward(const LayerContext& ctx, const LinearActivations& saved, float* d_in,
                      const float* d_out, const float* in, int64_t rows) {
  float* d_bias = bias_grad();
  kernels::Bf16Operands rounded;
  rounded.in = const_cast<lattice::bf16*>(kept_input(ctx, saved, in, rows));
  rounded.weight = weight_operand(ctx).rounded;
  ctx.ops.linear_backward(d_in, store_->grad(weight_), d_bias, d_out, in, store_->value(weight_),
                          rows, in_, out_, ctx.precision, rounded);
}

void Linear::backward_input(const LayerContext& ctx, const LinearActivations& saved, float* d_in,
                            const float* d_out, int64_t rows) {
  (void)saved;  // the input gradient reads only d_out and the weight
  kernels::Bf16Operands rounded;
  rounded.weight = weight_operand(ctx).rounded;
  ctx.ops.linear_backward_input(d_in, d_out, store_->value(weight_), rows, in_, out_, ctx.precision,
                                rounded);
}

void Linear::backward_weight(const LayerContext& ctx, const LinearActivations& saved,
                             const float* d_out, const float* in, int64_t rows) {
  kernels::Bf16Operands rounded;
  rounded.in = const_cast<lattice::bf16*>(kept_input(ctx, saved, in, rows));
  rounded.weight = weight_operand(ctx).rounded;
  ctx.ops.linear_backward_weight(store_->grad(weight_), bias_grad(), d_out, in,
                                 store_->value(weight_), rows, in_, out_, ctx.precision, rounded);
}

void Linear::backward_rounded(const LayerContext& ctx, const LinearActivations& saved, float* d_in,
                              const lattice::bf16* d_out16, const float* in, int64_t rows) {
  check(ctx.precision == kernels::Precision::bf16,
        "Linear::backward_rounded is for bf16 precision only (internal error)");
  kernels::Bf16Operands rounded;
  rounded.in = const_cast<lattice::bf16*>(kept_input(ctx, saved, in, rows));
  rounded.d_out = d_out16;
  rounded.weight = weight_operand(ctx).rounded;
  ctx.ops.linear_backward(d_in, store_->grad(weight_), nullptr, nullptr, in, store_->value(weight_),
                          rows, in_, out_, ctx.precision, rounded);
}

void Linear::backward_input_rounded(const LayerContext& ctx, float* d_in,
                                    const lattice::bf16* d_out16, int64_t rows) {
  check(ctx.precision == kernels::Precision::bf16,
        "Linear::backward_input_rounded is for bf16 precision only (internal error)");
  kernels::Bf16Operands rounded;
  rounded.d_out = d_out16;
  rounded.weight = weight_operand(ctx).rounded;
  ctx.ops.linear_backward_input(d_in, nullptr, store_->value(weight_), rows, in_, out_,
                                ctx.precision, rounded);
}

void Linear::backward_input_through_gelu_bf16(const LayerContext& ctx, lattice::bf16* d_pre16,
                                              float* pre_bias_grad, const lattice::bf16* d_out16,
                                              const lattice::bf16* slope16, int64_t rows) {
  check(ctx.precision == kernels::Precision::bf16,
        "Linear::backward_input_through_gelu_bf16 is for bf16 precision only (internal error)");
  ctx.ops.linear_backward_input_through_gelu_bf16(d_pre16, pre_bias_grad, d_out16,
                                                  weight_operand(ctx), slope16, rows, in_, out_);
}

float* Linear::bias_grad() {
  return bias_ >= 0 ? store_->grad(bias_) : nullptr;
}

}  // namespace lattice::model
