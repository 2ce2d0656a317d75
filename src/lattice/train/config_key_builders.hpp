// The pieces config_keys.cpp builds its table from (private to the config files): TOML values read
// with one refusal line naming the key and the expected type, and a key codec per kind of value
// (integer, number, boolean, string, lists, a named enumerator), each reaching its field of
// TrainConfig through `field(&TrainConfig::a, &A::b, ...)`.
#pragma once

#include <toml++/toml.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/train/config_schema.hpp"

namespace lattice::train::config_detail {

std::string node_type_name(const toml::node& node);
[[noreturn]] void wrong_type(const std::string& key, const char* expected, const toml::node& node);
int64_t as_int(const toml::node& node, const std::string& key);
double as_double(const toml::node& node, const std::string& key);
bool as_bool(const toml::node& node, const std::string& key);
std::string as_string(const toml::node& node, const std::string& key);
// A string or an array of strings.
std::vector<std::string> as_string_list(const toml::node& node, const std::string& key);
std::vector<int64_t> as_int_list(const toml::node& node, const std::string& key);

// How one key's value is typed, read and written (ConfigKey without its name and help).
struct KeyCodec {
  std::string type;
  decltype(ConfigKey::set) set;
  decltype(ConfigKey::get) get;
};

// An accessor of the field reached by a chain of member pointers from TrainConfig:
// field(&TrainConfig::model, &model::ModelConfig::d_model)(config) is config.model.d_model.
template <class... Members>
auto field(Members... members) {
  return [=](auto& config) -> auto& {
    return (config.*....*members);
  };
}

template <class Field>
KeyCodec int_key(Field f) {
  return {"integer",
          [f](TrainConfig& c, const toml::node& n, const std::string& k) {
            auto& value = f(c);
            value = static_cast<std::remove_reference_t<decltype(value)>>(as_int(n, k));
          },
          [f](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, static_cast<int64_t>(f(c)));
          }};
}
template <class Field>
KeyCodec number_key(Field f) {
  return {"number",
          [f](TrainConfig& c, const toml::node& n, const std::string& k) {
            auto& value = f(c);
            value = static_cast<std::remove_reference_t<decltype(value)>>(as_double(n, k));
          },
          [f](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, static_cast<double>(f(c)));
          }};
}
template <class Field>
KeyCodec bool_key(Field f) {
  return {"boolean",
          [f](TrainConfig& c, const toml::node& n, const std::string& k) { f(c) = as_bool(n, k); },
          [f](const TrainConfig& c, toml::table& t, const std::string& name) {
            t.insert_or_assign(name, static_cast<bool>(f(c)));
          }};
}
template <class Field>
KeyCodec string_key(Field f) {
  return {
      "string",
      [f](TrainConfig& c, const toml::node& n, const std::string& k) { f(c) = as_string(n, k); },
      [f](const TrainConfig& c, toml::table& t, const std::string& name) {
        t.insert_or_assign(name, std::string(f(c)));
      }};
}
template <class Field>
KeyCodec string_list_key(Field f) {
  return {"list of strings",
          [f](TrainConfig& c, const toml::node& n, const std::string& k) {
            f(c) = as_string_list(n, k);
          },
          [f](const TrainConfig& c, toml::table& t, const std::string& name) {
            toml::array arr;
            for (const auto& s : f(c)) arr.push_back(s);
            t.insert_or_assign(name, arr);
          }};
}
template <class Field>
KeyCodec int_list_key(Field f) {
  return {
      "list of integers",
      [f](TrainConfig& c, const toml::node& n, const std::string& k) { f(c) = as_int_list(n, k); },
      [f](const TrainConfig& c, toml::table& t, const std::string& name) {
        toml::array arr;
        for (int64_t v : f(c)) arr.push_back(v);
        t.insert_or_assign(name, arr);
      }};
}
// A string naming an enumerator: read with `parse` (which refuses unknown names), written with
// `name`.
template <class Field, class Parse, class Name>
KeyCodec enum_key(Field f, Parse parse, Name name) {
  return {"string",
          [f, parse](TrainConfig& c, const toml::node& n, const std::string& k) {
            f(c) = parse(as_string(n, k));
          },
          [f, name](const TrainConfig& c, toml::table& t, const std::string& key) {
            t.insert_or_assign(key, std::string(name(f(c))));
          }};
}

}  // namespace lattice::train::config_detail
