#!/usr/bin/env bash
# Configures and builds Lattice (Release, Ninja) into build/: everything, tests included, or with
# `--app` only the `lattice` program (what scripts/demo.sh runs; the tests are not configured).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--app" ]; then
  cmake --preset release -DLATTICE_BUILD_TESTS=OFF >/dev/null
  cmake --build --preset release -j "$(nproc)" --target lattice
else
  cmake --preset release -DLATTICE_BUILD_TESTS=ON >/dev/null
  cmake --build --preset release -j "$(nproc)"
fi
