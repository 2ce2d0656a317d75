// `lattice data tokenizer`: train a byte-level BPE tokenizer (being written: registers nothing yet).
#include "verbs.hpp"

namespace lattice::cli {

void register_data_tokenizer(CLI::App& data) {}

}  // namespace lattice::cli
