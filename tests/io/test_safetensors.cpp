// Tests of io/safetensors: round trips of every dtype and odd shapes, metadata, header layout
// (8-byte padding, sorted keys, contiguous data), one clear error per kind of corruption, and a
// cross-check with an independent reader (Python json/struct + torch.frombuffer) when torch is
// installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/tensor.hpp"
#include "lattice/io/atomic_file.hpp"
#include "lattice/io/safetensors.hpp"

using namespace lattice;
namespace fs = std::filesystem;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           ("lattice_st_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

std::string message_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "<no error>";
}

// Fills a tensor's bytes with a recognisable pattern that depends on `seed`.
void fill_pattern(Tensor& tensor, uint8_t seed) {
  auto* bytes = static_cast<uint8_t*>(tensor.raw());
  for (size_t i = 0; i < tensor.nbytes(); ++i) bytes[i] = static_cast<uint8_t>(seed + 7 * i);
}

bool same_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// A file image from a header text (padded here) and data bytes.
std::vector<uint8_t> file_image(std::string header, const std::vector<uint8_t>& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  std::vector<uint8_t> image(8 + header.size() + data.size());
  for (int i = 0; i < 8; ++i) image[i] = static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i));
  std::memcpy(image.data() + 8, header.data(), header.size());
  if (!data.empty()) std::memcpy(image.data() + 8 + header.size(), data.data(), data.size());
  return image;
}

void write_image(const std::string& path, const std::vector<uint8_t>& image) {
  write_file_atomic(path, image.data(), image.size());
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeAndOddShapes) {
  std::vector<Tensor> tensors;
  std::vector<std::string> names = {"z.weight", "a.f16", "m.bf16", "i32",
                                    "i64",      "bytes", "empty",  "scalar"};
  tensors.emplace_back(Shape{2, 3}, DType::f32);
  tensors.emplace_back(Shape{2, 2}, DType::f16);
  tensors.emplace_back(Shape{4}, DType::bf16);
  tensors.emplace_back(Shape{3, 1, 2}, DType::i32);
  tensors.emplace_back(Shape{2}, DType::i64);
  tensors.emplace_back(Shape{5}, DType::u8);
  tensors.emplace_back(Shape{0, 4}, DType::f32);
  tensors.emplace_back(Shape{}, DType::f32);
  std::vector<SafetensorsEntry> entries;
  for (size_t i = 0; i < tensors.size(); ++i) {
    fill_pattern(tensors[i], static_cast<uint8_t>(i * 31 + 1));
    entries.push_back(safetensors_entry(names[i], tensors[i]));
  }
  write_safetensors(path("model.safetensors"), entries);

  SafetensorsFile file(path("model.safetensors"));
  std::vector<std::string> sorted = names;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(file.names(), sorted);
  EXPECT_TRUE(file.metadata().empty());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(names[i]);
    const SafetensorsEntry& stored = file.entry(names[i]);
    EXPECT_EQ(stored.dtype, tensors[i].dtype());
    EXPECT_EQ(stored.shape, tensors[i].shape());
    EXPECT_EQ(stored.nbytes, tensors[i].nbytes());
    EXPECT_TRUE(same_bytes(stored.data, tensors[i].raw(), tensors[i].nbytes()));

    Tensor into(tensors[i].shape(), tensors[i].dtype());
    file.read_into(names[i], into);
    EXPECT_TRUE(same_bytes(into.raw(), tensors[i].raw(), tensors[i].nbytes()));
    Tensor fresh = file.read(names[i]);
    EXPECT_EQ(fresh.shape(), tensors[i].shape());
    EXPECT_TRUE(same_bytes(fresh.raw(), tensors[i].raw(), tensors[i].nbytes()));
  }
  EXPECT_EQ(file.entry("scalar").shape, Shape{});
  EXPECT_EQ(file.entry("scalar").nbytes, 4u);
  EXPECT_EQ(file.entry("empty").nbytes, 0u);
}

TEST_F(SafetensorsTest, EmptyFileWithOnlyMetadataRoundTrips) {
  std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"step", "1200"}, {"note", "quote \" and unicode \xC3\xA9"}};
  write_safetensors(path("meta.safetensors"), {}, metadata);
  SafetensorsFile file(path("meta.safetensors"));
  EXPECT_TRUE(file.names().empty());
  EXPECT_EQ(file.metadata(), metadata);
}

TEST_F(SafetensorsTest, HeaderIsPaddedSortedAndDataIsContiguousInWriteOrder) {
  // Names of several lengths so that the unpadded header length takes many residues mod 8.
  for (int extra = 0; extra < 8; ++extra) {
    SCOPED_TRACE(extra);
    Tensor second({3}, DType::f32), first({2}, DType::i64);
    std::string long_name(static_cast<size_t>(extra) + 1, 'x');
    long_name[0] = 'b';
    std::vector<SafetensorsEntry> entries = {safetensors_entry(long_name, second),
                                             safetensors_entry("a", first)};
    write_safetensors(path("h.safetensors"), entries, {{"k", "v"}});

    std::vector<uint8_t> image = read_file_bytes(path("h.safetensors"));
    uint64_t header_length = 0;
    for (int i = 0; i < 8; ++i) header_length |= uint64_t{image[i]} << (8 * i);
    EXPECT_EQ(header_length % 8, 0u);
    EXPECT_EQ(image.size(), 8 + header_length + 12 + 16);
    std::string header(image.begin() + 8, image.begin() + 8 + static_cast<long>(header_length));
    const size_t last = header.find_last_not_of(' ');
    EXPECT_EQ(header[last], '}');
    EXPECT_LT(header.size() - last - 1, 8u);  // only the padding follows the JSON
    auto parsed = nlohmann::ordered_json::parse(header);
    std::vector<std::string> keys;
    for (const auto& item : parsed.items()) keys.push_back(item.key());
    EXPECT_EQ(keys, (std::vector<std::string>{"__metadata__", "a", long_name}));
    // Data in the order given: the F32 tensor first, then the I64 one.
    EXPECT_EQ(parsed[long_name]["data_offsets"], nlohmann::ordered_json({0, 12}));
    EXPECT_EQ(parsed["a"]["data_offsets"], nlohmann::ordered_json({12, 28}));
    EXPECT_EQ(parsed["a"]["dtype"], "I64");
    EXPECT_EQ(parsed[long_name]["shape"], nlohmann::ordered_json({3}));
  }
}

TEST_F(SafetensorsTest, MissingTensorErrorNamesTensorAndFile) {
  Tensor t({2}, DType::f32);
  write_safetensors(path("m.safetensors"), {safetensors_entry("present", t)});
  SafetensorsFile file(path("m.safetensors"));
  EXPECT_FALSE(file.contains("absent"));
  std::string message = message_of([&] { file.entry("absent"); });
  EXPECT_NE(message.find("'absent'"), std::string::npos) << message;
  EXPECT_NE(message.find(path("m.safetensors")), std::string::npos) << message;
}

TEST_F(SafetensorsTest, ReadIntoChecksShapeAndDtype) {
  Tensor t({2, 3}, DType::f32);
  write_safetensors(path("s.safetensors"), {safetensors_entry("w", t)});
  SafetensorsFile file(path("s.safetensors"));
  Tensor wrong_shape({3, 2}, DType::f32);
  std::string message = message_of([&] { file.read_into("w", wrong_shape); });
  EXPECT_NE(message.find("'w'"), std::string::npos) << message;
  EXPECT_NE(message.find("[2, 3]"), std::string::npos) << message;
  EXPECT_NE(message.find("[3, 2]"), std::string::npos) << message;
  Tensor wrong_dtype({2, 3}, DType::bf16);
  message = message_of([&] { file.read_into("w", wrong_dtype); });
  EXPECT_NE(message.find("BF16"), std::string::npos) << message;
}

TEST_F(SafetensorsTest, ReadF32CopiesAndWidensHalfTypes) {
  Tensor f32({3}, DType::f32), b16({3}, DType::bf16), f16({4}, DType::f16), ints({3}, DType::i32);
  const float values[] = {1.5f, -2.0f, 0.15625f};
  for (int i = 0; i < 3; ++i) {
    f32.f32()[i] = values[i];
    b16.data<bf16>()[i] = to_bf16(values[i]);
  }
  // fp16 bits of 1.0, -2.5, 65504 (largest normal) and 2^-24 (smallest subnormal).
  const uint16_t half_bits[] = {0x3c00, 0xc100, 0x7bff, 0x0001};
  std::memcpy(f16.raw(), half_bits, sizeof(half_bits));
  write_safetensors(path("f.safetensors"),
                    {safetensors_entry("f32", f32), safetensors_entry("bf16", b16),
                     safetensors_entry("f16", f16), safetensors_entry("ints", ints)});
  SafetensorsFile file(path("f.safetensors"));
  float out[4] = {};
  file.read_f32("f32", out, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], values[i]);
  file.read_f32("bf16", out, 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(out[i], round_to_bf16(values[i]));
  file.read_f32("f16", out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -24));

  std::string message = message_of([&] { file.read_f32("f32", out, 4); });
  EXPECT_NE(message.find("'f32'"), std::string::npos) << message;
  EXPECT_NE(message.find("[3]"), std::string::npos) << message;
  EXPECT_NE(message.find("4 elements"), std::string::npos) << message;
  message = message_of([&] { file.read_f32("ints", out, 3); });
  EXPECT_NE(message.find("I32"), std::string::npos) << message;
}

TEST_F(SafetensorsTest, Fp32ValuesNarrowToBf16AndF16RoundingToNearestEven) {
  // Bit patterns worked out by hand: 1 + 2^-8 lies halfway between bf16's 1 (0x3F80) and 1 + 2^-7
  // (0x3F81) and goes to the even 0x3F80; 1 + 3 * 2^-8 lies halfway between 0x3F81 and 0x3F82 and
  // goes to 0x3F82; pi (0x40490FDB) truncates to 0x4049; -2.5 is 0xC020 exactly.
  const float values[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.14159274f, -2.5f};
  const uint16_t bf16_bits[] = {0x3F80, 0x3F82, 0x4049, 0xC020};
  const std::vector<uint8_t> b16 = f32_as_dtype(values, 4, DType::bf16, "w");
  ASSERT_EQ(b16.size(), 8u);
  EXPECT_EQ(std::memcmp(b16.data(), bf16_bits, 8), 0);
  // fp16: 1 + 2^-11 (halfway between 1 and 1 + 2^-10) goes to 1 (0x3C00), 65504 is the largest
  // normal (0x7BFF), 0.1 is 0x2E66, -2.5 is 0xC100.
  const float half_values[] = {1.0f + 0x1p-11f, 65504.0f, 0.1f, -2.5f};
  const uint16_t f16_bits[] = {0x3C00, 0x7BFF, 0x2E66, 0xC100};
  const std::vector<uint8_t> f16 = f32_as_dtype(half_values, 4, DType::f16, "w");
  EXPECT_EQ(std::memcmp(f16.data(), f16_bits, 8), 0);
  // F32 is the bytes themselves; a file of the narrowed bytes reads back as the rounded values.
  const std::vector<uint8_t> f32 = f32_as_dtype(values, 4, DType::f32, "w");
  EXPECT_EQ(std::memcmp(f32.data(), values, 16), 0);
  write_safetensors(path("n.safetensors"), {{"b", DType::bf16, {2, 2}, b16.data(), b16.size()},
                                            {"h", DType::f16, {4}, f16.data(), f16.size()}});
  SafetensorsFile file(path("n.safetensors"));
  float out[4] = {};
  file.read_f32("b", out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(out[2], 3.140625f);
  EXPECT_EQ(out[3], -2.5f);
  file.read_f32("h", out, 4);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 65504.0f);
  EXPECT_EQ(out[2], 0.0999755859375f);
  // Beyond fp16's range: refused, naming the tensor and the fix.
  const float big[] = {1.0f, -70000.0f};
  const std::string message = message_of([&] { f32_as_dtype(big, 2, DType::f16, "wte.weight"); });
  EXPECT_NE(message.find("'wte.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("65504"), std::string::npos) << message;
  EXPECT_NE(message.find("bf16"), std::string::npos) << message;
  EXPECT_NE(message_of([&] { f32_as_dtype(big, 2, DType::i32, "x"); }).find("I32"),
            std::string::npos);
}

TEST_F(SafetensorsTest, WriterRejectsBadEntries) {
  Tensor t({2}, DType::f32);
  const std::string target = path("bad.safetensors");
  std::string message = message_of([&] {
    write_safetensors(target, {safetensors_entry("x", t), safetensors_entry("x", t)});
  });
  EXPECT_NE(message.find("appears twice"), std::string::npos) << message;
  message = message_of([&] { write_safetensors(target, {safetensors_entry("__metadata__", t)}); });
  EXPECT_NE(message.find("reserved"), std::string::npos) << message;
  SafetensorsEntry lying = safetensors_entry("lying", t);
  lying.nbytes = 4;
  message = message_of([&] { write_safetensors(target, {lying}); });
  EXPECT_NE(message.find("'lying'"), std::string::npos) << message;
  EXPECT_NE(message.find("needs 8 bytes"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(target));
  EXPECT_TRUE(fs::is_empty(dir_));
}

TEST_F(SafetensorsTest, RewriteReplacesOldContentAndLeavesNoTempFiles) {
  Tensor big({1000}, DType::f32), small({1}, DType::f32);
  fill_pattern(big, 3);
  small.f32()[0] = 42.0f;
  write_safetensors(path("w.safetensors"), {safetensors_entry("big", big)});
  write_safetensors(path("w.safetensors"), {safetensors_entry("small", small)});
  SafetensorsFile file(path("w.safetensors"));
  EXPECT_EQ(file.names(), std::vector<std::string>{"small"});
  float value = 0;
  file.read_f32("small", &value, 1);
  EXPECT_EQ(value, 42.0f);
  std::vector<std::string> listing;
  for (const auto& item : fs::directory_iterator(dir_)) listing.push_back(item.path().filename());
  EXPECT_EQ(listing, std::vector<std::string>{"w.safetensors"});
}

TEST_F(SafetensorsTest, MovedFileKeepsItsData) {
  Tensor t({2}, DType::f32);
  t.f32()[0] = 1.0f;
  t.f32()[1] = 2.0f;
  write_safetensors(path("mv.safetensors"), {safetensors_entry("t", t)});
  SafetensorsFile original(path("mv.safetensors"));
  SafetensorsFile moved = std::move(original);
  float out[2];
  moved.read_f32("t", out, 2);
  EXPECT_EQ(out[1], 2.0f);
  EXPECT_EQ(moved.path(), path("mv.safetensors"));
}

// ---- corruption: every damaged file is refused with one line naming the file and the problem ----

class SafetensorsCorruptionTest : public SafetensorsTest {
 protected:
  // Writes `image`, opens it, and returns the error message (which must name the file).
  std::string open_error(const std::vector<uint8_t>& image) {
    const std::string target = path("damaged.safetensors");
    write_image(target, image);
    std::string message = message_of([&] { SafetensorsFile file(target); });
    EXPECT_NE(message.find(target), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  // A valid two-tensor file: a = F32 [4] at [0, 16), b = F32 [2] at [16, 24).
  std::vector<uint8_t> valid_image() {
    Tensor a({4}, DType::f32), b({2}, DType::f32);
    write_safetensors(path("valid.safetensors"),
                      {safetensors_entry("a", a), safetensors_entry("b", b)});
    return read_file_bytes(path("valid.safetensors"));
  }
  static std::vector<uint8_t> data_bytes(size_t n) { return std::vector<uint8_t>(n, 0x11); }
};

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "message: " << (text)

TEST_F(SafetensorsCorruptionTest, TruncatedAtEveryStage) {
  std::vector<uint8_t> image = valid_image();
  uint64_t header_length = 0;
  for (int i = 0; i < 8; ++i) header_length |= uint64_t{image[i]} << (8 * i);
  ASSERT_TRUE(SafetensorsFile(path("valid.safetensors")).contains("a"));
  const size_t data_start = 8 + header_length;
  for (size_t keep : {size_t{0}, size_t{5}, size_t{8}, size_t{8 + header_length / 2}, data_start,
                      data_start + 10, image.size() - 1}) {
    SCOPED_TRACE(keep);
    std::string message = open_error(std::vector<uint8_t>(image.begin(), image.begin() + keep));
    EXPECT_CONTAINS(message, "is truncated");
    EXPECT_CONTAINS(message, "resume from an earlier checkpoint");
    if (keep >= data_start) {
      EXPECT_CONTAINS(
          message, "header says 24 bytes of data, file has " + std::to_string(keep - data_start));
    }
  }
}

TEST_F(SafetensorsCorruptionTest, BadHeaderLength) {
  std::vector<uint8_t> image = valid_image();
  std::vector<uint8_t> huge = image;
  huge[5] = 0x40;  // about 70 TB of header
  EXPECT_CONTAINS(open_error(huge), "implausible header length");
  std::vector<uint8_t> too_long = image;
  too_long[0] = static_cast<uint8_t>(image.size());  // longer than what follows the length
  too_long[1] = 0;
  EXPECT_CONTAINS(open_error(too_long), "is truncated: its header length says");
  std::vector<uint8_t> cut_json = image;
  const std::string header(image.begin() + 8, image.begin() + 8 + image[0]);
  cut_json[0] = static_cast<uint8_t>(header.find_last_of('}'));  // drops the closing brace
  EXPECT_CONTAINS(open_error(cut_json), "not valid JSON");
}

TEST_F(SafetensorsCorruptionTest, BadJson) {
  EXPECT_CONTAINS(open_error(file_image("{\"a\": {\"dtype\": \"F32\",", {})), "not valid JSON");
  EXPECT_CONTAINS(open_error(file_image("[1, 2, 3]", {})), "not a JSON object");
  EXPECT_CONTAINS(open_error(file_image("", {})), "not valid JSON");
  EXPECT_CONTAINS(open_error(file_image(R"({"a": 5})", {})), "'a' whose header entry is not");
  EXPECT_CONTAINS(open_error(file_image(R"({"a": {"dtype": "F32", "shape": [1]}})", data_bytes(4))),
                  "'a' without \"data_offsets\"");
  EXPECT_CONTAINS(open_error(file_image(R"({"__metadata__": {"step": 5}})", {})),
                  "metadata 'step' whose value is not a string");
  EXPECT_CONTAINS(
      open_error(file_image(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                                "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                            data_bytes(8))),
      "names 'a' twice");
}

TEST_F(SafetensorsCorruptionTest, UnknownDtype) {
  std::string message = open_error(file_image(
      R"({"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", data_bytes(8)));
  EXPECT_CONTAINS(message, "tensor 'a' with unknown dtype \"F64\"");
  EXPECT_CONTAINS(message, "convert it");
  EXPECT_CONTAINS(message, "supported: F32, BF16");
}

TEST_F(SafetensorsCorruptionTest, SizeMismatch) {
  std::string message = open_error(file_image(
      R"({"a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}})", data_bytes(16)));
  EXPECT_CONTAINS(message, "'a' of dtype F32 and shape [5] (20 bytes)");
  EXPECT_CONTAINS(message, "span 16 bytes");
}

TEST_F(SafetensorsCorruptionTest, NegativeOrReversedOrMalformedNumbers) {
  EXPECT_CONTAINS(open_error(file_image(
                      R"({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}})", {})),
                  "negative shape dimension -1");
  EXPECT_CONTAINS(open_error(file_image(
                      R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [-1, 0]}})", {})),
                  "negative data offset");
  EXPECT_CONTAINS(
      open_error(file_image(R"({"a": {"dtype": "U8", "shape": [0], "data_offsets": [4, 2]}})",
                            data_bytes(4))),
      "end before they begin");
  EXPECT_CONTAINS(open_error(file_image(
                      R"({"a": {"dtype": "U8", "shape": [1.5], "data_offsets": [0, 1]}})", {})),
                  "is not an integer");
  EXPECT_CONTAINS(
      open_error(file_image(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0]}})", {})),
      "is not [begin, end]");
  EXPECT_CONTAINS(open_error(file_image(R"({"a": {"dtype": "I64", "shape": [4294967296, 4294967296],
                                      "data_offsets": [0, 0]}})",
                                        {})),
                  "overflows");
}

TEST_F(SafetensorsCorruptionTest, OffsetsOutOfRange) {
  std::string message =
      open_error(file_image(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [100, 108]}})",
                            data_bytes(16)));
  EXPECT_CONTAINS(message, "tensor 'b' whose data_offsets [100, 108] lie outside");
  EXPECT_CONTAINS(message, "16 bytes");
}

TEST_F(SafetensorsCorruptionTest, OverlappingTensors) {
  std::string message =
      open_error(file_image(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})",
                            data_bytes(16)));
  EXPECT_CONTAINS(message, "'a' and 'b' whose data_offsets overlap");
}

TEST_F(SafetensorsCorruptionTest, GapsAndEmptyTensorsAreAccepted) {
  write_image(path("gap.safetensors"),
              file_image(R"({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                             "e": {"dtype": "F32", "shape": [0], "data_offsets": [1, 1]},
                             "b": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]}})",
                         {1, 2, 3, 4, 5, 6}));
  SafetensorsFile file(path("gap.safetensors"));
  Tensor b({2}, DType::u8);
  file.read_into("b", b);
  EXPECT_EQ(b.data<uint8_t>()[0], 5);
  EXPECT_EQ(b.data<uint8_t>()[1], 6);
}

// ---- an independent reader agrees with our bytes ----

TEST_F(SafetensorsTest, IndependentPythonReaderAgrees) {
  if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "/usr/bin/python3 with torch is not available; cross-check skipped";
  }
  Tensor w({2, 3}, DType::f32), h({3}, DType::bf16), half({2}, DType::f16), ids({4}, DType::i64),
      mask({3}, DType::u8), scalar({}, DType::i32), empty({0, 2}, DType::f32);
  for (int i = 0; i < 6; ++i) w.f32()[i] = 0.5f * static_cast<float>(i) - 1.0f;
  const float h_values[] = {1.5f, -2.0f, 0.25f};
  for (int i = 0; i < 3; ++i) h.data<bf16>()[i] = to_bf16(h_values[i]);
  const uint16_t half_bits[] = {0x3c00, 0xc100};  // 1.0, -2.5
  std::memcpy(half.raw(), half_bits, sizeof(half_bits));
  for (int i = 0; i < 4; ++i) ids.data<int64_t>()[i] = (int64_t{1} << 40) * (i - 1);
  for (int i = 0; i < 3; ++i) mask.data<uint8_t>()[i] = static_cast<uint8_t>(250 + i);
  scalar.data<int32_t>()[0] = -7;
  write_safetensors(
      path("cross.safetensors"),
      {safetensors_entry("w", w), safetensors_entry("h", h), safetensors_entry("half", half),
       safetensors_entry("ids", ids), safetensors_entry("mask", mask),
       safetensors_entry("scalar", scalar), safetensors_entry("empty", empty)},
      {{"format", "pt"}});

  const std::string script = R"PY(
import json, struct, sys, torch
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
assert n % 8 == 0, n
header = json.loads(raw[8:8 + n].decode("utf-8"))
data = raw[8 + n:]
assert header.pop("__metadata__") == {"format": "pt"}
kinds = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
         "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8}
def load(name):
    spec = header[name]
    b, e = spec["data_offsets"]
    buf = bytearray(data[b:e])
    if not buf:
        return torch.zeros(spec["shape"], dtype=kinds[spec["dtype"]])
    return torch.frombuffer(buf, dtype=kinds[spec["dtype"]]).reshape(spec["shape"])
expect = {
    "w": torch.tensor([[-1.0, -0.5, 0.0], [0.5, 1.0, 1.5]]),
    "h": torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16),
    "half": torch.tensor([1.0, -2.5], dtype=torch.float16),
    "ids": torch.tensor([-(1 << 40), 0, 1 << 40, 2 << 40], dtype=torch.int64),
    "mask": torch.tensor([250, 251, 252], dtype=torch.uint8),
    "scalar": torch.tensor(-7, dtype=torch.int32),
    "empty": torch.zeros(0, 2),
}
assert sorted(header) == sorted(expect), sorted(header)
for name, want in expect.items():
    got = load(name)
    assert got.dtype == want.dtype and got.shape == want.shape, (name, got, want)
    assert torch.equal(got, want), (name, got, want)
assert max(s["data_offsets"][1] for s in header.values()) == len(data)
print("python reader agrees")
)PY";
  write_text_atomic(path("check.py"), script);
  const std::string command = "/usr/bin/python3 " + path("check.py") + " " +
                              path("cross.safetensors") + " > " + path("out.txt") + " 2>&1";
  int status = std::system(command.c_str());
  EXPECT_EQ(status, 0) << read_file_text(path("out.txt"));
  EXPECT_CONTAINS(read_file_text(path("out.txt")), "python reader agrees");
}

}  // namespace
