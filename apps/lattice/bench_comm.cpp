// The `lattice bench comm` target: times every collective and algorithm in the nccl-tests
// convention (algbw, busbw) on the local backend (threads, default) or the mpi backend (under
// mpirun), and in the same invocation times Open MPI's own collectives on the same sizes and prints
// the ratio.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "lattice/comm/backends/local.hpp"
#include "lattice/comm/backends/mpi.hpp"
#include "lattice/comm/benchmark.hpp"
#include "lattice/comm/launch.hpp"
#include "lattice/core/error.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

using comm::Algorithm;
using comm::CollectiveOp;

struct BenchCommOptions {
  std::string backend;  // "", "local" or "mpi"
  int ranks = 2;
  std::string ops = "allreduce,reduce_scatter,all_gather,all_to_all";
  std::string algorithms = "auto";
  std::string min_bytes = "1K";
  std::string max_bytes = "256M";
  double seconds = 0.2;
  int trials = 3;
  bool openmpi = true;
  int ranks_per_node = 0;
};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  std::string unit(end);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'i') unit.pop_back();
  double scale = unit.empty()  ? 1
                 : unit == "K" ? 1024.0
                 : unit == "M" ? 1048576.0
                 : unit == "G" ? 1073741824.0
                               : -1;
  if (end == text.c_str() || scale < 0 || value <= 0)
    throw Error("bench comm: size '" + text + "' is not like 1K, 64M or 1G");
  return static_cast<int64_t>(value * scale);
}

std::string format_bytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0)
    return std::to_string(bytes >> 30) + " GiB";
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0) return std::to_string(bytes >> 10) + " KiB";
  return std::to_string(bytes) + " B";
}

// Sizes from min to max by factors of 4 (the nccl-tests sweep, coarser).
std::vector<int64_t> size_sweep(const BenchCommOptions& options) {
  int64_t low = parse_bytes(options.min_bytes), high = parse_bytes(options.max_bytes);
  std::vector<int64_t> sizes;
  for (int64_t s = low; s <= high; s *= 4) sizes.push_back(s);
  if (sizes.empty() || sizes.back() != high) sizes.push_back(high);
  return sizes;
}

// Open MPI's timings: (op, bytes) -> seconds.
using PeerTimes = std::map<std::pair<std::string, int64_t>, double>;

std::filesystem::path peer_program() {
  std::error_code error;
  auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  return self.parent_path() / "lattice_comm_mpi_peer";
}

// Runs lattice_comm_mpi_peer under mpirun on `ranks` processes; empty on failure (with a note).
PeerTimes run_openmpi_peer(int ranks, const std::string& op, const std::vector<int64_t>& sizes,
                           double seconds, int trials, std::string& note) {
  PeerTimes times;
  std::filesystem::path peer = peer_program();
  if (!std::filesystem::exists(peer)) {
    note = "Open MPI peer not built (" + peer.string() + " missing)";
    return times;
  }
  std::string size_list;
  for (int64_t s : sizes) size_list += (size_list.empty() ? "" : ",") + std::to_string(s);
  std::string command =
      "env OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --allow-run-as-root "
      "--oversubscribe -n " +
      std::to_string(ranks) + " '" + peer.string() + "' " + op + " " + size_list + " " +
      std::to_string(seconds) + " " + std::to_string(trials) + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) {
    note = "could not start mpirun";
    return times;
  }
  std::array<char, 1024> line;
  std::string other;
  while (std::fgets(line.data(), line.size(), pipe)) {
    char name[64];
    long long bytes = 0;
    double time = 0;
    if (std::sscanf(line.data(), "RESULT %63s %lld %lf", name, &bytes, &time) == 3) {
      times[{name, bytes}] = time;
    } else if (other.size() < 400) {
      other += line.data();
    }
  }
  int status = pclose(pipe);
  if (times.empty()) {
    note = "Open MPI peer failed (status " + std::to_string(status) + "): " + other;
  }
  return times;
}

void print_header(const std::string& title) {
  std::printf("%s\n", title.c_str());
  std::printf("%-15s %-17s %9s %9s %11s %10s %10s %10s %8s %10s %8s\n", "op", "algorithm", "bytes",
              "iters", "time(us)", "algbw GB/s", "busbw GB/s", "ompi busbw", "ratio", "copy(us)",
              "max x");
}

// copy_seconds: the memory-copy bound (comm::time_output_copy), 0 when the op has none; "max x"
// is Open MPI's time over it, the most any implementation that writes its output once could gain.
void print_row(const comm::BenchResult& result, int ranks, const PeerTimes& peer,
               double copy_seconds = 0.0) {
  double busbw = result.algbw() * comm::bus_factor(result.op, ranks) / 1e9;
  std::string op(comm::collective_op_name(result.op));
  auto it = peer.find({op, result.bytes});
  char reference[32] = "-", ratio[32] = "-";
  if (it != peer.end() && it->second > 0) {
    double peer_busbw =
        static_cast<double>(result.bytes) / it->second * comm::bus_factor(result.op, ranks) / 1e9;
    std::snprintf(reference, sizeof(reference), "%.3f", peer_busbw);
    std::snprintf(ratio, sizeof(ratio), "%.2fx", it->second / result.seconds);
  }
  char copy[32] = "-", most[32] = "-";
  if (copy_seconds > 0) {
    std::snprintf(copy, sizeof(copy), "%.2f", copy_seconds * 1e6);
    if (it != peer.end() && it->second > 0)
      std::snprintf(most, sizeof(most), "%.2fx", it->second / copy_seconds);
  }
  std::printf("%-15s %-17s %9s %9d %11.2f %10.3f %10.3f %10s %8s %10s %8s\n", op.c_str(),
              std::string(comm::algorithm_name(result.algorithm)).c_str(),
              format_bytes(result.bytes).c_str(), result.iterations, result.seconds * 1e6,
              result.algbw() / 1e9, busbw, reference, ratio, copy, most);
  std::fflush(stdout);
}

bool algorithm_applies(Algorithm algorithm, CollectiveOp op, bool shared_memory, bool native) {
  if (!comm::algorithm_supports(algorithm, op)) return false;
  if (algorithm == Algorithm::direct && !shared_memory) return false;
  if (algorithm == Algorithm::native && !native) return false;
  return true;
}

void bench_local(const BenchCommOptions& options) {
  std::vector<int64_t> sizes = size_sweep(options);
  std::vector<Algorithm> algorithms;
  for (const auto& name : split_list(options.algorithms))
    algorithms.push_back(comm::parse_algorithm(name));
  comm::CommOptions comm_options = comm::options_from_environment();
  comm_options.ranks_per_node = options.ranks_per_node;
  print_header("lattice bench comm: local backend, " + std::to_string(options.ranks) +
               " thread ranks, f32, median of " + std::to_string(options.trials) +
               " timed runs per case; Open MPI " +
               (options.openmpi ? "(mpirun -n " + std::to_string(options.ranks) +
                                      ", its default transport) timed in the same run"
                                : "comparison off"));
  for (const auto& op_name : split_list(options.ops)) {
    CollectiveOp op = comm::parse_collective_op(op_name);
    PeerTimes peer;
    if (options.openmpi) {
      std::string note;
      peer = run_openmpi_peer(options.ranks, op_name, sizes, options.seconds, options.trials, note);
      if (!note.empty()) std::printf("# %s\n", note.c_str());
    }
    // All-gather and broadcast ranks all read the same inputs: their copy bound reads one
    // buffer shared by the rank threads (all-to-all ranks read distinct pieces: private ones).
    const bool shared_inputs = op == CollectiveOp::all_gather || op == CollectiveOp::broadcast;
    std::vector<float> shared_source(
        shared_inputs ? static_cast<size_t>(*std::max_element(sizes.begin(), sizes.end()) / 4 + 1)
                      : 0,
        1.0f);
    comm::LocalWorld world(options.ranks, comm_options);
    world.run([&](comm::Communicator& communicator) {
      // The memory-copy bound of the data-moving ops, measured on the same ranks first.
      std::map<int64_t, double> copy_bound;
      for (int64_t bytes : sizes)
        copy_bound[bytes] = comm::time_output_copy(
            communicator, op, bytes, options.seconds, options.trials,
            shared_inputs ? static_cast<const void*>(shared_source.data()) : nullptr);
      for (Algorithm algorithm : algorithms) {
        if (!algorithm_applies(algorithm, op, true, false)) continue;
        communicator.set_algorithm(op, algorithm);
        for (int64_t bytes : sizes) {
          comm::BenchResult result =
              comm::time_collective(communicator, op, bytes, options.seconds, options.trials);
          if (communicator.rank() == 0) print_row(result, options.ranks, peer, copy_bound[bytes]);
        }
      }
    });
  }
}

void bench_mpi(const BenchCommOptions& options) {
  comm::MpiSession session;
  std::vector<int64_t> sizes = size_sweep(options);
  std::vector<Algorithm> algorithms;
  for (const auto& name : split_list(options.algorithms))
    algorithms.push_back(comm::parse_algorithm(name));
  comm::CommOptions comm_options = comm::options_from_environment();
  if (options.ranks_per_node > 0) comm_options.ranks_per_node = options.ranks_per_node;
  comm::CommOptions reference_options = comm_options;
  reference_options.verify_collectives = false;
  {
    auto communicator = session.world(comm_options);
    auto reference = session.world(reference_options);  // Open MPI's collectives, unchecked
    const int n = communicator->size();
    if (communicator->rank() == 0) {
      print_header("lattice bench comm: mpi backend, " + std::to_string(n) +
                   " processes, f32, median of " + std::to_string(options.trials) +
                   " timed runs per case; Open MPI's own collectives timed in the same run");
    }
    for (const auto& op_name : split_list(options.ops)) {
      CollectiveOp op = comm::parse_collective_op(op_name);
      reference->set_algorithm(op, Algorithm::native);
      PeerTimes peer;
      for (int64_t bytes : sizes) {
        comm::BenchResult base =
            comm::time_collective(*reference, op, bytes, options.seconds, options.trials);
        peer[{op_name, base.bytes}] = base.seconds;
      }
      for (Algorithm algorithm : algorithms) {
        if (!algorithm_applies(algorithm, op, false, true)) continue;
        communicator->set_algorithm(op, algorithm);
        for (int64_t bytes : sizes) {
          comm::BenchResult result =
              comm::time_collective(*communicator, op, bytes, options.seconds, options.trials);
          if (communicator->rank() == 0) print_row(result, n, peer);
        }
      }
    }
  }
}

}  // namespace

void register_bench_comm(CLI::App& bench) {
  auto options = std::make_shared<BenchCommOptions>();
  CLI::App* target = bench.add_subcommand(
      "comm", "Collective bandwidth and latency (nccl-tests algbw/busbw) against Open MPI");
  target->add_option("--backend", options->backend,
                     "local (threads) or mpi (run under mpirun); default: mpi when started by "
                     "mpirun, else local");
  target->add_option("--ranks", options->ranks, "Thread ranks of the local backend")
      ->check(CLI::Range(1, 1024));
  target->add_option(
      "--ops", options->ops,
      "Collectives: allreduce,reduce_scatter,all_gather,all_to_all,broadcast,reduce");
  target->add_option("--algorithms", options->algorithms,
                     "auto,ring,tree,halving_doubling,direct,pairwise,hierarchical,native");
  target->add_option("--min-bytes", options->min_bytes, "Smallest size (e.g. 1K)");
  target->add_option("--max-bytes", options->max_bytes, "Largest size (e.g. 256M)");
  target->add_option("--seconds", options->seconds, "Time per timed run")
      ->check(CLI::PositiveNumber);
  target
      ->add_option("--trials", options->trials,
                   "Timed runs per case, each side (Lattice and Open MPI); the median is printed")
      ->check(CLI::Range(1, 101));
  target->add_flag("!--no-openmpi", options->openmpi, "Skip the Open MPI comparison");
  target->add_option("--ranks-per-node", options->ranks_per_node,
                     "Emulate nodes of this many ranks (hierarchical allreduce)");
  target->callback([options] {
    std::string backend = options->backend;
    if (backend.empty())
      backend = comm::detect_launch().launcher == comm::Launcher::open_mpi ? "mpi" : "local";
    if (backend == "local") {
      bench_local(*options);
    } else if (backend == "mpi") {
      bench_mpi(*options);
    } else {
      throw Error("bench comm: unknown backend '" + backend + "'; use local or mpi");
    }
  });
}

}  // namespace lattice::cli
