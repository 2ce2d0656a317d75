// The `lattice bench comm` target (placeholder until its issue lands: it refuses to run).
#include "lattice/core/error.hpp"
#include "verbs.hpp"

namespace lattice::cli {

void register_bench_comm(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand("comm", "(not built yet)");
  target->allow_extras();
  target->callback([] { throw Error("'lattice bench comm' is not built yet in this version"); });
}

}  // namespace lattice::cli
