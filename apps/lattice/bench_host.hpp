// What every `lattice bench` prints about the host and how it summarises repeated runs: the CPU's
// model name with the vector and matrix extensions the kernels use, the load average at the start,
// the median of a set of measurements, and the timing options the layer benchmarks share.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace lattice::cli {

// "AMD EPYC | ISA: avx2 avx512f avx512_bf16", from /proc/cpuinfo.
std::string cpu_description();
// "Intel(R) Xeon(R) Processor (family 6, model 167, stepping 1)", from /proc/cpuinfo (the name
// alone where it gives no family).
std::string cpu_model();
// `relative` (e.g. "bench/pytorch_train.py") in the working directory or the nearest directory
// above it that has it ("" where none does): a peer script, the shared test data.
std::string find_repository_file(const std::string& relative);
// The first line of /proc/loadavg ("" where there is none).
std::string load_average();
// The median (the mean of the middle two for an even count; 0 for none).
double median(std::vector<double> values);
// The timing options of a layer benchmark: --steps timed calls per run after --warmup untimed
// ones, --rounds alternations of the compared runs (medians reported).
void add_timing_options(CLI::App& target, int64_t& steps, int64_t& warmup, int64_t& rounds);

}  // namespace lattice::cli
