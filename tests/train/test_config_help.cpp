// The config help rendered from the schema: the text lists every key under its section with its
// type, default and help; the markdown is one table row per key.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "lattice/train/config_help.hpp"
#include "lattice/train/config_schema.hpp"

namespace lattice::train {
namespace {

// `s` between spaces, as a column of the help text.
std::string word(const std::string& s) {
  return std::string(" ").append(s).append(" ");
}

TEST(ConfigHelp, TextListsEveryKeyUnderItsSectionWithTypeAndDefault) {
  const std::string text = config_help_text();
  for (const ConfigSection& s : config_sections())
    EXPECT_NE(text.find("\n[" + s.name + "]  " + s.help + "\n"), std::string::npos) << s.name;
  std::string section;
  size_t key_lines = 0;
  for (size_t begin = 0; begin < text.size();) {
    const size_t end = text.find('\n', begin);
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.rfind("[", 0) == 0) section = line.substr(1, line.find(']') - 1);
    if (line.rfind("  ", 0) != 0) continue;
    const std::string name = line.substr(2, line.find(' ', 2) - 2);
    const ConfigKey* k = find_config_key(section, name);
    ASSERT_NE(k, nullptr) << "line of no key: " << line;
    ++key_lines;
    EXPECT_NE(line.find(word(k->type)), std::string::npos) << line;
    EXPECT_NE(line.find(word(config_default_text(*k))), std::string::npos) << line;
    EXPECT_EQ(line.substr(line.size() - k->help.size()), k->help) << line;
  }
  EXPECT_EQ(key_lines, config_keys().size());
}

TEST(ConfigHelp, MarkdownIsOneTableRowPerKey) {
  const std::string md = config_help_markdown();
  EXPECT_EQ(md.rfind("| section | key | type | default | meaning |\n|---|---|---|---|---|\n", 0),
            0u);
  EXPECT_EQ(static_cast<size_t>(std::count(md.begin(), md.end(), '\n')), config_keys().size() + 2);
  EXPECT_NE(md.find("| optimizer | lr | number | `0.0003` | "), std::string::npos);
  EXPECT_NE(md.find("| model | moe_capacity_factor | number | unset | "), std::string::npos);
}

}  // namespace
}  // namespace lattice::train
