// The verbs of the `lattice` CLI: each file verb_<name>.cpp registers one verb (or one `bench`
// target) on the CLI11 app. Verbs report user errors by throwing lattice::Error; main prints them
// as one line.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace lattice::cli {

void register_train_verb(CLI::App& app);
void register_generate_verb(CLI::App& app);
// Hugging Face model directories: `lattice export --format hf`, `lattice import --format hf`.
void register_export_verb(CLI::App& app);
// The tokenizer spec recorded as data.tokenizer in a checkpoint's config.toml ("byte" when none).
std::string recorded_tokenizer(const std::string& checkpoint_dir);
void register_import_verb(CLI::App& app);
void register_estimate_verb(CLI::App& app);
void register_simulate_verb(CLI::App& app);
void register_plan_verb(CLI::App& app);
// Runs one config under several data-parallel layouts and compares them (the parity harness).
void register_parity_verb(CLI::App& app);
// Targets of `lattice data <target>`: train a tokenizer; tokenize text into token files.
void register_data_tokenizer(CLI::App& data);
void register_data_prepare(CLI::App& data);
// Targets of `lattice bench <target>`.
void register_bench_train(CLI::App& bench);
void register_bench_gemm(CLI::App& bench);
void register_bench_comm(CLI::App& bench);
void register_bench_tokenizer(CLI::App& bench);
void register_bench_dp(CLI::App& bench);
void register_bench_tp(CLI::App& bench);
void register_bench_pp(CLI::App& bench);
void register_bench_cp(CLI::App& bench);
void register_bench_moe(CLI::App& bench);
void register_bench_checkpoint(CLI::App& bench);

}  // namespace lattice::cli
