// Communication times: see communication_times.hpp.
#include "lattice/train/communication_times.hpp"

#include "lattice/model/context_parallel.hpp"

namespace lattice::train {

CommunicationTimes& CommunicationTimes::operator+=(const CommunicationTimes& other) {
  dp_exposed_seconds += other.dp_exposed_seconds;
  dp_seconds += other.dp_seconds;
  tp_seconds += other.tp_seconds;
  cp_seconds += other.cp_seconds;
  ep_seconds += other.ep_seconds;
  pp_wait_seconds += other.pp_wait_seconds;
  return *this;
}

CommunicationTimes CommunicationTimes::mean(int64_t steps) const {
  const double n = static_cast<double>(steps);
  CommunicationTimes out;
  out.dp_exposed_seconds = dp_exposed_seconds / n;
  out.dp_seconds = dp_seconds / n;
  out.tp_seconds = tp_seconds / n;
  out.cp_seconds = cp_seconds / n;
  out.ep_seconds = ep_seconds / n;
  out.pp_wait_seconds = pp_wait_seconds / n;
  return out;
}

CommunicationFamilies CommunicationFamilies::of(const mesh::MeshShape& shape) {
  CommunicationFamilies f;
  f.dp = shape.batch_parallel() > 1;
  f.tp = shape.tp > 1;
  f.cp = shape.cp > 1;
  f.ep = shape.ep > 1;
  f.pp = shape.pp > 1;
  return f;
}

void CommunicationClocks::start_step() {
  tp_seconds = 0;
  ep_seconds = 0;
  if (context) context->take_wait_seconds();
}

void CommunicationClocks::finish_step(CommunicationTimes& times) {
  times.tp_seconds = tp_seconds;
  times.ep_seconds = ep_seconds;
  times.cp_seconds = context ? context->take_wait_seconds() : 0.0;
}

}  // namespace lattice::train
