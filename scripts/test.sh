#!/usr/bin/env bash
# Sets everything up on a fresh Debian machine and runs every test. `.ci/run` calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh --with-node
./scripts/build.sh
ctest --test-dir build --output-on-failure -j "$(nproc)" "$@"
