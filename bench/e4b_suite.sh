#!/usr/bin/env bash
# The benchmark matrix behind docs/benchmarks.md, on E4B-shaped random checkpoints:
#   bench/e4b_suite.sh [MODELS_DIR=models] [TANDEM=build/tandem] > results.jsonl
# Synthesizes models/e4b (bf16, ~15 GB) and its q8/q4 conversions when missing, then prints one
# `tandem bench --json` object per configuration, tagged with "config". Decode speed is reported
# against the read bandwidth measured in the same run (roofline), since absolute numbers drift on
# shared machines. Set PROMPT/GEN/BATCH to change the run (defaults 512/128/8).
set -euo pipefail
models=${1:-models}
tandem=${2:-build/tandem}
prompt=${PROMPT:-512}
gen=${GEN:-128}
batch=${BATCH:-8}
mpirun=(mpirun --oversubscribe)
[[ $(id -u) == 0 ]] && mpirun+=(--allow-run-as-root)

[[ -d $models/e4b ]] || "$tandem" synth --preset e4b --out "$models/e4b" >&2
for q in q8 q4; do
  [[ -d $models/e4b-$q ]] || "$tandem" quantize --model "$models/e4b" --type "$q" --out "$models/e4b-$q" >&2
done

run() {  # config-name command...
  local name=$1; shift
  echo "== $name: $*" >&2
  "$@" bench --prompt "$prompt" --gen "$gen" --batch "$batch" --json "${extra[@]}" | tail -n 1 |
    sed "s/^{/{\"config\":\"$name\",/"
}

for f in bf16 q8 q4; do
  dir=$models/e4b; [[ $f != bf16 ]] && dir=$models/e4b-$f
  extra=(--model "$dir"); run "$f" "$tandem"
done
# Kept in the checkpoint's plain layout instead of the row groups (docs/kernels.md).
for q in q8 q4; do extra=(--model "$models/e4b-$q" --weight-layout plain); run "$q-plain" "$tandem"; done
extra=(--model "$models/e4b" --weight-layout plain); run bf16-plain "$tandem"
extra=(--model "$models/e4b" --weights mapped); run bf16-mapped "$tandem"
extra=(--model "$models/e4b" --threads 1); run bf16-tp1-1thread "$tandem"
extra=(--model "$models/e4b" --threads 1); run bf16-tp2 "${mpirun[@]}" -np 2 "$tandem"
extra=(--model "$models/e4b-q4" --threads 1); run q4-tp2 "${mpirun[@]}" -np 2 "$tandem"
extra=(--model "$models/e4b" --threads 1); run bf16-tp2-tcp "${mpirun[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo -np 2 "$tandem"
