// Expert parallelism's token exchange: see expert_parallel_comm.hpp.
#include "lattice/model/expert_parallel_comm.hpp"

#include <algorithm>
#include <chrono>
#include <string>

#include "lattice/comm/communicator.hpp"
#include "lattice/core/error.hpp"
#include "lattice/core/tensor.hpp"

namespace lattice::model {

namespace {

// Adds the scope's wall time to the group's comm_seconds (when it has one).
class ExchangeTimer {
 public:
  explicit ExchangeTimer(const ExpertParallelGroup& ep)
      : seconds_(ep.comm_seconds), start_(std::chrono::steady_clock::now()) {}
  ~ExchangeTimer() {
    if (seconds_)
      *seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  ExchangeTimer(const ExchangeTimer&) = delete;
  ExchangeTimer& operator=(const ExchangeTimer&) = delete;

 private:
  double* seconds_;
  std::chrono::steady_clock::time_point start_;
};

// The element counts of row counts of C floats.
std::vector<int64_t> elements(const std::vector<int64_t>& rows, int64_t C) {
  std::vector<int64_t> out(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out[i] = rows[i] * C;
  return out;
}

// Where block (s, j) — rank s's copies of local expert j — starts in the source-major order (as
// received) and in the expert-major order (as the experts read them).
struct BlockOffsets {
  std::vector<int64_t> source_major, expert_major;  // [P x L], s-major
};

BlockOffsets block_offsets(const ExpertExchange& plan, int P) {
  const int64_t L = plan.local_experts;
  BlockOffsets o;
  o.source_major.resize(static_cast<size_t>(P * L));
  o.expert_major.resize(o.source_major.size());
  int64_t at = 0;
  for (int s = 0; s < P; ++s)
    for (int64_t j = 0; j < L; ++j) {
      o.source_major[s * L + j] = at;
      at += plan.recv_counts[s * L + j];
    }
  for (int64_t j = 0; j < L; ++j) {
    int64_t row = plan.expert_offsets[j];
    for (int s = 0; s < P; ++s) {
      o.expert_major[s * L + j] = row;
      row += plan.recv_counts[s * L + j];
    }
  }
  return o;
}

}  // namespace

ExpertExchange plan_expert_exchange(const ExpertParallelGroup& ep,
                                    const kernels::MoeDispatch& dispatch) {
  const int P = ep.size;
  const int64_t E = dispatch.experts;
  check(E % P == 0, "model.n_experts = " + std::to_string(E) +
                        " is not divisible by parallelism.ep = " + std::to_string(P) +
                        ": pick an ep that divides the experts");
  const ExchangeTimer timer(ep);
  ExpertExchange plan;
  const int64_t L = E / P;
  plan.local_experts = L;
  std::vector<int64_t> send_counts(static_cast<size_t>(E));  // per expert, grouped by rank
  plan.send_rows.assign(static_cast<size_t>(P), 0);
  for (int64_t e = 0; e < E; ++e) {
    send_counts[e] = dispatch.count(e);
    plan.send_rows[e / L] += send_counts[e];
  }
  plan.recv_counts.assign(static_cast<size_t>(E), 0);
  if (P == 1) {
    plan.recv_counts = send_counts;
  } else {
    ep.comm->all_to_all(send_counts.data(), plan.recv_counts.data(), L, DType::i64);
  }
  plan.recv_rows.assign(static_cast<size_t>(P), 0);
  plan.expert_offsets.assign(static_cast<size_t>(L + 1), 0);
  for (int s = 0; s < P; ++s)
    for (int64_t j = 0; j < L; ++j) {
      plan.recv_rows[s] += plan.recv_counts[s * L + j];
      plan.expert_offsets[j + 1] += plan.recv_counts[s * L + j];
    }
  for (int64_t j = 0; j < L; ++j) plan.expert_offsets[j + 1] += plan.expert_offsets[j];
  return plan;
}

void send_to_experts(const ExpertParallelGroup& ep, const ExpertExchange& plan, kernels::Ops& ops,
                     float* expert_rows, const float* slot_rows, int64_t C) {
  const ExchangeTimer timer(ep);
  const int P = ep.size;
  const int64_t R = plan.received(), L = plan.local_experts;
  Tensor received({std::max<int64_t>(R, 1), C}, DType::f32,
                  ops.memory());  // a rank may receive none
  ep.comm->all_to_all_v(slot_rows, elements(plan.send_rows, C), received.f32(),
                        elements(plan.recv_rows, C), DType::f32);
  const BlockOffsets o = block_offsets(plan, P);
  for (int64_t b = 0; b < P * L; ++b)
    if (plan.recv_counts[b] > 0)
      ops.copy(expert_rows + o.expert_major[b] * C, received.f32() + o.source_major[b] * C,
               plan.recv_counts[b] * C);
}

void return_from_experts(const ExpertParallelGroup& ep, const ExpertExchange& plan,
                         kernels::Ops& ops, float* slot_rows, const float* expert_rows, int64_t C) {
  const ExchangeTimer timer(ep);
  const int P = ep.size;
  const int64_t R = plan.received(), L = plan.local_experts;
  Tensor outgoing({std::max<int64_t>(R, 1), C}, DType::f32, ops.memory());
  const BlockOffsets o = block_offsets(plan, P);
  for (int64_t b = 0; b < P * L; ++b)
    if (plan.recv_counts[b] > 0)
      ops.copy(outgoing.f32() + o.source_major[b] * C, expert_rows + o.expert_major[b] * C,
               plan.recv_counts[b] * C);
  ep.comm->all_to_all_v(outgoing.f32(), elements(plan.recv_rows, C), slot_rows,
                        elements(plan.send_rows, C), DType::f32);
}

}  // namespace lattice::model
