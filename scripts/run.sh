#!/usr/bin/env bash
# Sets everything up on a fresh Debian machine, then runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
# Greedy generation on the demo model (random weights, synthesized on first use).
exec build/tandem generate --ids 2,105,2364,107 --max-tokens 16 --ignore-eos "$@"
