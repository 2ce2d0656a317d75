// `lattice bench tokenizer`: encode throughput against tiktoken (being written: registers nothing yet).
#include "verbs.hpp"

namespace lattice::cli {

void register_bench_tokenizer(CLI::App& bench) {}

}  // namespace lattice::cli
