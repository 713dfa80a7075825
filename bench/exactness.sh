#!/usr/bin/env bash
# Greedy ids of the fast path against the float32 reference on a full-size checkpoint:
#   bench/exactness.sh MODEL_DIR [TOKENS=200] [TANDEM=build/tandem]
# Prints both id lists and whether they are identical (exit 1 if not). The reference takes a few
# seconds per token on an E2B-shaped model, so this is a benchmark-time check, not a unit test.
set -euo pipefail
model=${1:?usage: bench/exactness.sh MODEL_DIR [TOKENS] [TANDEM]}
tokens=${2:-200}
tandem=${3:-build/tandem}
ids=2,105,2364,107,3041,563,17,1000,2000,3000,4000,5000,6000,7000,8000,9000
fast=$("$tandem" generate --model "$model" --ids "$ids" --max-tokens "$tokens" --ignore-eos)
for isa in avx2 scalar; do
  other=$(TANDEM_ISA=$isa "$tandem" generate --model "$model" --ids "$ids" --max-tokens 32 --ignore-eos)
  echo "cpu ($isa, 32 tokens): $other"
done
reference=$("$tandem" generate --model "$model" --ids "$ids" --max-tokens "$tokens" --ignore-eos --backend reference)
echo "cpu:       $fast"
echo "reference: $reference"
if [[ "$fast" == "$reference" ]]; then echo "identical ($tokens tokens)"; else echo "DIFFERENT"; exit 1; fi
