#!/usr/bin/env bash
# Installs what Lattice needs to build, test and run its demo, from Debian's archive (and, for the
# tests' reference checks, a few PyPI packages and two transformers venvs). `--demo`: only what
# scripts/demo.sh needs to build and run the `lattice` program (no test frameworks, PyTorch or
# Python peers).
set -euo pipefail
demo_only=false
[ "${1:-}" = "--demo" ] && demo_only=true
packages=(
  build-essential cmake ninja-build pkg-config
  libdnnl-dev ocl-icd-opencl-dev  # dnnl-config.cmake asks for OpenCL (its GPU runtime); only a recommend
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev
  openmpi-bin libopenmpi-dev
  libpcre2-dev  # the tokenizer's pre-tokenizer (Unicode classes, lookahead)
  libgloo-dev   # replica groups: Gloo's TCP collectives between groups (DiLoCo, fault tolerance)
  fortunes      # the demo's corpus
)
$demo_only || packages+=(
  libgtest-dev libgmock-dev libbenchmark-dev
  etcd-server   # the replica groups' membership store, started by the replica tests
  python3 python3-numpy python3-torch
  libopenblas0-pthread  # PyTorch's fp32 BLAS: without it Debian's torch falls back to reference BLAS
  libjemalloc2  # `bench train` runs PyTorch on jemalloc, its fastest allocator setup here
  clang libclang-rt-dev libomp-dev  # scripts/fuzz.sh: libFuzzer, sanitizers, OpenMP for clang
  python3-pip   # installs tiktoken (PyPI) below
  python3-venv  # the transformers venv below
)
# tiktoken and tokenizers (PyPI; Debian has neither) for the tokenizer's reference data and checks
# and the `bench tokenizer` peer; tensorboard (PyPI) whose reader checks our event files.
install_python_peers() {
  /usr/bin/python3 -c 'import tiktoken, tokenizers, tensorboard' 2>/dev/null && return 0
  echo "install_deps: installing tiktoken, tokenizers, tensorboard for /usr/bin/python3 (PyPI)"
  /usr/bin/python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore \
    --break-system-packages tiktoken tokenizers tensorboard \
    || echo "install_deps: warning: tiktoken/tokenizers/tensorboard not installed; their peer checks are skipped"
}
# transformers (PyPI) for the Hugging Face export/import checks, in a venv over Debian's torch (so
# that its pinned tokenizers does not replace the one above): 4.46.3, the newest that runs on
# Debian's torch 1.13. LATTICE_HF_VENV moves it (tests/train/test_hf_cli.cpp reads the same).
install_hf_peer() {
  local venv="${LATTICE_HF_VENV:-/opt/lattice/hf-venv}"
  "$venv/bin/python" -c 'import transformers' 2>/dev/null && return 0
  echo "install_deps: creating $venv with transformers 4.46.3 (PyPI) over Debian's torch"
  { mkdir -p "$(dirname "$venv")" && /usr/bin/python3 -m venv --system-site-packages "$venv" &&
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "transformers==4.46.3"; } \
    || echo "install_deps: warning: transformers not installed; the Hugging Face checks are skipped"
}
# transformers 5.x (PyPI) for the same checks against the newest config format (RoPE inside
# rope_parameters), in a second venv with PyPI's torch 2.x: transformers 5 needs torch >= 2, and
# Debian's is 1.13. LATTICE_HF5_VENV moves it (tests/train/test_hf_cli.cpp reads the same).
# PyPI's Linux torch wheel is its CUDA build: with `--no-deps` it does not import
# (libcufile.so.0, libcusparseLt.so.0, libnvshmem_host.so.3 missing even beside a CUDA
# toolkit), so the full install it is, nvidia-* wheels included: about 5.6 GB on disk, 4 to 5
# minutes on a clean machine (measured: 4m20s, 2026-12).
install_hf5_peer() {
  local venv="${LATTICE_HF5_VENV:-/opt/lattice/hf5-venv}"
  "$venv/bin/python" -c 'import torch, transformers; assert int(transformers.__version__.split(".")[0]) >= 5' \
    2>/dev/null && return 0
  echo "install_deps: creating $venv with the newest transformers 5.x and torch 2.x (PyPI, about 5.6 GB)"
  { mkdir -p "$(dirname "$venv")" && /usr/bin/python3 -m venv "$venv" &&
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
      'torch>=2,<3' 'transformers>=5,<6' numpy; } \
    || echo "install_deps: warning: transformers 5.x not installed in $venv; its Hugging Face checks are skipped"
}
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  echo "install_deps: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
fi
$demo_only && exit 0
install_python_peers
install_hf_peer
install_hf5_peer
