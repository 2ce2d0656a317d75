// The validation every CPU attention entry point runs first (attention_paths.hpp).
#include <cstdint>
#include <string>

#include "lattice/core/error.hpp"
#include "lattice/kernels/cpu/attention.hpp"
#include "lattice/kernels/cpu/attention_paths.hpp"

namespace lattice::kernels {

namespace attention_detail {

void validate(const AttentionShape& s, const char* who) {
  const std::string name(who);
  const auto text = [](int64_t x) { return std::to_string(x); };
  check(s.batch > 0 && s.q_len > 0 && s.kv_len > 0 && s.q_heads > 0 && s.kv_heads > 0 &&
            s.head_dim > 0,
        name + ": batch (" + text(s.batch) + "), q_len (" + text(s.q_len) + "), kv_len (" +
            text(s.kv_len) + "), q_heads (" + text(s.q_heads) + "), kv_heads (" + text(s.kv_heads) +
            ") and head_dim (" + text(s.head_dim) + ") must all be positive");
  check(s.q_heads % s.kv_heads == 0, name + ": q_heads (" + text(s.q_heads) +
                                         ") must be a multiple of kv_heads (" + text(s.kv_heads) +
                                         ")");
  check(s.q_row_stride >= s.q_heads * s.head_dim,
        name + ": q_row_stride must be at least q_heads * head_dim");
  check(s.v_head_dim >= 0, name + ": v_head_dim (" + text(s.v_head_dim) +
                               ") must be 0 (the value heads are head_dim wide) or positive");
  check(s.k_row_stride >= s.kv_heads * s.head_dim,
        name + ": k_row_stride must be at least kv_heads * head_dim");
  check(s.v_row_stride >= s.kv_heads * s.value_dim(),
        name + ": v_row_stride must be at least kv_heads * value_dim()");
  check(s.v_batch_stride >= 0, name + ": v_batch_stride (" + text(s.v_batch_stride) +
                                   ") must be 0 (kv_batch_stride) or positive");
  check(s.window >= 0, name + ": window (" + text(s.window) +
                           ") must be 0 (no sliding window) or a positive number of keys");
  check(s.window == 0 || s.mask == AttentionMask::causal,
        name +
            ": a sliding window needs the causal mask (set mask = AttentionMask::causal or "
            "window = 0)");
  check(s.mask == AttentionMask::causal || s.mask == AttentionMask::none,
        name + ": mask must be AttentionMask::causal or AttentionMask::none");
  // Positions stay far from int64 overflow however the kernels add lengths to them.
  constexpr int64_t kMaxPosition = int64_t{1} << 48;
  check(s.k_offset >= 0 && s.k_offset < kMaxPosition,
        name + ": k_offset (" + text(s.k_offset) + ") must be a position in [0, 2^48)");
  if (s.q_offset.has_value()) {
    check(*s.q_offset >= 0 && *s.q_offset < kMaxPosition,
          name + ": q_offset (" + text(*s.q_offset) + ") must be a position in [0, 2^48)");
  } else {
    check(s.kv_len >= s.q_len,
          name + ": kv_len (" + text(s.kv_len) + ") is below q_len (" + text(s.q_len) +
              "): without q_offset the queries are the last q_len key positions; set q_offset "
              "for queries that start before the keys");
  }
}

}  // namespace attention_detail
}  // namespace lattice::kernels
