// The keys of a Hugging Face config.json, sorted into what Lattice reads (each family's own list),
// what does not change the arithmetic (bookkeeping, token ids, generation defaults) and the dropout
// probabilities, which Lattice does not apply (it trains without dropout): those are reported. Any
// other key is refused with one line naming it, so that a setting Lattice would not compute can
// never be dropped silently.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace lattice::train {

// Throws Error naming the first key of `config` (a config.json of `model_type`; `source` names it)
// that is neither read for that type nor on the lists of keys that leave the arithmetic alone, or
// whose value Lattice cannot compute (e.g. GPT-2 without scaled attention). Appends one line per
// setting that is read but not applied (a nonzero dropout) to `ignored`, when given.
void check_hf_config_keys(const nlohmann::json& config, const std::string& model_type,
                          const std::string& source, std::vector<std::string>* ignored);

}  // namespace lattice::train
