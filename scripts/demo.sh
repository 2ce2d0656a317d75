#!/usr/bin/env bash
# The main job: installs dependencies, builds, trains a small GPT-2-style model on the text of Debian's
# `fortunes` package (byte-level tokens), then samples text from the trained checkpoint.
# Extra arguments go to `lattice train` (e.g. --training.steps=200). A second run resumes from the
# run's latest checkpoint; delete runs/demo to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
./build/lattice train configs/demo.toml "$@"
echo "--- sample from runs/demo ---"
./build/lattice generate --checkpoint runs/demo --prompt "The secret of life is" \
  --max-tokens 300 --temperature 0.8 --top-k 40 --seed 7
