// Token files: llm.c shards (writer, memory-mapped reader, header checked byte by byte), Megatron
// indexed datasets (reader against files written by tests/data/make_megatron_reference.py with
// numpy in Megatron's layout, writer byte-identical to them), the dataset manifest, and one clear
// error naming the file for every kind of bad file.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "lattice/data/dataset_manifest.hpp"
#include "lattice/data/llmc_shard.hpp"
#include "lattice/data/megatron_dataset.hpp"
#include "token_file_helpers.hpp"

using namespace lattice::data;
using lattice::testing::expect_error;
using lattice::testing::fresh_test_directory;
using lattice::testing::read_bytes;
using lattice::testing::write_bytes;
namespace fs = std::filesystem;

namespace {

int32_t int_at(const std::vector<uint8_t>& bytes, size_t offset) {
  int32_t v;
  std::memcpy(&v, bytes.data() + offset, 4);
  return v;
}

std::vector<int32_t> read_all(const lattice::data::TokenSource& source) {
  std::vector<int32_t> out(static_cast<size_t>(source.size()));
  source.read(0, source.size(), out.data());
  return out;
}

// An llm.c shard built by hand: header ints, then `payload` bytes.
std::vector<uint8_t> llmc_bytes(int32_t magic, int32_t version, int32_t count,
                                const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> bytes(1024, 0);
  std::memcpy(&bytes[0], &magic, 4);
  std::memcpy(&bytes[4], &version, 4);
  std::memcpy(&bytes[8], &count, 4);
  bytes.insert(bytes.end(), payload.begin(), payload.end());
  return bytes;
}

class TokenFiles : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = fresh_test_directory(); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

TEST_F(TokenFiles, LlmcUint16ShardHasLlmcHeaderAndRoundTrips) {
  const std::vector<int32_t> tokens = {50256, 0, 1, 65535, 42, 7};
  write_llmc_shard(path("a.bin"), tokens, TokenType::uint16);
  const auto bytes = read_bytes(path("a.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 2 * tokens.size());
  EXPECT_EQ(int_at(bytes, 0), 20240520);
  EXPECT_EQ(int_at(bytes, 4), 1);
  EXPECT_EQ(int_at(bytes, 8), 6);
  for (size_t i = 3; i < 256; ++i) EXPECT_EQ(int_at(bytes, 4 * i), 0);
  for (size_t i = 0; i < tokens.size(); ++i)
    EXPECT_EQ(bytes[1024 + 2 * i] | (bytes[1025 + 2 * i] << 8), tokens[i]);
  LlmcShard shard(path("a.bin"), 65536);
  EXPECT_EQ(shard.token_type(), TokenType::uint16);
  EXPECT_EQ(read_all(shard), tokens);
  std::vector<int32_t> middle(3);
  shard.read(2, 3, middle.data());
  EXPECT_EQ(middle, (std::vector<int32_t>{1, 65535, 42}));
}

TEST_F(TokenFiles, LlmcUint32ShardUsesLlama3MagicAndRoundTrips) {
  const std::vector<int32_t> tokens = {128000, 5, 70000, 128255};
  write_llmc_shard(path("b.bin"), tokens, TokenType::uint32);
  const auto bytes = read_bytes(path("b.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 4 * tokens.size());
  EXPECT_EQ(int_at(bytes, 0), 20240801);
  EXPECT_EQ(int_at(bytes, 4), 7);
  EXPECT_EQ(int_at(bytes, 8), 4);
  for (size_t i = 0; i < tokens.size(); ++i) EXPECT_EQ(int_at(bytes, 1024 + 4 * i), tokens[i]);
  LlmcShard shard(path("b.bin"), 128256);
  EXPECT_EQ(shard.token_type(), TokenType::uint32);
  EXPECT_EQ(read_all(shard), tokens);
}

TEST_F(TokenFiles, LlmcTokenTypeFollowsVocabulary) {
  EXPECT_EQ(llmc_token_type_for_vocab(256), TokenType::uint16);
  EXPECT_EQ(llmc_token_type_for_vocab(65536), TokenType::uint16);
  EXPECT_EQ(llmc_token_type_for_vocab(65537), TokenType::uint32);
  expect_error(
      [&] { write_llmc_shard(path("c.bin"), std::vector<int32_t>{70000}, TokenType::uint16); },
      {"70000", "c.bin"});
  EXPECT_FALSE(fs::exists(path("c.bin")));  // nothing half-written
}

TEST_F(TokenFiles, LlmcBadFilesNameTheFileAndTheProblem) {
  const std::vector<uint8_t> four_tokens = {1, 0, 2, 0, 3, 0, 4, 0};
  write_bytes(path("magic.bin"), llmc_bytes(12345, 1, 4, four_tokens));
  expect_error([&] { LlmcShard(path("magic.bin"), 256); }, {"magic.bin", "bad magic", "12345"});
  write_bytes(path("version.bin"), llmc_bytes(20240520, 3, 4, four_tokens));
  expect_error([&] { LlmcShard(path("version.bin"), 256); }, {"version.bin", "version 3"});
  write_bytes(path("truncated.bin"), llmc_bytes(20240520, 1, 5, four_tokens));
  expect_error([&] { LlmcShard(path("truncated.bin"), 256); },
               {"truncated.bin", "5 tokens", "holds 8 bytes"});
  write_bytes(path("long.bin"), llmc_bytes(20240520, 1, 3, four_tokens));
  expect_error([&] { LlmcShard(path("long.bin"), 256); }, {"long.bin", "3 tokens"});
  write_bytes(path("empty.bin"), llmc_bytes(20240520, 1, 0, {}));
  expect_error([&] { LlmcShard(path("empty.bin"), 256); }, {"empty.bin", "no tokens"});
  write_bytes(path("short.bin"), std::vector<uint8_t>(100, 0));
  expect_error([&] { LlmcShard(path("short.bin"), 256); }, {"short.bin", "truncated", "header"});
  write_bytes(path("zero.bin"), {});
  expect_error([&] { LlmcShard(path("zero.bin"), 256); }, {"zero.bin", "truncated"});
  write_bytes(path("vocab.bin"), llmc_bytes(20240520, 1, 4, {1, 0, 2, 0, 0, 1, 4, 0}));
  expect_error([&] { LlmcShard(path("vocab.bin"), 256); },
               {"vocab.bin", "token 2", "id 256", "outside the vocabulary [0, 256)"});
  expect_error([&] { LlmcShard(path("missing.bin"), 256); }, {"missing.bin", "cannot open"});
}

// The reference files written by make_megatron_reference.py (numpy, Megatron's layout).
struct MegatronReference {
  std::string prefix;
  int64_t vocab_size;
  std::vector<std::vector<int32_t>> documents;
};

MegatronReference megatron_reference(const std::string& name) {
  const fs::path dir = fs::path(LATTICE_SOURCE_DIR) / "tests/data/reference";
  std::ifstream in(dir / "megatron_expected.json");
  const auto j = nlohmann::json::parse(in).at(name);
  return {(dir / name).string(), j.at("vocab_size").get<int64_t>(),
          j.at("documents").get<std::vector<std::vector<int32_t>>>()};
}

TEST_F(TokenFiles, MegatronReaderReadsNumpyReferenceFiles) {
  for (const char* name : {"megatron_uint16", "megatron_int32"}) {
    SCOPED_TRACE(name);
    const auto ref = megatron_reference(name);
    MegatronDataset dataset(ref.prefix, ref.vocab_size);
    ASSERT_EQ(dataset.index().sequence_lengths.size(), ref.documents.size());
    std::vector<int32_t> all;
    for (size_t d = 0; d < ref.documents.size(); ++d) {
      EXPECT_EQ(dataset.index().sequence_lengths[d], static_cast<int32_t>(ref.documents[d].size()));
      all.insert(all.end(), ref.documents[d].begin(), ref.documents[d].end());
    }
    EXPECT_EQ(dataset.index().document_indices.front(), 0);
    EXPECT_EQ(dataset.index().document_indices.back(), static_cast<int64_t>(ref.documents.size()));
    EXPECT_EQ(read_all(dataset), all);
  }
}

TEST_F(TokenFiles, MegatronWriterIsByteIdenticalToReference) {
  for (auto [name, type] : {std::pair{"megatron_uint16", TokenType::uint16},
                            std::pair{"megatron_int32", TokenType::int32}}) {
    SCOPED_TRACE(name);
    const auto ref = megatron_reference(name);
    write_megatron_dataset(path("out"), ref.documents, type);
    EXPECT_EQ(read_bytes(path("out.bin")), read_bytes(ref.prefix + ".bin"));
    EXPECT_EQ(read_bytes(path("out.idx")), read_bytes(ref.prefix + ".idx"));
  }
}

TEST_F(TokenFiles, MegatronBadFilesNameTheFileAndTheProblem) {
  const auto ref = megatron_reference("megatron_uint16");
  const auto idx = read_bytes(ref.prefix + ".idx"), bin = read_bytes(ref.prefix + ".bin");
  auto make = [&](const std::string& name, std::vector<uint8_t> i, std::vector<uint8_t> b) {
    write_bytes(path(name + ".idx"), i);
    write_bytes(path(name + ".bin"), b);
    return path(name);
  };
  auto bad_magic = idx;
  bad_magic[0] = 'X';
  expect_error([&] { MegatronDataset(make("magic", bad_magic, bin), ref.vocab_size); },
               {"magic", "bad magic"});
  auto bad_version = idx;
  bad_version[9] = 2;
  expect_error([&] { MegatronDataset(make("version", bad_version, bin), ref.vocab_size); },
               {"version", "version 2"});
  auto float_dtype = idx;
  float_dtype[17] = 7;
  expect_error([&] { MegatronDataset(make("float", float_dtype, bin), ref.vocab_size); },
               {"float", "dtype code 7"});
  auto truncated = idx;
  truncated.resize(idx.size() - 5);
  expect_error([&] { MegatronDataset(make("truncated", truncated, bin), ref.vocab_size); },
               {"truncated", "truncated", "document indices"});
  auto short_bin = bin;
  short_bin.resize(bin.size() - 2);
  expect_error(
      [&] { MegatronDataset(make("shortbin", idx, short_bin), ref.vocab_size); },
      {"shortbin", std::to_string(bin.size()) + " bytes", "has " + std::to_string(bin.size() - 2)});
  expect_error([&] { MegatronDataset(make("vocab", idx, bin), 100); },
               {"vocab.bin", "outside the vocabulary [0, 100)"});
  write_megatron_dataset(path("empty"), {}, TokenType::uint16);
  expect_error([&] { MegatronDataset(path("empty"), 100); }, {"empty", "no tokens"});
  expect_error([&] { MegatronDataset(path("nothing"), 100); }, {"nothing.bin", "cannot open"});
}

DatasetManifest sample_manifest() {
  DatasetManifest m;
  m.tokenizer = "/abs/tokenizer.json";
  m.tokenizer_name = "bpe (4096)";
  m.vocab_size = 4096;
  m.end_of_text = 4095;
  m.train_documents = 10;
  m.val_documents = 1;
  m.train_tokens = 300;
  m.val_tokens = 20;
  m.shards = {{"train_000000.bin", "train", 200},
              {"train_000001.bin", "train", 100},
              {"val_000000.bin", "val", 20}};
  return m;
}

TEST_F(TokenFiles, ManifestRoundTrips) {
  const auto m = sample_manifest();
  const auto back = parse_manifest(m.to_json(), "m.json");
  EXPECT_EQ(back.tokenizer, m.tokenizer);
  EXPECT_EQ(back.tokenizer_name, m.tokenizer_name);
  EXPECT_EQ(back.vocab_size, 4096);
  EXPECT_EQ(back.end_of_text, std::optional<int32_t>(4095));
  EXPECT_EQ(back.train_tokens, 300);
  EXPECT_EQ(back.val_documents, 1);
  EXPECT_EQ(back.files("train"),
            (std::vector<std::string>{"train_000000.bin", "train_000001.bin"}));
  EXPECT_EQ(back.files("val"), (std::vector<std::string>{"val_000000.bin"}));
  auto no_eot = m;
  no_eot.end_of_text.reset();
  EXPECT_FALSE(parse_manifest(no_eot.to_json(), "m.json").end_of_text.has_value());
}

TEST_F(TokenFiles, BadManifestsNameTheFieldAndTheFile) {
  auto edit = [](auto change) {
    auto j = nlohmann::json::parse(sample_manifest().to_json());
    change(j);
    return j.dump();
  };
  expect_error([&] { parse_manifest("{not json", "m.json"); }, {"m.json", "not valid JSON"});
  expect_error([&] { parse_manifest("{\"vocab_size\": 550E55555555}", "m.json"); },
               {"m.json", "not valid JSON"});  // a number overflow (found by fuzzing)
  expect_error([&] { parse_manifest(edit([](auto& j) { j.erase("vocab_size"); }), "m.json"); },
               {"m.json", "'vocab_size'", "missing"});
  expect_error([&] { parse_manifest(edit([](auto& j) { j["format"] = "x"; }), "m.json"); },
               {"'format'"});
  expect_error([&] { parse_manifest(edit([](auto& j) { j["tokens"]["train"] = 301; }), "m.json"); },
               {"'tokens'", "sum of the shards"});
  expect_error(
      [&] { parse_manifest(edit([](auto& j) { j["shards"][0]["file"] = "../x.bin"; }), "m.json"); },
      {"shards[0].file"});
  expect_error([&] { parse_manifest(edit([](auto& j) { j["end_of_text"] = 5000; }), "m.json"); },
               {"'end_of_text'"});
  expect_error([&] { read_manifest(path("nowhere")); },
               {"nowhere", "manifest.json", "lattice data prepare"});
}

}  // namespace
