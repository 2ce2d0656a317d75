// Tokenizer files: see tokenizer_files.hpp.
#include "lattice/data/tokenizer_files.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "lattice/core/error.hpp"
#include "lattice/data/byte_level.hpp"
#include "lattice/io/atomic_file.hpp"

namespace lattice::data {
namespace {

using nlohmann::json;

// At most `limit` characters of `text` for an error message, with control bytes escaped.
std::string quote(std::string_view text, size_t limit = 60) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x20 || b == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02X", b);
      out += hex;
    } else {
      out += text[i];
    }
  }
  if (text.size() > limit) out += "...";
  return "'" + out + "'";
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in.good())
    throw Error("cannot open tokenizer file '" + path.string() + "': " + std::strerror(errno) +
                "; check the path");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad())
    throw Error("cannot read tokenizer file '" + path.string() + "': " + std::strerror(errno));
  return std::move(buffer).str();
}

// Written through a temp file renamed into place: a failure leaves any old file untouched.
void write_file(const std::filesystem::path& path, const std::string& contents) {
  write_text_atomic(path.string(), contents);
}

json parse_json(std::string_view text, const std::string& name, const char* expected) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    throw Error(name + ": not valid JSON (byte " + std::to_string(e.byte) + "); expected " +
                expected);
  } catch (const json::exception& e) {
    throw Error(name + ": cannot read the JSON (" + e.what() + "); expected " + expected);
  }
}

// Lines of `text` without their "\n" / "\r\n" endings, numbered from 1 by position.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

std::string token_bytes(std::string_view spelled, const std::string& name,
                        const std::string& where) {
  std::optional<std::string> bytes = unicode_string_to_bytes(spelled);
  if (!(bytes.has_value() && !bytes->empty()))
    throw Error(
        name + ": " + where + " token " + quote(spelled) +
        " is not spelled in GPT-2's byte-level alphabet: this is not a byte-level BPE file");
  return *bytes;
}

int32_t token_id(const json& value, std::string_view token, const std::string& name) {
  if (!(value.is_number_integer() && value.get<int64_t>() >= 0 &&
        value.get<int64_t>() <= std::numeric_limits<int32_t>::max()))
    throw Error(name + ": token " + quote(token) + " has id " + quote(value.dump()) +
                ", expected an integer in [0, 2^31)");
  return static_cast<int32_t>(value.get<int64_t>());
}

bool looks_special(std::string_view token) {
  return token.size() > 4 && token.starts_with("<|") && token.ends_with("|>");
}

// Vocabulary object (token spelling -> id) into `model`; entries named in `specials` (spelling ->
// id) and, when `specials_by_form`, entries spelled <|...|> become special tokens.
void read_vocab(const json& vocab, const std::string& name, bool specials_by_form,
                const std::unordered_map<std::string, int32_t>& specials, BpeModel& model) {
  if (!vocab.is_object())
    throw Error(name + ": the vocabulary is not a JSON object of token -> id");
  model.tokens.reserve(vocab.size());
  for (const auto& [spelled, value] : vocab.items()) {
    const int32_t id = token_id(value, spelled, name);
    if (auto it = specials.find(spelled); it != specials.end()) {
      if (it->second != id)
        throw Error(name + ": special token " + quote(spelled) + " has id " +
                    std::to_string(it->second) + " in added_tokens but " + std::to_string(id) +
                    " in the vocabulary: make them agree");
      continue;
    }
    if (specials_by_form && looks_special(spelled)) {
      model.special_tokens.push_back({spelled, id});
      continue;
    }
    model.tokens.push_back({token_bytes(spelled, name, "vocabulary"), id});
  }
}

std::pair<std::string, std::string> merge_parts(std::string_view left, std::string_view right,
                                                const std::string& name, const std::string& where) {
  return {token_bytes(left, name, where), token_bytes(right, name, where)};
}

std::pair<std::string, std::string> parse_merge_line(std::string_view line, const std::string& name,
                                                     const std::string& where) {
  const size_t space = line.find(' ');
  if (!(space != std::string_view::npos && space > 0 && space + 1 < line.size() &&
        line.find(' ', space + 1) == std::string_view::npos))
    throw Error(name + ": " + where + " is " + quote(line) +
                ", expected two tokens separated by one space (e.g. 'Ġ t')");
  return merge_parts(line.substr(0, space), line.substr(space + 1), name, where);
}

// Base64 (standard alphabet, '=' padding) as tiktoken writes tokens.
std::optional<std::string> base64_decode(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  for (size_t i = 0; i < text.size(); i += 4) {
    const bool last = i + 4 == text.size();
    int v[4];
    int padding = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = text[i + k];
      if (c == '=' && last && k >= 2) {
        v[k] = 0;
        ++padding;
      } else {
        if (padding > 0) return std::nullopt;  // data after padding
        v[k] = value(c);
        if (v[k] < 0) return std::nullopt;
      }
    }
    const uint32_t bits = (v[0] << 18) | (v[1] << 12) | (v[2] << 6) | v[3];
    out += static_cast<char>(bits >> 16);
    if (padding < 2) out += static_cast<char>((bits >> 8) & 0xFF);
    if (padding < 1) out += static_cast<char>(bits & 0xFF);
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t bits = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) bits |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) bits |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(bits >> 18) & 63];
    out += kAlphabet[(bits >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(bits >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[bits & 63] : '=';
  }
  return out;
}

// OpenAI's encodings, known by the name of their rank file (tiktoken_ext/openai_public.py).
struct KnownEncoding {
  std::string_view stem;
  std::string_view pattern;
  std::vector<SpecialToken> specials;
};

const KnownEncoding* known_encoding(std::string_view stem) {
  static const std::array<KnownEncoding, 4> kKnown = {{
      {"r50k_base", kGpt2Pattern, {{"<|endoftext|>", 50256}}},
      {"p50k_base", kGpt2Pattern, {{"<|endoftext|>", 50256}}},
      {"cl100k_base",
       R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)",
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}}},
      {"o200k_base",
       R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
  }};
  for (const auto& known : kKnown)
    if (known.stem == stem) return &known;
  return nullptr;
}

std::vector<const BpeToken*> tokens_by_id(const BpeModel& model) {
  std::vector<const BpeToken*> sorted;
  for (const auto& token : model.tokens) sorted.push_back(&token);
  std::sort(sorted.begin(), sorted.end(),
            [](const BpeToken* a, const BpeToken* b) { return a->id < b->id; });
  return sorted;
}

// Vocabulary in id order, special tokens included (as GPT-2's files have them).
nlohmann::ordered_json ordered_vocab(const BpeModel& model) {
  std::vector<std::pair<int32_t, std::string>> entries;
  for (const auto& token : model.tokens)
    entries.emplace_back(token.id, bytes_to_unicode_string(token.bytes));
  for (const auto& special : model.special_tokens) entries.emplace_back(special.id, special.text);
  std::sort(entries.begin(), entries.end());
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  // Appended directly: ordered_json's operator[] searches linearly (quadratic for 50k tokens).
  auto& members = vocab.get_ref<nlohmann::ordered_json::object_t&>();
  members.reserve(entries.size());
  for (const auto& [id, spelled] : entries) members.emplace_back(spelled, id);
  return vocab;
}

std::vector<std::string> merge_lines(const BpeModel& model, const std::string& target) {
  if (model.merges.empty())
    throw Error("cannot write '" + target +
                "': the tokenizer has no merges (tiktoken ranks); write a "
                ".tiktoken file instead");
  std::vector<std::string> lines;
  lines.reserve(model.merges.size());
  for (const auto& [left, right] : model.merges)
    lines.push_back(bytes_to_unicode_string(left) + " " + bytes_to_unicode_string(right));
  return lines;
}

}  // namespace

BpeModel parse_vocab_and_merges(std::string_view vocab_json_text, std::string_view merges_txt,
                                const std::string& vocab_name, const std::string& merges_name) {
  BpeModel model;
  model.name = vocab_name;
  const json vocab = parse_json(vocab_json_text, vocab_name, "an object of token -> id");
  read_vocab(vocab, vocab_name, /*specials_by_form=*/true, {}, model);
  const std::vector<std::string_view> lines = split_lines(merges_txt);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].empty() || (i == 0 && lines[i].starts_with("#version"))) continue;
    model.merges.push_back(
        parse_merge_line(lines[i], merges_name, "line " + std::to_string(i + 1)));
  }
  if (model.merges.empty())
    throw Error(merges_name + ": no merges found; expected lines like 'Ġ t'");
  return model;
}

namespace {

BpeModel tokenizer_json_model(std::string_view text, const std::string& name) {
  const json root = parse_json(text, name, "a Hugging Face tokenizer.json object");
  if (!(root.is_object() && root.contains("model") && root["model"].is_object()))
    throw Error(name + ": no \"model\" object: not a Hugging Face tokenizer.json");
  const json& model_json = root["model"];
  auto string_field = [&](const json& object, const char* key) -> std::string {
    if (!object.contains(key) || object[key].is_null()) return "";
    if (!object[key].is_string()) throw Error(name + ": \"" + key + "\" is not a string");
    return object[key].get<std::string>();
  };
  const std::string type = string_field(model_json, "type");
  if (!(type.empty() || type == "BPE"))
    throw Error(name + ": model.type is " + quote(type) + "; only BPE tokenizers are supported");
  if (!(!model_json.contains("byte_fallback") || !model_json["byte_fallback"].is_boolean() ||
        !model_json["byte_fallback"].get<bool>()))
    throw Error(name +
                ": model.byte_fallback is true (a SentencePiece-style BPE); only byte-level BPE "
                "is supported");
  if (!(string_field(model_json, "continuing_subword_prefix").empty() &&
        string_field(model_json, "end_of_word_suffix").empty()))
    throw Error(name +
                ": model has a continuing_subword_prefix or end_of_word_suffix; byte-level BPE has "
                "neither");
  if (root.contains("normalizer") && !root["normalizer"].is_null()) {
    const json& normalizer = root["normalizer"];
    throw Error(name + ": normalizer " +
                quote(normalizer.is_object() && normalizer.contains("type")
                          ? normalizer["type"].dump()
                          : normalizer.dump()) +
                " is not supported; only tokenizers without a normalizer");
  }

  BpeModel model;
  model.name = name;
  // Pre-tokenizer: ByteLevel with its regex, or Split(regex) then ByteLevel without one.
  if (!(root.contains("pre_tokenizer") && root["pre_tokenizer"].is_object()))
    throw Error(name + ": no pre_tokenizer; a byte-level BPE needs the ByteLevel pre-tokenizer");
  auto byte_level = [&](const json& pre) {
    if (string_field(pre, "type") != "ByteLevel")
      throw Error(name + ": pre_tokenizer " + quote(string_field(pre, "type")) +
                  " is not supported; expected ByteLevel (or Split then ByteLevel)");
    if (!(!pre.contains("add_prefix_space") || !pre["add_prefix_space"].is_boolean() ||
          !pre["add_prefix_space"].get<bool>()))
      throw Error(name + ": ByteLevel add_prefix_space is true; only false is supported");
    return !pre.contains("use_regex") || !pre["use_regex"].is_boolean() ||
           pre["use_regex"].get<bool>();
  };
  const json& pre = root["pre_tokenizer"];
  if (string_field(pre, "type") == "Sequence") {
    if (!(pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
          pre["pretokenizers"].size() == 2))
      throw Error(name + ": a Sequence pre_tokenizer is supported only as [Split, ByteLevel]");
    const json& split = pre["pretokenizers"][0];
    if (!(split.is_object() && string_field(split, "type") == "Split" &&
          split.contains("pattern") && split["pattern"].is_object() &&
          split["pattern"].contains("Regex") && split["pattern"]["Regex"].is_string() &&
          string_field(split, "behavior") == "Isolated" &&
          !(split.contains("invert") && split["invert"] == true)))
      throw Error(name +
                  ": the Sequence's first pre_tokenizer must be Split with a Regex pattern, "
                  "behavior Isolated, invert false");
    if (!(pre["pretokenizers"][1].is_object() && !byte_level(pre["pretokenizers"][1])))
      throw Error(name +
                  ": the Sequence's second pre_tokenizer must be ByteLevel with use_regex false");
    model.pattern = split["pattern"]["Regex"].get<std::string>();
  } else {
    model.pattern = byte_level(pre) ? std::string(kGpt2Pattern) : std::string(R"([\s\S]+)");
  }

  std::unordered_map<std::string, int32_t> specials;
  if (root.contains("added_tokens")) {
    if (!root["added_tokens"].is_array()) throw Error(name + ": added_tokens is not an array");
    for (const json& added : root["added_tokens"]) {
      if (!(added.is_object() && added.contains("content") && added["content"].is_string() &&
            !added["content"].get<std::string>().empty() && added.contains("id")))
        throw Error(name +
                    ": an entry of added_tokens lacks a non-empty \"content\" string or an \"id\"");
      const std::string content = added["content"].get<std::string>();
      const int32_t id = token_id(added["id"], content, name);
      if (!specials.emplace(content, id).second)
        throw Error(name + ": added token " + quote(content) + " is listed twice");
      model.special_tokens.push_back({content, id});
    }
  }
  if (!model_json.contains("vocab")) throw Error(name + ": model has no \"vocab\"");
  read_vocab(model_json["vocab"], name, /*specials_by_form=*/false, specials, model);
  if (!(model_json.contains("merges") && model_json["merges"].is_array()))
    throw Error(name + ": model has no \"merges\" array");
  const json& merges = model_json["merges"];
  model.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string where = "merge " + std::to_string(i + 1);
    const json& merge = merges[i];
    if (merge.is_string()) {
      model.merges.push_back(parse_merge_line(merge.get<std::string>(), name, where));
    } else {
      if (!(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()))
        throw Error(name + ": " + where + " is " + quote(merge.dump()) +
                    ", expected \"left right\" or [\"left\", \"right\"]");
      model.merges.push_back(
          merge_parts(merge[0].get<std::string>(), merge[1].get<std::string>(), name, where));
    }
  }
  if (model.merges.empty()) throw Error(name + ": model.merges is empty; a BPE model needs merges");
  if (model_json.contains("ignore_merges") && model_json["ignore_merges"].is_boolean())
    model.ignore_merges = model_json["ignore_merges"].get<bool>();
  return model;
}

}  // namespace

BpeModel parse_tokenizer_json(std::string_view text, const std::string& name) {
  try {
    return tokenizer_json_model(text, name);
  } catch (const json::exception& e) {  // a structure the checks above did not foresee
    throw Error(name + ": unexpected tokenizer.json structure (" + e.what() +
                "); expected a Hugging Face BPE tokenizer.json");
  }
}

BpeModel parse_tiktoken(std::string_view text, const std::string& name) {
  BpeModel model;
  model.name = name;
  const std::vector<std::string_view> lines = split_lines(text);
  int32_t max_rank = -1;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string_view line = lines[i];
    if (line.empty()) continue;
    auto where = [&] {
      return name + ": line " + std::to_string(i + 1) + " (" + quote(line) + ")";
    };
    const size_t space = line.find(' ');
    if (!(space != std::string_view::npos && line.find(' ', space + 1) == std::string_view::npos))
      throw Error(where() + " is not '<base64 token> <rank>'");
    std::optional<std::string> bytes = base64_decode(line.substr(0, space));
    if (!(bytes.has_value() && !bytes->empty()))
      throw Error(where() + ": the token is not valid base64");
    const std::string_view rank_text = line.substr(space + 1);
    int32_t rank = -1;
    const auto [end, error] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (!(error == std::errc() && end == rank_text.data() + rank_text.size() && rank >= 0))
      throw Error(where() + ": the rank is not an integer in [0, 2^31)");
    model.tokens.push_back({std::move(*bytes), rank});
    max_rank = std::max(max_rank, rank);
  }
  if (model.tokens.empty())
    throw Error(name + ": no ranks found; expected lines '<base64 token> <rank>'");
  const std::string stem = std::filesystem::path(name).stem().string();
  if (const KnownEncoding* known = known_encoding(stem)) {
    model.pattern = known->pattern;
    model.special_tokens = known->specials;
  } else {
    if (!(max_rank < std::numeric_limits<int32_t>::max())) throw Error(name + ": rank too large");
    model.special_tokens.push_back({"<|endoftext|>", max_rank + 1});
  }
  return model;
}

BpeModel read_vocab_and_merges(const std::filesystem::path& vocab_json,
                               const std::filesystem::path& merges_txt) {
  return parse_vocab_and_merges(read_file(vocab_json), read_file(merges_txt), vocab_json.string(),
                                merges_txt.string());
}

BpeModel read_tokenizer_json(const std::filesystem::path& path) {
  return parse_tokenizer_json(read_file(path), path.string());
}

BpeModel read_tiktoken(const std::filesystem::path& path) {
  return parse_tiktoken(read_file(path), path.string());
}

std::unique_ptr<BpeTokenizer> make_bpe_tokenizer(BpeModel model, const std::string& name) {
  try {
    return std::make_unique<BpeTokenizer>(std::move(model));
  } catch (const Error& e) {
    throw Error(name + ": " + e.what());
  }
}

void write_tokenizer_json(const BpeModel& model, const std::filesystem::path& path) {
  const std::vector<std::string> merges = merge_lines(model, path.string());
  nlohmann::ordered_json root;
  root["version"] = "1.0";
  root["truncation"] = nullptr;
  root["padding"] = nullptr;
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const auto& special : model.special_tokens) {
    added.push_back({{"id", special.id},
                     {"content", special.text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  root["added_tokens"] = added;
  root["normalizer"] = nullptr;
  if (model.pattern == kGpt2Pattern) {
    root["pre_tokenizer"] = {{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", true},
                             {"use_regex", true}};
  } else {
    root["pre_tokenizer"] = {{"type", "Sequence"},
                             {"pretokenizers",
                              {{{"type", "Split"},
                                {"pattern", {{"Regex", model.pattern}}},
                                {"behavior", "Isolated"},
                                {"invert", false}},
                               {{"type", "ByteLevel"},
                                {"add_prefix_space", false},
                                {"trim_offsets", true},
                                {"use_regex", false}}}}};
  }
  root["post_processor"] = nullptr;
  root["decoder"] = {{"type", "ByteLevel"},
                     {"add_prefix_space", true},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  root["model"] = {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", nullptr},
                   {"end_of_word_suffix", nullptr},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", model.ignore_merges},
                   {"vocab", ordered_vocab(model)},
                   {"merges", merges}};
  write_file(path, root.dump(2) + "\n");
}

void write_vocab_and_merges(const BpeModel& model, const std::filesystem::path& vocab_json,
                            const std::filesystem::path& merges_txt) {
  const std::vector<std::string> merges = merge_lines(model, merges_txt.string());
  std::string text = "#version: 0.2\n";
  for (const auto& line : merges) text += line + "\n";
  write_file(vocab_json, ordered_vocab(model).dump() + "\n");
  write_file(merges_txt, text);
}

void write_tiktoken(const BpeModel& model, const std::filesystem::path& path) {
  std::string text;
  for (const BpeToken* token : tokens_by_id(model))
    text += base64_encode(token->bytes) + " " + std::to_string(token->id) + "\n";
  write_file(path, text);
}

}  // namespace lattice::data
