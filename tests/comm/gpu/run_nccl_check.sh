#!/usr/bin/env bash
# Builds and runs the nccl backend's GPU check on a machine with a GPU: the collective suite on one
# rank per GPU (local and file bootstrap), then one process per GPU under mpirun (MPI bootstrap).
set -euo pipefail
cd "$(dirname "$0")/../../.."
build=${BUILD_DIR:-build-gpu}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATTICE_NATIVE=OFF >/dev/null
cmake --build "$build" --target lattice_comm_nccl_check -j "$(nproc)"
"$build/lattice_comm_nccl_check"
gpus=$(nvidia-smi -L | wc -l)
OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --allow-run-as-root --oversubscribe -n "$gpus" \
  "$build/lattice_comm_nccl_check"
