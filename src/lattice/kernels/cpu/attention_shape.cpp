// AttentionShape's constructors and the validation every attention entry point runs first.
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/attention.hpp"
#include "lattice/kernels/cpu/attention_paths.hpp"

namespace lattice::kernels {

AttentionShape AttentionShape::contiguous(int64_t batch, int64_t seq, int64_t q_heads,
                                          int64_t kv_heads, int64_t head_dim) {
  AttentionShape s;
  s.batch = batch;
  s.q_len = seq;
  s.kv_len = seq;
  s.q_heads = q_heads;
  s.kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.q_row_stride = q_heads * head_dim;
  s.k_row_stride = kv_heads * head_dim;
  s.v_row_stride = kv_heads * head_dim;
  s.q_batch_stride = seq * q_heads * head_dim;
  s.kv_batch_stride = seq * kv_heads * head_dim;
  return s;
}

namespace attention_detail {

void validate(const AttentionShape& s, const char* who) {
  const std::string name(who);
  check(s.batch > 0 && s.q_len > 0 && s.kv_len > 0 && s.q_heads > 0 && s.kv_heads > 0 &&
            s.head_dim > 0,
        name + ": batch, q_len, kv_len, heads and head_dim must all be positive");
  check(s.q_heads % s.kv_heads == 0, name + ": q_heads (" + std::to_string(s.q_heads) +
                                         ") must be a multiple of kv_heads (" +
                                         std::to_string(s.kv_heads) + ")");
  check(s.kv_len >= s.q_len, name + ": kv_len (" + std::to_string(s.kv_len) +
                                 ") must be at least q_len (" + std::to_string(s.q_len) + ")");
  check(s.q_row_stride >= s.q_heads * s.head_dim,
        name + ": q_row_stride must be at least q_heads * head_dim");
  check(s.k_row_stride >= s.kv_heads * s.head_dim && s.v_row_stride >= s.kv_heads * s.head_dim,
        name + ": k_row_stride and v_row_stride must be at least kv_heads * head_dim");
}

}  // namespace attention_detail
}  // namespace lattice::kernels
