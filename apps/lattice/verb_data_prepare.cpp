// `lattice data prepare`: tokenize text files into token shards (being written: registers nothing yet).
#include "verbs.hpp"

namespace lattice::cli {

void register_data_prepare(CLI::App& data) {}

}  // namespace lattice::cli
