// The training config's key schema: every key has a known section, a type, one line of help and a
// default rendered from TrainConfig that parses back to itself; the parser reads through the same
// table; unknown keys and sections are refused with the closest known name.
#include <gtest/gtest.h>

#include <toml++/toml.h>

#include <set>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/train/config_schema.hpp"
#include "lattice/train/train_config.hpp"

namespace lattice::train {
namespace {

std::string refusal(const std::vector<std::string>& overrides) {
  try {
    load_train_config("", overrides);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const ConfigKey& key(const std::string& section, const std::string& name) {
  const ConfigKey* k = find_config_key(section, name);
  if (k == nullptr) throw std::runtime_error("no key " + section + "." + name);
  return *k;
}

TEST(ConfigSchema, EveryKeyHasAKnownSectionATypeAndOneLineOfHelp) {
  std::set<std::string> sections, dotted;
  for (const ConfigSection& s : config_sections()) {
    EXPECT_TRUE(sections.insert(s.name).second) << "section listed twice: " << s.name;
    EXPECT_FALSE(s.help.empty()) << s.name;
  }
  const std::set<std::string> types = {"integer", "number",          "boolean",
                                       "string",  "list of strings", "list of integers"};
  std::set<std::string> sections_with_keys;
  size_t section_index = 0;
  for (const ConfigKey& k : config_keys()) {
    EXPECT_TRUE(sections.count(k.section)) << k.dotted() << ": unknown section";
    EXPECT_TRUE(dotted.insert(k.dotted()).second) << k.dotted() << " listed twice";
    EXPECT_TRUE(types.count(k.type)) << k.dotted() << ": type " << k.type;
    EXPECT_FALSE(k.help.empty()) << k.dotted() << " has no help";
    EXPECT_EQ(k.help.find('\n'), std::string::npos) << k.dotted() << ": help of one line";
    // Keys are grouped by section, in config_sections()'s order.
    while (section_index < config_sections().size() &&
           config_sections()[section_index].name != k.section)
      ++section_index;
    EXPECT_LT(section_index, config_sections().size()) << k.dotted() << " out of section order";
    sections_with_keys.insert(k.section);
  }
  EXPECT_EQ(sections_with_keys, sections) << "a section without keys";
  EXPECT_GE(config_keys().size(), 90u);
}

// Each default, as help shows it, read back through the parser (an override, as a user would type
// it) gives the same value; the one unset default (moe_capacity_factor) writes nothing.
TEST(ConfigSchema, EveryDefaultParsesBackToItself) {
  int unset = 0;
  for (const ConfigKey& k : config_keys()) {
    const std::string text = config_default_text(k);
    if (text == "unset") {
      ++unset;
      continue;
    }
    TrainConfig parsed;
    const toml::table value = toml::parse("v = " + text);
    ASSERT_NO_THROW(k.set(parsed, *value.get("v"), k.dotted())) << k.dotted() << " = " << text;
    EXPECT_EQ(config_value_text(k, parsed), text) << k.dotted();
    // The whole loader (the checks of finalize included) accepts it as an override.
    EXPECT_EQ(refusal({k.dotted() + "=" + text}), "") << k.dotted() << " = " << text;
  }
  EXPECT_EQ(unset, 2);
  EXPECT_EQ(config_default_text(key("model", "moe_capacity_factor")), "unset");
  EXPECT_EQ(config_default_text(key("model", "rope_attention_factor")), "unset");
}

// Defaults come from TrainConfig itself, floats shown as the float they are.
TEST(ConfigSchema, DefaultsAreRenderedFromTrainConfig) {
  const TrainConfig defaults;
  EXPECT_EQ(config_default_text(key("training", "steps")), std::to_string(defaults.training.steps));
  EXPECT_EQ(config_default_text(key("optimizer", "lr")), "0.0003");
  EXPECT_EQ(config_default_text(key("optimizer", "eps")), "1e-08");
  EXPECT_EQ(config_default_text(key("parallelism", "bucket_mb")), "25.0");
  EXPECT_EQ(config_default_text(key("data", "exclude")), "[\"*.dat\", \"*.u8\"]");
  EXPECT_EQ(config_default_text(key("data", "train_files")), "[]");
  EXPECT_EQ(config_default_text(key("job", "run_dir")), "\"runs/default\"");
  EXPECT_EQ(config_default_text(key("model", "preset")), "\"" + defaults.model_preset + "\"");
  EXPECT_EQ(config_default_text(key("model", "d_model")), std::to_string(defaults.model.d_model));
  // A changed config shows its own values.
  const TrainConfig changed = load_train_config("", {"optimizer.lr=0.01", "data.exclude=[]"});
  EXPECT_EQ(config_value_text(key("optimizer", "lr"), changed), "0.01");
  EXPECT_EQ(config_value_text(key("data", "exclude"), changed), "[]");
}

// The parser and the schema are one table: every key the schema lists is accepted as an override,
// and the resolved TOML holds exactly the schema's keys (those with a value).
TEST(ConfigSchema, ResolvedTomlHoldsTheSchemasKeys) {
  const toml::table resolved = toml::parse(load_train_config("", {}).to_toml());
  size_t written = 0;
  for (const auto& [section, node] : resolved) {
    ASSERT_TRUE(node.is_table()) << section.str();
    for (const auto& [name, value] : *node.as_table()) {
      EXPECT_NE(find_config_key(std::string(section.str()), std::string(name.str())), nullptr)
          << section.str() << "." << name.str();
      ++written;
    }
  }
  // All but the unset moe_capacity_factor and rope_attention_factor.
  EXPECT_EQ(written, config_keys().size() - 2);
}

TEST(ConfigSchema, UnknownKeysNameTheClosestKeyAndHowToListThem) {
  EXPECT_EQ(refusal({"training.stepz=3"}),
            "unknown config key training.stepz (command-line override): did you mean "
            "training.steps? `lattice train --help-config` lists every key");
  // A key in the wrong section finds its own.
  EXPECT_NE(refusal({"training.lr=0.1"}).find("did you mean optimizer.lr?"), std::string::npos);
  EXPECT_NE(refusal({"training.warmup_step=3"}).find("did you mean lr_scheduler.warmup_steps?"),
            std::string::npos);
  EXPECT_NE(refusal({"optimizer.beta=0.9"}).find("did you mean optimizer.beta1?"),
            std::string::npos);
  EXPECT_EQ(refusal({"trainig.steps=3"}),
            "unknown config section [trainig] (command-line override): did you mean [training]? "
            "`lattice train --help-config` lists every key");
}

}  // namespace
}  // namespace lattice::train
