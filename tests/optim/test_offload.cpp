// Tests of the optimizer-state offload (OffloadedAdamWState): bit-identical to the in-memory
// AdamWOptimizer over several steps (decay and no-decay parameters, odd sizes and chunk sizes,
// whole model and a ZeRO-style sub-range, with and without master weights), tracked bytes, save /
// restore / resume, crash consistency, and the errors for bad directories, full disks and damaged
// files.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lattice/core/error.hpp"
#include "lattice/core/memory.hpp"
#include "lattice/kernels/cpu/adamw.hpp"
#include "lattice/kernels/cpu/cpu_ops.hpp"
#include "lattice/model/parameter_store.hpp"
#include "lattice/optim/adamw_optimizer.hpp"
#include "lattice/optim/offload_adamw_state.hpp"
#include "lattice/optim/offload_file.hpp"

using namespace lattice;
using namespace lattice::optim;
namespace fs = std::filesystem;

namespace {

class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    path_ = fs::path(::testing::TempDir()) /
            ("lattice_offload_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string sub(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// A model-like store: odd sizes, decayed matrices and undecayed vectors interleaved, one parameter
// large enough for the AdamW kernel's parallel path (> 16384 elements); declared and allocated,
// not initialized.
void allocate_test_parameters(model::ParameterStore& store) {
  store.declare("wte", {37, 13}, model::InitKind::normal, true);
  store.declare("ln.weight", {13}, model::InitKind::ones, false);
  store.declare("ln.bias", {13}, model::InitKind::zeros, false);
  store.declare("fc.weight", {5, 7}, model::InitKind::normal, true);
  store.declare("fc.bias", {1}, model::InitKind::zeros, false);
  store.declare("big.weight", {171, 101}, model::InitKind::normal, true);
  store.declare("big.bias", {101}, model::InitKind::zeros, false);
  store.allocate(nullptr);
}

// Deterministic gradients for step `step`, varying in sign and magnitude.
void fill_grads(float* grads, int64_t n, int step) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = static_cast<uint32_t>(i * 2654435761u + static_cast<uint32_t>(step) * 97u);
    grads[i] =
        (static_cast<float>(h % 2001u) - 1000.0f) * 1e-3f * (1.0f + static_cast<float>(step));
  }
}

// The same for every parameter of a store; the alignment padding between parameters keeps zero
// gradients, as in training (the in-memory optimizer never touches it, the offload updates it).
void fill_grads(model::ParameterStore& store, int step) {
  store.zero_grads();
  for (const auto& p : store.parameters())
    fill_grads(store.grads() + p.offset, p.numel, step + static_cast<int>(p.offset));
}

// The gradient scale AdamWOptimizer applies for `norm` (torch's clip_grad_norm_ coefficient).
float clip_scale(double norm, float max_norm) {
  const float coefficient = max_norm / (static_cast<float>(norm) + 1e-6f);
  return coefficient < 1.0f ? coefficient : 1.0f;
}

kernels::AdamWHyper hyper_for(const AdamWSettings& s, float lr) {
  return {lr, s.beta1, s.beta2, s.eps, s.weight_decay};
}

bool bits_equal(const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(a + i, b + i, 4) != 0) {
      std::printf("first difference at %ld: %.9g vs %.9g\n", (long)i, a[i], b[i]);
      return false;
    }
  }
  return true;
}

struct OffloadCase {
  int64_t chunk_elements;
  int read_ahead;
  bool master;
  bool shard;  // offload only a sub-range of the flat buffer (as a ZeRO rank would)
};

class OffloadMatchesInMemory : public ::testing::TestWithParam<OffloadCase> {};

}  // namespace

TEST_P(OffloadMatchesInMemory, BitForBitOverSeveralSteps) {
  const OffloadCase c = GetParam();
  TempDir dir;
  model::ParameterStore reference, offloaded;
  allocate_test_parameters(reference);
  allocate_test_parameters(offloaded);
  reference.initialize(7, 0.02f, 2);
  offloaded.initialize(7, 0.02f, 2);
  const int64_t n = reference.size();
  // A shard that starts and ends inside parameters.
  const int64_t begin = c.shard ? 300 : 0;
  const int64_t end = c.shard ? n - 77 : n;

  AdamWSettings settings;
  settings.weight_decay = 0.1f;
  settings.max_grad_norm = 1.0f;
  kernels::CpuOps adamw_ops;
  AdamWOptimizer optimizer(adamw_ops, reference, settings, nullptr);
  OffloadSettings offload{dir.sub("state"), c.chunk_elements, c.read_ahead, c.master};
  OffloadedAdamWState state(adamw_ops, offload, end - begin, nullptr);
  if (c.master) state.write_master(0, end - begin, offloaded.values() + begin);
  const std::vector<DecayRange> decay = decay_ranges(offloaded, begin, end);

  std::vector<float> m(static_cast<size_t>(end - begin)), v(m.size()), master(m.size());
  for (int step = 1; step <= 4; ++step) {
    const float lr = 1e-3f * static_cast<float>(step);
    fill_grads(reference, step);
    fill_grads(offloaded, step);
    const double norm = optimizer.step(lr);
    // With master offload the caller's buffer only receives values: poison it first.
    if (c.master)
      std::fill(offloaded.mutable_values() + begin, offloaded.mutable_values() + end, -123.0f);
    state.step(offloaded.mutable_values() + begin, offloaded.grads() + begin, decay,
               hyper_for(settings, lr), step, clip_scale(norm, settings.max_grad_norm));
    ASSERT_TRUE(bits_equal(reference.values() + begin, offloaded.values() + begin, end - begin))
        << "parameters differ after step " << step;
    state.read_moments(0, end - begin, m.data(), v.data());
    ASSERT_TRUE(bits_equal(optimizer.exp_avg() + begin, m.data(), end - begin));
    ASSERT_TRUE(bits_equal(optimizer.exp_avg_sq() + begin, v.data(), end - begin));
    if (c.master) {
      state.read_master(0, end - begin, master.data());
      ASSERT_TRUE(bits_equal(reference.values() + begin, master.data(), end - begin));
    }
  }
  EXPECT_EQ(state.last_step(), 4);
  EXPECT_EQ(state.generation(), c.master ? 5u : 4u);  // 4 steps (+ the master's initial write)
  // The moments moved away from zero (the test exercises something).
  EXPECT_NE(m[0], 0.0f);
}

INSTANTIATE_TEST_SUITE_P(
    ChunksReadAheadMasterShard, OffloadMatchesInMemory,
    ::testing::Values(OffloadCase{1 << 20, 2, false, false}, OffloadCase{7, 0, false, false},
                      OffloadCase{1000, 1, false, false}, OffloadCase{4097, 3, false, true},
                      OffloadCase{16384, 2, true, false}, OffloadCase{333, 2, true, true},
                      OffloadCase{1, 4, false, true}),
    [](const ::testing::TestParamInfo<OffloadCase>& info) {
      return "chunk" + std::to_string(info.param.chunk_elements) + "_ahead" +
             std::to_string(info.param.read_ahead) + (info.param.master ? "_master" : "") +
             (info.param.shard ? "_shard" : "");
    });

TEST(OffloadedAdamWState, TracksOnlyTheChunkBuffersAndFreesThemAfterEachCall) {
  kernels::CpuOps ops;  // the backend the offloaded updates run on
  TempDir dir;
  MemoryTracker tracker;
  const int64_t n = 10'000, chunk = 1024;
  const int read_ahead = 2;
  OffloadedAdamWState state(ops, {dir.sub("s"), chunk, read_ahead, false}, n, &tracker);
  EXPECT_EQ(tracker.current(MemoryCategory::optimizer_state), 0);
  std::vector<float> params(n, 0.5f), grads(n, 0.25f);
  const DecayRange all{0, n};
  state.step(params.data(), grads.data(), {&all, 1}, {}, 1);
  // One chunk in use, read_ahead being read, one being written: (2 + 2) x chunk x 2 moments x 4 B.
  const int64_t expected = (read_ahead + 2) * chunk * 2 * 4;
  EXPECT_EQ(state.step_buffer_bytes(), expected);
  EXPECT_EQ(tracker.peak(MemoryCategory::optimizer_state), expected);
  EXPECT_EQ(tracker.current(MemoryCategory::optimizer_state), 0);
  // The in-memory optimizer would hold both moments: 80,000 bytes here, 2.5x the buffers.
  EXPECT_LT(expected, 2 * n * 4);
  EXPECT_EQ(state.disk_bytes(), 2 * 2 * n * 4);
  // A state smaller than one chunk holds chunk buffers of its own size only.
  MemoryTracker small_tracker;
  OffloadedAdamWState small(ops, {dir.sub("small"), chunk, read_ahead, true}, 100, &small_tracker);
  small.step(params.data(), grads.data(), {}, {}, 1);
  EXPECT_EQ(small_tracker.peak(MemoryCategory::optimizer_state), 1 * 100 * 3 * 4);
}

TEST(OffloadedAdamWState, MasterOffloadHandsEachUpdatedChunkToTheSink) {
  kernels::CpuOps ops;  // the backend the offloaded updates run on
  TempDir dir;
  const int64_t n = 2500;
  std::vector<float> initial(n), params(n), grads(n), received(n, -1.0f);
  for (int64_t i = 0; i < n; ++i) initial[i] = 0.001f * static_cast<float>(i % 97);
  fill_grads(grads.data(), n, 1);
  OffloadedAdamWState state(ops, {dir.sub("s"), 600, 1, true}, n, nullptr);
  state.write_master(0, n, initial.data());
  int64_t next = 0;
  // No fp32 output buffer: the sink is the only consumer of the updated master.
  state.step(nullptr, grads.data(), {}, {}, 1, 1.0f,
             [&](int64_t offset, const float* master, int64_t count) {
               EXPECT_EQ(offset, next);  // chunks arrive in order, each once
               std::memcpy(received.data() + offset, master, static_cast<size_t>(count) * 4);
               next = offset + count;
             });
  EXPECT_EQ(next, n);
  // Reference: the kernel on an in-memory copy.
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  params = initial;
  kernels::adamw_update(params.data(), grads.data(), m.data(), v.data(), n, {}, 1);
  EXPECT_TRUE(bits_equal(params.data(), received.data(), n));
  std::vector<float> stored(n);
  state.read_master(0, n, stored.data());
  EXPECT_TRUE(bits_equal(params.data(), stored.data(), n));
}

TEST(OffloadedAdamWState, CheckpointRoundTripContinuesBitForBit) {
  TempDir dir;
  model::ParameterStore reference, restored;
  allocate_test_parameters(reference);
  allocate_test_parameters(restored);
  reference.initialize(3, 0.02f, 2);
  const int64_t n = reference.size();
  AdamWSettings settings;
  settings.max_grad_norm = 0.0f;  // no clipping
  kernels::CpuOps adamw_ops;
  AdamWOptimizer optimizer(adamw_ops, reference, settings, nullptr);
  for (int step = 1; step <= 2; ++step) {
    fill_grads(reference, step);
    optimizer.step(1e-3f);
  }
  // "Checkpoint" the in-memory state, restore it into an offloaded state per parameter range.
  std::memcpy(restored.mutable_values(), reference.values(), static_cast<size_t>(n) * 4);
  OffloadedAdamWState state(adamw_ops, {dir.sub("s"), 999, 2, false}, n, nullptr);
  state.write_moments(0, n, optimizer.exp_avg(), optimizer.exp_avg_sq());
  const auto decay = decay_ranges(restored, 0, n);
  for (int step = 3; step <= 4; ++step) {
    fill_grads(reference, step);
    fill_grads(restored, step);
    optimizer.step(1e-3f);
    state.step(restored.mutable_values(), restored.grads(), decay, hyper_for(settings, 1e-3f),
               step);
  }
  ASSERT_TRUE(bits_equal(reference.values(), restored.values(), n));
  // Saving reads back what the in-memory optimizer holds, per parameter as a checkpoint does.
  for (const auto& p : reference.parameters()) {
    std::vector<float> m(static_cast<size_t>(p.numel)), v(m.size());
    state.read_moments(p.offset, p.numel, m.data(), v.data());
    EXPECT_TRUE(bits_equal(optimizer.exp_avg() + p.offset, m.data(), p.numel)) << p.name;
    EXPECT_TRUE(bits_equal(optimizer.exp_avg_sq() + p.offset, v.data(), p.numel)) << p.name;
  }
  // A partial write changes only its elements.
  std::vector<float> ones(10, 1.0f), m(static_cast<size_t>(n)), v(m.size());
  state.write_moments(1500, 10, ones.data(), ones.data());
  state.read_moments(0, n, m.data(), v.data());
  EXPECT_TRUE(bits_equal(optimizer.exp_avg(), m.data(), 1500));
  EXPECT_EQ(m[1505], 1.0f);
  EXPECT_TRUE(bits_equal(optimizer.exp_avg_sq() + 1510, v.data() + 1510, n - 1510));
}

TEST(OffloadedAdamWState, ResumesTheCommittedStateAndIgnoresAHalfWrittenSlot) {
  kernels::CpuOps ops;  // the backend the offloaded updates run on
  TempDir dir;
  const int64_t n = 5000;
  std::vector<float> params(n, 1.0f), grads(n), m0(n), v0(n), m1(n), v1(n);
  fill_grads(grads.data(), n, 1);
  const OffloadSettings settings{dir.sub("s"), 600, 2, false};
  std::vector<uint8_t> header_after_one;
  {
    OffloadedAdamWState state(ops, settings, n, nullptr);
    state.step(params.data(), grads.data(), {}, {}, 1);
    state.read_moments(0, n, m0.data(), v0.data());
    std::ifstream in(settings.directory + "/adamw_state.header", std::ios::binary);
    header_after_one.assign(std::istreambuf_iterator<char>(in), {});
    state.step(params.data(), grads.data(), {}, {}, 2);
    state.read_moments(0, n, m1.data(), v1.data());
  }
  OffloadSettings resume = settings;
  resume.resume = true;
  {
    OffloadedAdamWState state(ops, resume, n, nullptr);
    EXPECT_EQ(state.last_step(), 2);
    std::vector<float> m(n), v(n);
    state.read_moments(0, n, m.data(), v.data());
    EXPECT_TRUE(bits_equal(m1.data(), m.data(), n));
    EXPECT_TRUE(bits_equal(v1.data(), v.data(), n));
  }
  // A crash after step 2 wrote its slot but before its header was renamed in: the old header
  // (step 1) is what the directory holds, plus a stale temp header.
  {
    std::ofstream out(settings.directory + "/adamw_state.header", std::ios::binary);
    out.write(reinterpret_cast<const char*>(header_after_one.data()),
              static_cast<std::streamsize>(header_after_one.size()));
    std::ofstream(settings.directory + "/adamw_state.header.tmp") << "half";
  }
  {
    OffloadedAdamWState state(ops, resume, n, nullptr);
    EXPECT_EQ(state.last_step(), 1);
    std::vector<float> m(n), v(n);
    state.read_moments(0, n, m.data(), v.data());
    EXPECT_TRUE(bits_equal(m0.data(), m.data(), n));
    EXPECT_TRUE(bits_equal(v0.data(), v.data(), n));
    // Garbage in the inactive slot (a step cut off mid-write) is overwritten, never read.
    const std::string inactive = settings.directory + "/adamw_state." +
                                 std::to_string(1 - static_cast<int>(state.generation() % 2));
    std::fstream f(inactive, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.write("garbage!", 8);
    f.close();
    state.step(params.data(), grads.data(), {}, {}, 2);
    state.read_moments(0, n, m.data(), v.data());
    EXPECT_EQ(state.last_step(), 2);
  }
  // Resuming with another size is refused with a message naming the directory.
  try {
    OffloadedAdamWState wrong(ops, resume, n + 1, nullptr);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(settings.directory), std::string::npos) << e.what();
  }
}

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(OffloadedAdamWState, DamagedFilesAreReportedWithTheirPathAndTheFix) {
  kernels::CpuOps ops;  // the backend the offloaded updates run on
  TempDir dir;
  const int64_t n = 3000;
  std::vector<float> params(n, 1.0f), grads(n, 0.5f);
  const OffloadSettings settings{dir.sub("s"), 1000, 2, false};
  auto state = std::make_unique<OffloadedAdamWState>(ops, settings, n, nullptr);
  state->step(params.data(), grads.data(), {}, {}, 1);
  const std::string active = settings.directory + "/adamw_state.1";  // after one step
  // One flipped byte in the valid slot: the next step names the file and the checksum.
  char original = 0;
  {
    std::fstream f(active, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(4 * 1500);
    f.read(&original, 1);
    f.seekp(4 * 1500);
    const char flipped = static_cast<char>(original ^ 1);
    f.write(&flipped, 1);
  }
  std::string message = error_of([&] { state->step(params.data(), grads.data(), {}, {}, 2); });
  EXPECT_TRUE(contains(message, active) && contains(message, "checksum") &&
              contains(message, "checkpoint"))
      << message;
  // The failed step committed nothing.
  EXPECT_EQ(state->last_step(), 1);
  // A truncated slot (the flipped byte put back first).
  {
    std::fstream f(active, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4 * 1500);
    f.write(&original, 1);
  }
  fs::resize_file(active, 4 * 2000);
  message = error_of([&] { state->step(params.data(), grads.data(), {}, {}, 2); });
  EXPECT_TRUE(contains(message, active) && contains(message, "truncated")) << message;
  state.reset();
  OffloadSettings resume = settings;
  resume.resume = true;
  message = error_of([&] { OffloadedAdamWState s(ops, resume, n, nullptr); });
  EXPECT_TRUE(contains(message, active) && contains(message, "truncated")) << message;
  // A corrupt header.
  {
    std::fstream f(settings.directory + "/adamw_state.header",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.write("\x01", 1);
  }
  message = error_of([&] { OffloadedAdamWState s(ops, resume, n, nullptr); });
  EXPECT_TRUE(contains(message, "adamw_state.header") && contains(message, "corrupt")) << message;
  // No state to resume.
  message = error_of([&] {
    OffloadedAdamWState s(ops, {dir.sub("empty"), 1000, 2, false, true}, n, nullptr);
  });
  EXPECT_TRUE(contains(message, "does not exist")) << message;
}

TEST(OffloadedAdamWState, RefusesUnusableDirectoriesAndBadArguments) {
  kernels::CpuOps ops;  // the backend the offloaded updates run on
  TempDir dir;
  fs::create_directories(dir.sub(""));
  std::ofstream(dir.sub("a_file")) << "x";
  // A directory that cannot be created (its parent is a file).
  std::string message = error_of([&] {
    OffloadedAdamWState s(ops, {dir.sub("a_file/state"), 1000, 2, false}, 10, nullptr);
  });
  EXPECT_TRUE(contains(message, dir.sub("a_file/state")) && contains(message, "writable"))
      << message;
  if (::geteuid() != 0) {  // root writes anywhere
    fs::create_directories(dir.sub("readonly"));
    fs::permissions(dir.sub("readonly"), fs::perms::owner_read | fs::perms::owner_exec);
    message = error_of([&] {
      OffloadedAdamWState s(ops, {dir.sub("readonly"), 1000, 2, false}, 10, nullptr);
    });
    EXPECT_TRUE(contains(message, dir.sub("readonly")) && contains(message, "writable")) << message;
    fs::permissions(dir.sub("readonly"), fs::perms::owner_all);
  }
  // Two states in one directory.
  OffloadedAdamWState first(ops, {dir.sub("shared"), 1000, 2, false}, 10, nullptr);
  message = error_of([&] {
    OffloadedAdamWState second(ops, {dir.sub("shared"), 1000, 2, false}, 10, nullptr);
  });
  EXPECT_TRUE(contains(message, "its own offload directory")) << message;
  // Bad settings and arguments.
  EXPECT_THROW(OffloadedAdamWState(ops, {dir.sub("c"), 0, 2, false}, 10, nullptr), Error);
  EXPECT_THROW(OffloadedAdamWState(ops, {"", 1000, 2, false}, 10, nullptr), Error);
  std::vector<float> p(10), g(10);
  const DecayRange overlapping[2] = {{0, 5}, {4, 2}};
  EXPECT_THROW(first.step(p.data(), g.data(), overlapping, {}, 1), Error);
  const DecayRange outside{8, 5};
  EXPECT_THROW(first.step(p.data(), g.data(), {&outside, 1}, {}, 1), Error);
  EXPECT_THROW(first.step(p.data(), g.data(), {}, {}, 0), Error);
  EXPECT_THROW(first.read_moments(5, 6, p.data(), g.data()), Error);
  EXPECT_THROW(first.read_master(0, 1, p.data()), Error);
}

TEST(OffloadedAdamWState, AFullDiskFailsAtCreationNamingTheFileAndTheFix) {
  kernels::CpuOps ops;  // the backend the offloaded updates run on
  TempDir dir;
  // The file-size limit stands in for a full disk: reserving the slots fails with EFBIG up front.
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 64 * 1024;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string message = error_of([&] {
    OffloadedAdamWState s(ops, {dir.sub("s"), 1 << 20, 2, false}, 1 << 20, nullptr);
  });
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, previous);
  EXPECT_TRUE(contains(message, dir.sub("s") + "/adamw_state.0") && contains(message, "free space"))
      << message;
  // ENOSPC itself reads the same way.
  const std::string enospc = offload_io_error("/x/adamw_state.1", "write 4096 bytes", ENOSPC);
  EXPECT_TRUE(contains(enospc, "/x/adamw_state.1") && contains(enospc, "No space left") &&
              contains(enospc, "free space"))
      << enospc;
}

TEST(OffloadedAdamWState, ResidentMemoryDoesNotGrowByTheOffloadedMoments) {
  kernels::CpuOps ops;  // the backend the offloaded updates run on
  const int64_t rss_start = process_rss_bytes();
  if (rss_start == 0) GTEST_SKIP() << "no /proc RSS on this system";
  TempDir dir;
  const int64_t n = 8 << 20;                           // moments of 64 MiB in memory
  std::vector<float> params(n, 1.0f), grads(n, 0.5f);  // touched: resident before the baseline
  OffloadSettings settings{dir.sub("s"), 1 << 16, 2, false};
  settings.durable = false;  // page cache only: this test measures memory, not the disk
  OffloadedAdamWState state(ops, settings, n, nullptr);
  const int64_t rss_before = process_rss_bytes();
  for (int step = 1; step <= 2; ++step) state.step(params.data(), grads.data(), {}, {}, step);
  const int64_t growth = process_rss_bytes() - rss_before;
  // Chunk buffers are 4 x 512 KiB; allow for allocator caching, far below the 64 MiB of moments.
  EXPECT_LT(growth, 16 << 20) << "resident memory grew by " << growth << " bytes";
  EXPECT_NE(params[0], 1.0f);
}

TEST(OffloadedAdamWState, AProcessKilledMidStepLeavesACompleteCommittedState) {
  kernels::CpuOps ops;  // the backend the offloaded updates run on
  TempDir dir;
  // Small chunks (no OpenMP region in the child) and many steps, so the kill lands mid-run.
  const int64_t n = 50'000;
  const int steps = 400;
  std::vector<float> grads(n);
  fill_grads(grads.data(), n, 3);
  // Reference moments after every step, in memory.
  std::vector<std::vector<float>> ref_m{std::vector<float>(n, 0.0f)}, ref_v = ref_m;
  {
    std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
    for (int step = 1; step <= steps; ++step) {
      kernels::adamw_update(p.data(), grads.data(), m.data(), v.data(), n, {}, step);
      ref_m.push_back(m);
      ref_v.push_back(v);
    }
  }
  OffloadSettings settings{dir.sub("s"), 4096, 2, false};
  settings.durable = false;  // a killed process (not a power cut) keeps the page cache
  for (int delay_ms : {20, 55, 90}) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // the child trains until it is killed
      try {
        OffloadedAdamWState state(ops, settings, n, nullptr);
        std::vector<float> p(n, 1.0f);
        for (int step = 1; step <= steps; ++step) state.step(p.data(), grads.data(), {}, {}, step);
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    OffloadSettings resume = settings;
    resume.resume = true;
    OffloadedAdamWState state(ops, resume, n, nullptr);
    const int64_t committed = state.last_step();
    ASSERT_GE(committed, 0);
    ASSERT_LE(committed, steps);
    std::vector<float> m(n), v(n);
    state.read_moments(0, n, m.data(), v.data());
    EXPECT_TRUE(bits_equal(ref_m[static_cast<size_t>(committed)].data(), m.data(), n))
        << "killed after " << delay_ms << " ms at step " << committed;
    EXPECT_TRUE(bits_equal(ref_v[static_cast<size_t>(committed)].data(), v.data(), n));
    std::printf("killed after %d ms: %s, committed step %ld\n", delay_ms,
                WIFSIGNALED(status) ? "mid-run" : "after finishing", static_cast<long>(committed));
  }
}

TEST(OffloadDecayRanges, FollowTheParametersDecayFlagsInsideAShard) {
  model::ParameterStore store;
  store.declare("w", {2, 8}, model::InitKind::normal, true);  // elements [0, 16)
  store.declare("b", {3}, model::InitKind::zeros, false);     // [16, 19), padded to 32
  store.declare("w2", {16}, model::InitKind::normal, true);   // [32, 48)
  store.declare("w3", {4}, model::InitKind::normal, true);    // [48, 52): adjacent to w2
  ASSERT_EQ(store.info(2).offset, 32);
  ASSERT_EQ(store.info(3).offset, 48);
  const auto ranges = decay_ranges(store, 5, 50);
  ASSERT_EQ(ranges.size(), 2u);
  EXPECT_EQ(ranges[0].offset, 0);  // w from element 5 on
  EXPECT_EQ(ranges[0].count, 11);
  EXPECT_EQ(ranges[1].offset, 27);  // w2 and the first 2 elements of w3, merged
  EXPECT_EQ(ranges[1].count, 18);
  EXPECT_TRUE(decay_ranges(store, 16, 32).empty());
}
