#!/usr/bin/env bash
# Greedy ids of the fast path against the float32 reference on a full-size checkpoint:
#   bench/exactness.sh MODEL_DIR [TOKENS=200] [TANDEM=build/tandem]
# The best instruction set runs all TOKENS; AVX2 and scalar (TANDEM_ISA) run the first 32 (or
# TOKENS if fewer), which must equal the reference's. IDS=... sets the prompt (16 tokens by
# default; 48 or more take the float prefill panels). Prints every id list and exits 1 on any
# difference. The reference takes seconds per token on an E2B-shaped model, so this is a
# benchmark-time check.
set -euo pipefail
model=${1:?usage: bench/exactness.sh MODEL_DIR [TOKENS] [TANDEM]}
tokens=${2:-200}
tandem=${3:-build/tandem}
ids=${IDS:-2,105,2364,107,3041,563,17,1000,2000,3000,4000,5000,6000,7000,8000,9000}  # IDS=... for small vocabularies
gen() { "$tandem" generate --model "$model" --ids "$ids" --ignore-eos "$@" | sed 's/^{"ids":\[\(.*\)\]}$/\1/'; }
reference=$(gen --max-tokens "$tokens" --backend reference)
echo "reference:            $reference"
status=0
fast=$(gen --max-tokens "$tokens")
echo "cpu (best ISA):       $fast"
[[ "$fast" == "$reference" ]] || { echo "DIFFERENT: cpu (best ISA)"; status=1; }
short=$(( tokens < 32 ? tokens : 32 ))
prefix=$(echo "$reference" | cut -d, -f1-$short)
for isa in avx2 scalar; do
  other=$(TANDEM_ISA=$isa gen --max-tokens $short)
  echo "cpu ($isa, $short tokens): $other"
  [[ "$other" == "$prefix" ]] || { echo "DIFFERENT: cpu ($isa)"; status=1; }
done
[[ $status == 0 ]] && echo "identical ($tokens tokens; avx2 and scalar: $short)"
exit $status
