// `lattice bench dp`: data-parallel scaling and overlap (being written: registers nothing yet).
#include "verbs.hpp"

namespace lattice::cli {

void register_bench_dp(CLI::App& bench) {}

}  // namespace lattice::cli
