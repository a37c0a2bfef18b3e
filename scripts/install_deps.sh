#!/usr/bin/env bash
# Installs the Debian 12 packages kvcache builds with (each one included or linked somewhere;
# libgmock-dev because the GTest CMake package declares its targets; clang-format for
# make format / format-check; redis-server and redis-tools (redis-cli) for the shared KV tier's
# tests, which start their own servers), only those missing.
# Uses sudo when not root. Safe to run again: does nothing when all are present.
# --fuzz adds what `make fuzz` needs (clang and libFuzzer's runtime), only for that target.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libfmt-dev
  libopenblas-dev libcpp-httplib-dev libb2-dev
  libhiredis-dev libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
  libpcre2-dev libicu-dev zlib1g-dev
  redis-server redis-tools
  clang-format
)
if [ "${1:-}" = "--fuzz" ]; then
  PACKAGES+=(clang libclang-rt-14-dev)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: missing packages (${missing[*]}) and no sudo; install them as root" >&2; exit 1; }
  SUDO="sudo"
fi
echo "installing missing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
