#!/usr/bin/env bash
# Builds and runs the nccl backend's GPU check on a machine with a GPU: the collective suite on one
# rank per GPU (local and file bootstrap), then one process per GPU under mpirun (MPI bootstrap) where
# mpirun exists. Builds the comm layer alone (LATTICE_COMM_ONLY), so the machine needs a C++20
# compiler, CMake, the CUDA toolkit and NCCL, not the engine's dependencies. NCCL comes from the CUDA
# toolkit or, failing that, from the nvidia-nccl wheel of the machine's Python (as PyTorch ships it).
set -euo pipefail
cd "$(dirname "$0")/../../.."
build=${BUILD_DIR:-build-gpu}
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
nccl_args=()
if ! ls /usr/local/cuda/include/nccl.h /usr/include/nccl.h >/dev/null 2>&1; then
  wheel=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
  if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ]; then
    library=$(ls "$wheel"/lib/libnccl.so* | head -n 1)
    echo "run_nccl_check: NCCL from the Python wheel at $wheel"
    nccl_args=(-DLATTICE_NCCL_INCLUDE_DIR="$wheel/include" -DLATTICE_NCCL_LIBRARY="$library")
    export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLATTICE_NATIVE=OFF \
  -DLATTICE_COMM_ONLY=ON "${nccl_args[@]}" | grep -E "comm:|MPI" || true
cmake --build "$build" --target lattice_comm_nccl_check -j "$(nproc)"
"$build/lattice_comm_nccl_check"
if ! command -v mpirun >/dev/null; then
  echo "run_nccl_check: no mpirun on this machine; the MPI bootstrap was not run"
  exit 0
fi
gpus=$(nvidia-smi -L | wc -l)
OMPI_MCA_rmaps_base_oversubscribe=1 mpirun --allow-run-as-root --oversubscribe -n "$gpus" \
  "$build/lattice_comm_nccl_check"
