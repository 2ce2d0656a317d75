// The `lattice` command line: one binary whose verbs train, generate, benchmark, estimate, simulate
// and plan. Any lattice::Error becomes one "error: ..." line on stderr and exit status 2.
#include <cstdio>
#include <exception>

#include "lattice/core/error.hpp"
#include "verbs.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Lattice: train GPT- and Llama-style models across many ranks, and plan the runs."};
  app.require_subcommand(1);
  lattice::cli::register_train_verb(app);
  lattice::cli::register_generate_verb(app);
  lattice::cli::register_export_verb(app);
  lattice::cli::register_import_verb(app);
  CLI::App* data = app.add_subcommand("data", "Tokenizers and token files");
  data->require_subcommand(1);
  lattice::cli::register_data_tokenizer(*data);
  lattice::cli::register_data_prepare(*data);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks that print ratios against a peer");
  bench->require_subcommand(1);
  lattice::cli::register_bench_train(*bench);
  lattice::cli::register_bench_gemm(*bench);
  lattice::cli::register_bench_comm(*bench);
  lattice::cli::register_bench_tokenizer(*bench);
  lattice::cli::register_bench_dp(*bench);
  lattice::cli::register_bench_tp(*bench);
  lattice::cli::register_bench_pp(*bench);
  lattice::cli::register_bench_cp(*bench);
  lattice::cli::register_bench_moe(*bench);
  lattice::cli::register_bench_checkpoint(*bench);
  lattice::cli::register_estimate_verb(app);
  lattice::cli::register_simulate_verb(app);
  lattice::cli::register_plan_verb(app);
  lattice::cli::register_parity_verb(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const lattice::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
