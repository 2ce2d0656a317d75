#!/usr/bin/env bash
# The main job: installs dependencies, builds, trains a byte-level BPE tokenizer (4,096 tokens) on the
# text of Debian's `fortunes` package, tokenizes the fortunes into llm.c token shards with a
# train/validation split (`lattice data prepare`), trains a small GPT-2-style model on them
# (configs/demo.toml), then samples text from the trained checkpoint through the same tokenizer.
# Extra arguments go to `lattice train` (e.g. --training.steps=200). The tokenizer and token files are
# made once (runs/demo-data); a second run resumes from the run's latest checkpoint; delete runs/demo
# and runs/demo-data to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh --demo  # what the build and the run need, nothing for the tests
bash scripts/build.sh --app         # the lattice program alone
corpus='/usr/share/games/fortunes/*'
data=runs/demo-data
if [ ! -f "$data/tokens/manifest.json" ]; then
  mkdir -p "$data"
  ./build/lattice data tokenizer --input "$corpus" --exclude '*.dat' '*.u8' --vocab-size 4096 \
    --out "$data/tokenizer.json"
  # Fortune files hold many fortunes separated by lines of "%": one document each.
  ./build/lattice data prepare --input "$corpus" --exclude '*.dat' '*.u8' \
    --tokenizer "$data/tokenizer.json" --out "$data/tokens" --separator '\n%\n' --val-fraction 0.05
fi
./build/lattice train configs/demo.toml "$@"
echo "--- sample from runs/demo ---"
./build/lattice generate --checkpoint runs/demo --prompt "The secret of life is" \
  --max-tokens 120 --temperature 0.8 --top-k 40 --seed 7
