#!/usr/bin/env bash
# Regenerates the config key table of docs/training.md from the schema: the lines between its
# config-keys markers become `lattice train --help-config=markdown` (tests/train/
# test_config_help_cli.cpp fails while they differ). Usage: scripts/update_config_docs.sh [LATTICE]
# (default: build/lattice; build it first).
set -euo pipefail
cd "$(dirname "$0")/.."
lattice="${1:-build/lattice}"
doc=docs/training.md
begin='<!-- config-keys:begin (scripts/update_config_docs.sh) -->'
end='<!-- config-keys:end -->'
if [[ ! -x "$lattice" ]]; then
  echo "error: $lattice is not an executable: build it (scripts/build.sh) or pass its path" >&2
  exit 2
fi
if ! grep -qxF "$begin" "$doc" || ! grep -qxF "$end" "$doc"; then
  echo "error: $doc lacks the lines '$begin' and '$end' around its key table" >&2
  exit 2
fi
table="$(mktemp)"
trap 'rm -f "$table" "$table.doc"' EXIT
"$lattice" train --help-config=markdown > "$table"
awk -v begin="$begin" -v end="$end" -v table="$table" '
  $0 == begin { print; while ((getline line < table) > 0) print line; skipping = 1; next }
  $0 == end { skipping = 0 }
  !skipping { print }' "$doc" > "$table.doc"
cat "$table.doc" > "$doc"
echo "updated $doc"
