#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
ctest --preset release
# libFuzzer targets (clang, ASan + UBSan) for the file parsers: about a minute in all.
bash scripts/fuzz.sh
