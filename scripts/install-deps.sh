#!/usr/bin/env bash
# Installs what nvfp4mla needs on a fresh Debian 12 machine that already has the
# CUDA toolkit (or no GPU toolchain at all: the CPU build works without it).
# Idempotent: packages already present are left alone. Extra package names given as arguments
# are installed too (scripts/fuzz.sh adds clang and its runtime).
set -euo pipefail
pkgs=(cmake ninja-build g++ libgtest-dev libgmock-dev nlohmann-json3-dev libcli11-dev
      libssl-dev libxxhash-dev libbenchmark-dev libpng-dev zlib1g-dev
      pkg-config libcairo2-dev fonts-dejavu-core  # cairo + a font: `nvfp4mla eval --plot` PNG figures
      python3 python3-numpy python3-pytest  # the Python package (python/) and its tests
      "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
