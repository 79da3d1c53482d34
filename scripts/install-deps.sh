#!/usr/bin/env bash
# Installs the Debian packages the tests need, when missing. As root it runs apt-get; otherwise
# it names what to install and fails.
set -euo pipefail

# The cluster-core tests need only the Rust toolchain and a C compiler for crates that build C.
# The sheepfs, cache and benchmark work adds its packages here (fuse3, fio, bindfs, ...).
PACKAGES=(gcc)

command -v cargo >/dev/null || { echo "install-deps: cargo is missing: install the Rust toolchain (rustup)" >&2; exit 1; }

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing packages: ${missing[*]}" >&2
    echo "install-deps: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}"
