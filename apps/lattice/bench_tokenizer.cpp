// `lattice bench tokenizer`: single-thread encode throughput of Lattice's byte-level BPE against
// tiktoken (bench/tiktoken_peer.py) on the same text with the same GPT-2 ranks, in one invocation;
// prints MB/s of both, the ratio, and whether both produced the same ids.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_host.hpp"
#include "lattice/core/error.hpp"
#include "lattice/data/tokenizer.hpp"
#include "verbs.hpp"

namespace lattice::cli {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  check(in.good(), "cannot read benchmark input '" + path.string() + "': check the path");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return std::move(buffer).str();
}

// The Debian fortunes files (text only: no .dat indexes, no .u8 links).
std::vector<std::string> default_inputs() {
  std::vector<std::string> files;
  const fs::path dir = "/usr/share/games/fortunes";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto ext = entry.path().extension();
    if (entry.is_regular_file() && !entry.is_symlink() && ext != ".dat" && ext != ".u8")
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  check(!files.empty(),
        "no benchmark text: /usr/share/games/fortunes is empty or missing "
        "(apt-get install fortunes) — pass --input <files>");
  return files;
}

uint64_t checksum(const std::vector<int32_t>& ids) {
  uint64_t sum = 0;
  for (size_t i = 0; i < ids.size(); ++i) sum += (i + 1) * static_cast<uint64_t>(ids[i]);
  return sum;
}

}  // namespace

void register_bench_tokenizer(CLI::App& bench) {
  CLI::App* target = bench.add_subcommand(
      "tokenizer", "BPE encode throughput (1 thread) against tiktoken, same text and GPT-2 ranks");
  struct Options {
    std::vector<std::string> inputs;
    std::string tokenizer, python = "/usr/bin/python3", script;
    int64_t repeats = 3, copies = 1;
    bool skip_tiktoken = false;
  };
  auto o = std::make_shared<Options>();
  target->add_option("--input", o->inputs, "text files (default: /usr/share/games/fortunes/*)");
  target->add_option("--tokenizer", o->tokenizer,
                     "directory with GPT-2's encoder.json + vocab.bpe (default: "
                     "tests/testdata/gpt2 in the repository around the current directory)");
  target->add_option("--copies", o->copies, "concatenate the input this many times")
      ->capture_default_str();
  target->add_option("--repeats", o->repeats, "timed encodes per side (best counts)")
      ->capture_default_str();
  target->add_option("--python", o->python, "python with tiktoken")->capture_default_str();
  target->add_option("--script", o->script, "tiktoken side (default: bench/tiktoken_peer.py)");
  target->add_flag("--skip-tiktoken", o->skip_tiktoken, "measure Lattice only");
  target->callback([o] {
    std::string gpt2_dir =
        o->tokenizer.empty() ? find_repository_file("tests/testdata/gpt2") : o->tokenizer;
    check(!gpt2_dir.empty() && fs::exists(fs::path(gpt2_dir) / "encoder.json"),
          "cannot find GPT-2's encoder.json + vocab.bpe: pass --tokenizer <dir>");
    const std::vector<std::string> inputs = o->inputs.empty() ? default_inputs() : o->inputs;
    std::string one_copy;
    for (const auto& file : inputs) one_copy += read_bytes(file);
    std::string text;
    for (int64_t i = 0; i < std::max<int64_t>(1, o->copies); ++i) text += one_copy;
    const double megabytes = static_cast<double>(text.size()) / 1e6;

    // Lattice: a fresh tokenizer per repeat (cold piece cache), best time counts.
    double best = 1e30;
    std::vector<int32_t> ids;
    for (int64_t r = 0; r < std::max<int64_t>(1, o->repeats); ++r) {
      auto tokenizer = data::load_tokenizer(gpt2_dir);
      const auto start = std::chrono::steady_clock::now();
      ids = tokenizer->encode(text);
      best = std::min(
          best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    const double lattice_rate = megabytes / best;
    std::printf("text: %zu files, %.2f MB (%lld copies), %zu GPT-2 tokens (%.2f bytes/token)\n",
                inputs.size(), megabytes, static_cast<long long>(o->copies), ids.size(),
                static_cast<double>(text.size()) / static_cast<double>(ids.size()));
    std::printf("%-26s %10s %10s\n", "encoder (1 thread)", "MB/s", "seconds");
    std::printf("%-26s %10.2f %10.3f\n", "lattice", lattice_rate, best);
    std::fflush(stdout);
    if (o->skip_tiktoken) return;

    std::string script =
        o->script.empty() ? find_repository_file("bench/tiktoken_peer.py") : o->script;
    check(!script.empty(),
          "cannot find bench/tiktoken_peer.py: run from the repository or pass "
          "--script (or --skip-tiktoken)");
    const fs::path text_file = fs::temp_directory_path() /
                               ("lattice_bench_tokenizer_" + std::to_string(::getpid()) + ".txt");
    {
      std::ofstream out(text_file, std::ios::binary);
      out.write(text.data(), static_cast<std::streamsize>(text.size()));
      check(out.good(), "cannot write " + text_file.string() + " for the tiktoken side");
    }
    const std::string command = "'" + o->python + "' '" + script + "' --gpt2-dir '" + gpt2_dir +
                                "' --text '" + text_file.string() + "' --repeats " +
                                std::to_string(o->repeats) + " 2>&1";
    std::string output;
    if (FILE* pipe = popen(command.c_str(), "r")) {
      char buffer[4096];
      while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
      pclose(pipe);
    }
    fs::remove(text_file);
    const size_t line = output.rfind("{\"seconds\"");
    if (line == std::string::npos) {
      std::printf("%-26s %10s %10s  (tiktoken side failed: %s)\n", "tiktoken", "-", "-",
                  output.substr(0, 300).c_str());
      return;
    }
    const auto peer = nlohmann::json::parse(output.substr(line));
    const double their_seconds = peer["seconds"].get<double>();
    const double their_rate = megabytes / their_seconds;
    const bool same = peer["tokens"].get<size_t>() == ids.size() &&
                      peer["checksum"].get<uint64_t>() == checksum(ids);
    std::printf("%-26s %10.2f %10.3f\n",
                ("tiktoken " + peer["tiktoken"].get<std::string>()).c_str(), their_rate,
                their_seconds);
    std::printf("ratio lattice / tiktoken: %.2fx; same ids: %s\n", lattice_rate / their_rate,
                same ? "yes" : "NO");
  });
}

}  // namespace lattice::cli
