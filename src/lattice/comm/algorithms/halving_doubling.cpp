// Halving-doubling: log2(p) reduce-scatter steps exchanging halves of a shrinking range with
// partner v ^ mask, then log2(p) all-gather steps in reverse; p is the largest power of two <= n.
#include "lattice/comm/algorithms/halving_doubling.hpp"

#include <utility>
#include <vector>

#include "lattice/comm/reduce_kernels.hpp"

namespace lattice::comm {

void halving_doubling_allreduce(Transport& transport, const void* in, void* out, int64_t count,
                                DType dtype, ReduceOp op) {
  const int n = transport.size();
  const int rank = transport.rank();
  const size_t element = dtype_size(dtype);
  const size_t total_bytes = static_cast<size_t>(count) * element;
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  const int divisor = op == ReduceOp::avg ? n : 0;
  auto at = [&](int64_t index) {
    return static_cast<char*>(out) + static_cast<size_t>(index) * element;
  };

  // Fold: among ranks < 2*extra, even ranks hand their data to the odd rank above them.
  int v = -1;  // index among the p core ranks
  if (rank < 2 * extra) {
    if (rank % 2 == 0) {
      transport.send(in, total_bytes, rank + 1);
      transport.recv(out, total_bytes, rank + 1);
      return;
    }
    transport.recv_reduce(out, in, count, dtype, op, rank - 1);
    v = rank / 2;
  } else {
    copy_bytes(out, in, total_bytes);
    v = rank - extra;
  }
  auto real = [&](int core) { return core < extra ? 2 * core + 1 : core + extra; };

  // Recursive halving: keep the lower half when the mask bit is clear.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  int64_t lo = 0, hi = count;
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    int partner = real(v ^ mask);
    int64_t mid = lo + (hi - lo) / 2;
    ranges.emplace_back(lo, hi);
    bool keep_lower = (v & mask) == 0;
    int64_t keep_lo = keep_lower ? lo : mid, keep_hi = keep_lower ? mid : hi;
    int64_t send_lo = keep_lower ? mid : lo, send_hi = keep_lower ? hi : mid;
    transport.sendrecv_reduce(at(send_lo), static_cast<size_t>(send_hi - send_lo) * element,
                              partner, at(keep_lo), at(keep_lo), keep_hi - keep_lo, dtype, op,
                              partner, mask == 1 ? divisor : 0);
    lo = keep_lo;
    hi = keep_hi;
  }
  if (p == 1 && divisor > 0) divide_in_place(out, count, dtype, divisor);

  // Recursive doubling: exchange the owned range with the partner of each level, widest level last.
  for (int mask = 1; mask < p; mask *= 2) {
    auto [level_lo, level_hi] = ranges.back();
    ranges.pop_back();
    int partner = real(v ^ mask);
    int64_t mid = level_lo + (level_hi - level_lo) / 2;
    bool have_lower = (v & mask) == 0;
    int64_t other_lo = have_lower ? mid : level_lo, other_hi = have_lower ? level_hi : mid;
    transport.sendrecv(at(lo), static_cast<size_t>(hi - lo) * element, partner, at(other_lo),
                       static_cast<size_t>(other_hi - other_lo) * element, partner);
    lo = level_lo;
    hi = level_hi;
  }

  // Unfold: give the folded partner the result.
  if (rank < 2 * extra) transport.send(out, total_bytes, rank - 1);
}

}  // namespace lattice::comm
