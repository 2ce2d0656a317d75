#!/usr/bin/env bash
# Builds every libFuzzer target in fuzz/ with clang (ASan + UBSan) in its own build folder and runs
# each one on a scratch copy of its seed corpus (fuzz/corpus/<target>/, when present) for a share
# of FUZZ_TOTAL_SECONDS (default 60, at least FUZZ_MIN_SECONDS = 5 per target). Exits non-zero on
# the first crash, leak, sanitizer report or timeout; the reproducer is kept in $FUZZ_BUILD/artifacts.
# Environment: FUZZ_BUILD (default build-fuzz), FUZZ_JOBS (default 2), FUZZ_TOTAL_SECONDS,
# FUZZ_MIN_SECONDS. The main gcc build is untouched.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD:-build-fuzz}
total=${FUZZ_TOTAL_SECONDS:-60}
minimum=${FUZZ_MIN_SECONDS:-5}
jobs=${FUZZ_JOBS:-2}

if [ ! -f "$build/CMakeCache.txt" ]; then
  mkdir -p "$build"
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLATTICE_FUZZ=ON -DLATTICE_BUILD_TESTS=OFF -DLATTICE_WITH_MPI=OFF -DLATTICE_WITH_NCCL=OFF \
    > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
fi
cmake --build "$build" -j"$jobs" --target fuzz_all

mapfile -t targets < <(find "$build/fuzz" -maxdepth 1 -type f -name 'fuzz_*' -perm -u+x | sort)
[ ${#targets[@]} -gt 0 ] || { echo "fuzz: no targets built in $build/fuzz"; exit 1; }
seconds=$(( total / ${#targets[@]} ))
[ "$seconds" -ge "$minimum" ] || seconds=$minimum
artifacts="$build/artifacts"
mkdir -p "$artifacts"
failed=()
for target in "${targets[@]}"; do
  name=$(basename "$target")
  corpus=$(mktemp -d)
  seeds=()
  [ -d "fuzz/corpus/$name" ] && seeds=("fuzz/corpus/$name")
  echo "fuzz: $name for ${seconds}s"
  if ! "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$artifacts/$name-" "$corpus" "${seeds[@]}" > "$artifacts/$name.log" 2>&1; then
    tail -n 40 "$artifacts/$name.log"
    failed+=("$name")
  else
    grep -E '^stat::number_of_executed_units' "$artifacts/$name.log" | sed "s/^/fuzz: $name /" || true
  fi
  rm -rf "$corpus"
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]} (reproducers in $artifacts)"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each without a finding"
