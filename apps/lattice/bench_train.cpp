// The `lattice bench train` target (placeholder until its issue lands: it refuses to run).
#include "lattice/core/error.hpp"
#include "verbs.hpp"

namespace lattice::cli {

void register_bench_train(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand("train", "(not built yet)");
  target->allow_extras();
  target->callback([] { throw Error("'lattice bench train' is not built yet in this version"); });
}

}  // namespace lattice::cli
