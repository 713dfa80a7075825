#!/usr/bin/env bash
# Installs everything Tandem needs to build and test on Debian 12 (bookworm).
# Used by the README, .ci/run and the Dockerfile, so every CI run proves these steps.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  nlohmann-json3-dev libsimdjson-dev libfmt-dev libcli11-dev
  libcpp-httplib-dev prometheus-cpp-dev
  libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-numpy curl
)
if [[ "${1:-}" == "--with-node" ]]; then
  packages+=(nodejs npm)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from outside Debian (nodesource, nvm): accept any working node + npm
if [[ "${1:-}" == "--with-node" ]] && command -v node >/dev/null && command -v npm >/dev/null; then
  missing=("${missing[@]/nodejs/}"); missing=("${missing[@]/npm/}")
fi
read -r -a missing <<<"${missing[*]:-}"
if (( ${#missing[@]} )); then
  sudo=""; [[ $(id -u) == 0 ]] || sudo="sudo"
  echo "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
