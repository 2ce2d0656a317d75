// The collective correctness suite shared by the local-backend tests and the MPI worker: every
// collective against a serial reference, for given counts, element types and forced algorithms.
// Inputs are small integers, so every reduction order gives bit-identical results in every type.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "lattice/comm/communicator.hpp"
#include "lattice/comm/half.hpp"

namespace lattice::comm::testing {

inline const std::vector<DType>& all_dtypes() {
  static const std::vector<DType> types = {DType::f32, DType::bf16, DType::f16, DType::i32,
                                           DType::i64};
  return types;
}

// Rank r's input element i: an integer in [-5, 5].
inline double input_value(int rank, int64_t index) {
  return static_cast<double>((rank * 7 + index * 13) % 11) - 5.0;
}

inline void store_value(void* buffer, DType dtype, int64_t index, double value) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(buffer)[index] = static_cast<float>(value);
      break;
    case DType::bf16:
      static_cast<bf16*>(buffer)[index] = to_bf16(static_cast<float>(value));
      break;
    case DType::f16:
      static_cast<uint16_t*>(buffer)[index] = float_to_f16(static_cast<float>(value));
      break;
    case DType::i32:
      static_cast<int32_t*>(buffer)[index] = static_cast<int32_t>(value);
      break;
    case DType::i64:
      static_cast<int64_t*>(buffer)[index] = static_cast<int64_t>(value);
      break;
    default:
      break;
  }
}

inline double load_value(const void* buffer, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::f32:
      return static_cast<const float*>(buffer)[index];
    case DType::bf16:
      return to_float(static_cast<const bf16*>(buffer)[index]);
    case DType::f16:
      return f16_to_float(static_cast<const uint16_t*>(buffer)[index]);
    case DType::i32:
      return static_cast<const int32_t*>(buffer)[index];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(buffer)[index]);
    default:
      return 0;
  }
}

// The serial reference of reducing the inputs of n ranks at `index` (avg as the type computes it:
// exact sum, one division, one rounding).
inline double reference_reduce(int n, int64_t index, DType dtype, ReduceOp op) {
  double acc = input_value(0, index);
  for (int r = 1; r < n; ++r) {
    double v = input_value(r, index);
    if (op == ReduceOp::max)
      acc = std::max(acc, v);
    else if (op == ReduceOp::min)
      acc = std::min(acc, v);
    else
      acc += v;
  }
  if (op == ReduceOp::avg) {
    if (dtype == DType::i32 || dtype == DType::i64) return std::trunc(acc / n);
    float quotient = static_cast<float>(acc) / static_cast<float>(n);
    std::vector<unsigned char> cell(8);
    store_value(cell.data(), dtype, 0, quotient);  // round like the type stores
    return load_value(cell.data(), dtype, 0);
  }
  return acc;
}

// Where the suite's buffers live: host memory by default; the GPU check passes managed memory.
struct BufferMemory {
  std::function<void*(size_t)> allocate = [](size_t bytes) { return std::malloc(bytes); };
  std::function<void(void*)> release = [](void* pointer) { std::free(pointer); };
};

class Buffer {
 public:
  Buffer(int64_t count, DType type, const BufferMemory& memory = BufferMemory{})
      : bytes_(static_cast<size_t>(std::max<int64_t>(count, 1)) * dtype_size(type)),
        memory_(memory),
        data_(memory_.allocate(bytes_)) {
    std::memset(data_, 0xAB, bytes_);
  }
  ~Buffer() { memory_.release(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() { return data_; }

 private:
  size_t bytes_;
  const BufferMemory& memory_;
  void* data_;
};

// Collects the first few failures of a run, one line each.
struct Failures {
  std::vector<std::string> lines;
  void add(const std::string& line) {
    if (lines.size() < 20) lines.push_back(line);
  }
  bool ok() const { return lines.empty(); }
};

inline std::string case_name(const Communicator& comm, const char* op, DType dtype, int64_t count,
                             const std::string& extra = "") {
  return std::string(op) + " " + std::string(dtype_name(dtype)) + " count " +
         std::to_string(count) + " n " + std::to_string(comm.size()) + " rank " +
         std::to_string(comm.rank()) + (extra.empty() ? "" : " " + extra);
}

// Compares `count` elements at buffer[offset..] with expected(i); records the first difference.
template <class Expected>
bool expect_elements(Failures& failures, const std::string& name, const void* buffer, DType dtype,
                     int64_t offset, int64_t count, Expected expected) {
  for (int64_t i = 0; i < count; ++i) {
    double got = load_value(buffer, dtype, offset + i);
    double want = expected(i);
    if (got != want) {
      failures.add(name + ": element " + std::to_string(offset + i) + " is " + std::to_string(got) +
                   ", expected " + std::to_string(want));
      return false;
    }
  }
  return true;
}

// Elements rank `from` sends rank `to` in the all_to_all_v case.
inline int64_t a2av_count(int64_t count, int from, int to) {
  return (count * (from + 1) + to * 3) % (count + 2);
}
// Elements rank r contributes in the all_gather_v case.
inline int64_t agv_count(int64_t count, int r) {
  return (count + 5 * r) % (count + 3);
}

// Runs every collective once per (count, dtype) on `comm` and checks this rank's results.
inline void run_collective_suite(Communicator& comm, const std::vector<int64_t>& counts,
                                 const std::vector<DType>& dtypes, Failures& failures,
                                 const BufferMemory& memory = BufferMemory{}) {
  const int n = comm.size();
  const int me = comm.rank();
  for (int64_t count : counts) {
    for (DType dtype : dtypes) {
      // allreduce, out of place and in place, every reduction.
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max, ReduceOp::min}) {
        Buffer in(count, dtype, memory), out(count, dtype, memory);
        for (int64_t i = 0; i < count; ++i) store_value(in.data(), dtype, i, input_value(me, i));
        bool in_place = op == ReduceOp::sum || op == ReduceOp::max;
        std::string name =
            case_name(comm, "allreduce", dtype, count,
                      std::string(reduce_op_name(op)) + (in_place ? " in-place" : ""));
        if (in_place) {
          comm.allreduce(in.data(), count, dtype, op);
        } else {
          comm.allreduce(in.data(), out.data(), count, dtype, op);
        }
        expect_elements(failures, name, in_place ? in.data() : out.data(), dtype, 0, count,
                        [&](int64_t i) { return reference_reduce(n, i, dtype, op); });
      }
      // reduce_scatter: block b of rank r's input is elements [b*count, (b+1)*count).
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        Buffer in(count * n, dtype, memory), out(count, dtype, memory);
        for (int64_t i = 0; i < count * n; ++i)
          store_value(in.data(), dtype, i, input_value(me, i));
        comm.reduce_scatter(in.data(), out.data(), count, dtype, op);
        expect_elements(
            failures,
            case_name(comm, "reduce_scatter", dtype, count, std::string(reduce_op_name(op))),
            out.data(), dtype, 0, count,
            [&](int64_t i) { return reference_reduce(n, me * count + i, dtype, op); });
      }
      // all_gather
      {
        Buffer in(count, dtype, memory), out(count * n, dtype, memory);
        for (int64_t i = 0; i < count; ++i) store_value(in.data(), dtype, i, input_value(me, i));
        comm.all_gather(in.data(), out.data(), count, dtype);
        for (int r = 0; r < n; ++r) {
          expect_elements(failures, case_name(comm, "all_gather", dtype, count), out.data(), dtype,
                          r * count, count, [&](int64_t i) { return input_value(r, i); });
        }
      }
      // all_gather_v
      {
        std::vector<int64_t> sizes(static_cast<size_t>(n));
        int64_t total = 0;
        for (int r = 0; r < n; ++r) total += sizes[r] = agv_count(count, r);
        Buffer in(sizes[me], dtype, memory), out(total, dtype, memory);
        for (int64_t i = 0; i < sizes[me]; ++i)
          store_value(in.data(), dtype, i, input_value(me, i));
        comm.all_gather_v(in.data(), out.data(), sizes, dtype);
        int64_t offset = 0;
        for (int r = 0; r < n; ++r) {
          expect_elements(failures, case_name(comm, "all_gather_v", dtype, count), out.data(),
                          dtype, offset, sizes[r], [&](int64_t i) { return input_value(r, i); });
          offset += sizes[r];
        }
      }
      // all_to_all: rank r's block for rank j is elements [j*count, (j+1)*count) of its input.
      {
        Buffer in(count * n, dtype, memory), out(count * n, dtype, memory);
        for (int64_t i = 0; i < count * n; ++i)
          store_value(in.data(), dtype, i, input_value(me, i));
        comm.all_to_all(in.data(), out.data(), count, dtype);
        for (int r = 0; r < n; ++r) {
          expect_elements(failures, case_name(comm, "all_to_all", dtype, count), out.data(), dtype,
                          r * count, count,
                          [&](int64_t i) { return input_value(r, me * count + i); });
        }
      }
      // all_to_all_v: element k of the block rank r sends rank j is input_value(r, 1000*j + k).
      {
        std::vector<int64_t> send(static_cast<size_t>(n)), recv(static_cast<size_t>(n));
        int64_t send_total = 0, recv_total = 0;
        for (int r = 0; r < n; ++r) {
          send_total += send[r] = a2av_count(count, me, r);
          recv_total += recv[r] = a2av_count(count, r, me);
        }
        Buffer in(send_total, dtype, memory), out(recv_total, dtype, memory);
        int64_t position = 0;
        for (int j = 0; j < n; ++j) {
          for (int64_t k = 0; k < send[j]; ++k)
            store_value(in.data(), dtype, position++, input_value(me, 1000 * j + k));
        }
        comm.all_to_all_v(in.data(), send, out.data(), recv, dtype);
        position = 0;
        for (int r = 0; r < n; ++r) {
          expect_elements(failures, case_name(comm, "all_to_all_v", dtype, count), out.data(),
                          dtype, position, recv[r],
                          [&](int64_t k) { return input_value(r, 1000 * me + k); });
          position += recv[r];
        }
      }
      // broadcast and reduce from the first and the last rank.
      for (int root : {0, n - 1}) {
        Buffer buffer(count, dtype, memory);
        for (int64_t i = 0; i < count; ++i)
          store_value(buffer.data(), dtype, i, me == root ? input_value(root, i) : 99.0);
        comm.broadcast(buffer.data(), count, dtype, root);
        expect_elements(
            failures, case_name(comm, "broadcast", dtype, count, "root " + std::to_string(root)),
            buffer.data(), dtype, 0, count, [&](int64_t i) { return input_value(root, i); });
        Buffer in(count, dtype, memory), out(count, dtype, memory);
        for (int64_t i = 0; i < count; ++i) store_value(in.data(), dtype, i, input_value(me, i));
        ReduceOp op = root == 0 ? ReduceOp::sum : ReduceOp::max;
        comm.reduce(in.data(), me == root ? out.data() : nullptr, count, dtype, op, root);
        if (me == root) {
          expect_elements(failures,
                          case_name(comm, "reduce", dtype, count, "root " + std::to_string(root)),
                          out.data(), dtype, 0, count,
                          [&](int64_t i) { return reference_reduce(n, i, dtype, op); });
        }
      }
    }
  }
  // allreduce spanning several tree chunks per half (the double binary tree pipelines them), with
  // an uneven split between its two trees.
  for (DType dtype : dtypes) {
    if (dtype != DType::f32 && dtype != DType::bf16) continue;
    const int64_t count =
        4 * comm.options().tree_chunk_bytes / static_cast<int64_t>(dtype_size(dtype)) + 3;
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
      Buffer in(count, dtype, memory), out(count, dtype, memory);
      for (int64_t i = 0; i < count; ++i) store_value(in.data(), dtype, i, input_value(me, i));
      comm.allreduce(in.data(), out.data(), count, dtype, op);
      expect_elements(failures,
                      case_name(comm, "allreduce", dtype, count,
                                std::string(reduce_op_name(op)) + " (several tree chunks)"),
                      out.data(), dtype, 0, count,
                      [&](int64_t i) { return reference_reduce(n, i, dtype, op); });
    }
  }
  comm.barrier();
}

// Forces `algorithm` for every op it implements (the rest stay automatic).
inline void force_algorithm(Communicator& comm, Algorithm algorithm) {
  for (int i = 0; i < kCollectiveOpCount; ++i) {
    auto op = static_cast<CollectiveOp>(i);
    comm.set_algorithm(op, algorithm_supports(algorithm, op) ? algorithm : Algorithm::automatic);
  }
}

}  // namespace lattice::comm::testing
