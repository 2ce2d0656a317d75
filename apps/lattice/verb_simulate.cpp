// The `lattice simulate` verb (placeholder until its issue lands: it refuses to run).
#include "lattice/core/error.hpp"
#include "verbs.hpp"

namespace lattice::cli {

void register_simulate_verb(CLI::App& app) {
  CLI::App* verb = app.add_subcommand("simulate", "(not built yet)");
  verb->allow_extras();
  verb->callback([] { throw Error("'lattice simulate' is not built yet in this version"); });
}

}  // namespace lattice::cli
