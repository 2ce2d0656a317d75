#!/usr/bin/env bash
# Trains tiny GPT-2, Llama and MoE models for 20 steps under every layout `lattice parity` knows (one
# rank fp32 and bf16, dp/ZeRO, tp/sp, cp ring/Ulysses, pp schedules, ep, recompute) and keeps each
# run's metrics.jsonl and final checkpoint: the evidence for a change meant to alter structure, not
# results. Compare two such folders with scripts/compare_runs.py.
#   bash scripts/bitwise_matrix.sh BUILD/lattice OUT_DIR [case-regex]
set -euo pipefail
lattice=$(realpath "$1")
out=$(realpath -m "$2")
filter=${3:-.}
mkdir -p "$out"
corpus="$out/corpus.txt"
for i in $(seq 400); do
  echo "Line $i: the quick brown fox jumps over the lazy dog; a stitch in time saves nine."
done >"$corpus"

# name | preset | precision | extra overrides
cases=(
  "gpt2-fp32|gpt2-tiny|fp32|"
  "gpt2-bf16|gpt2-tiny|bf16|"
  "llama-fp32|llama-tiny|fp32|"
  "llama-bf16|llama-tiny|bf16|"
  "moe-fp32|mixtral-tiny|fp32|"
  "moe-bf16|mixtral-tiny|bf16|"
  "gpt2-dp2|gpt2-tiny|fp32|--parallelism.dp=2"
  "gpt2-dp2z1|gpt2-tiny|fp32|--parallelism.dp=2 --parallelism.zero=1"
  "gpt2-dp2z2|gpt2-tiny|fp32|--parallelism.dp=2 --parallelism.zero=2"
  "gpt2-dp2z3|gpt2-tiny|fp32|--parallelism.dp=2 --parallelism.zero=3"
  "gpt2-dp2z3-bf16|gpt2-tiny|bf16|--parallelism.dp=2 --parallelism.zero=3"
  "llama-dp2z2|llama-tiny|fp32|--parallelism.dp=2 --parallelism.zero=2"
  "gpt2-tp2|gpt2-tiny|fp32|--parallelism.tp=2"
  "gpt2-tp2sp|gpt2-tiny|fp32|--parallelism.tp=2 --parallelism.sequence_parallel=true"
  "gpt2-tp2sp-bf16|gpt2-tiny|bf16|--parallelism.tp=2 --parallelism.sequence_parallel=true"
  "llama-tp2|llama-tiny|fp32|--parallelism.tp=2"
  "llama-tp2sp|llama-tiny|fp32|--parallelism.tp=2 --parallelism.sequence_parallel=true"
  "llama-tp2sp-bf16|llama-tiny|bf16|--parallelism.tp=2 --parallelism.sequence_parallel=true"
  "gpt2-cp2|gpt2-tiny|fp32|--parallelism.cp=2"
  "llama-cp2|llama-tiny|fp32|--parallelism.cp=2"
  "llama-cp2u|llama-tiny|fp32|--parallelism.cp=2 --context_parallel.mode=ulysses"
  "llama-cp2-bf16|llama-tiny|bf16|--parallelism.cp=2"
  "gpt2-pp2-1f1b|gpt2-tiny|fp32|--parallelism.pp=2 --parallelism.pipeline_schedule=1f1b --training.gradient_accumulation_steps=4"
  "gpt2-pp2-gpipe|gpt2-tiny|fp32|--parallelism.pp=2 --parallelism.pipeline_schedule=gpipe --training.gradient_accumulation_steps=4"
  "llama-pp2-zbh1|llama-tiny|fp32|--parallelism.pp=2 --parallelism.pipeline_schedule=zb-h1 --training.gradient_accumulation_steps=4"
  "llama-pp2-zbv|llama-tiny|fp32|--parallelism.pp=2 --parallelism.pipeline_schedule=zb-v --model.n_layers=4 --training.gradient_accumulation_steps=4"
  "llama-pp2-bf16|llama-tiny|bf16|--parallelism.pp=2 --parallelism.pipeline_schedule=1f1b --training.gradient_accumulation_steps=4"
  "moe-ep2|mixtral-tiny|fp32|--parallelism.dp=2 --parallelism.ep=2"
  "moe-ep2-bf16|mixtral-tiny|bf16|--parallelism.dp=2 --parallelism.ep=2"
  "moe-tp2|mixtral-tiny|fp32|--parallelism.tp=2"
  "gpt2-recompute-sel|gpt2-tiny|bf16|--activation_checkpoint.mode=selective"
  "gpt2-recompute-full|gpt2-tiny|fp32|--activation_checkpoint.mode=full"
  "llama-recompute-sel|llama-tiny|bf16|--activation_checkpoint.mode=selective"
  "llama-recompute-full|llama-tiny|bf16|--activation_checkpoint.mode=full"
  "llama-3d|llama-tiny|fp32|--parallelism.dp=2 --parallelism.tp=2 --parallelism.pp=2 --training.gradient_accumulation_steps=4"
  "moe-recompute-sel|mixtral-tiny|bf16|--activation_checkpoint.mode=selective"
  "gpt2-dp4z3-hsdp2|gpt2-tiny|fp32|--parallelism.dp=4 --parallelism.zero=3 --parallelism.hsdp_shard_size=2"
  "gpt2-pp2-interleaved|gpt2-tiny|fp32|--parallelism.pp=2 --parallelism.pipeline_schedule=interleaved --model.n_layers=4 --training.gradient_accumulation_steps=4"
  "llama-dp2z1-offload|llama-tiny|fp32|--parallelism.dp=2 --parallelism.zero=1 --parallelism.offload_dir=OUT/offload"
)
failed=0
for entry in "${cases[@]}"; do
  IFS='|' read -r name preset precision extra <<<"$entry"
  extra=${extra//OUT/$out}
  [[ "$name" =~ $filter ]] || continue
  run="$out/$name"
  rm -rf "$run"
  # shellcheck disable=SC2086
  if ! "$lattice" train --model.preset="$preset" --model.vocab_size=256 --model.max_seq_len=32 \
      --training.seq_len=32 --training.global_batch_size=8 --training.threads=2 \
      --training.steps=20 --training.precision="$precision" --optimizer.lr=3e-3 \
      --lr_scheduler.warmup_steps=2 --data.train_files="$corpus" --data.val_fraction=0.1 \
      --validation.freq=0 --metrics.log_freq=1 --checkpoint.interval=20 \
      --job.run_dir="$run" $extra >"$out/$name.log" 2>&1; then
    echo "FAILED $name (see $out/$name.log)"
    failed=1
  else
    echo "ran $name"
  fi
done
exit $failed
