#!/usr/bin/env bash
# Installs the Debian packages a target needs, when missing. As root it runs apt-get; otherwise
# it names what to install and fails.
#   install-deps.sh build   what building needs (make build)
#   install-deps.sh run     building, and what `make run` starts (fuse3, etcd for CLUSTER=etcd)
#   install-deps.sh         everything the tests need (make test, make deps)
set -euo pipefail

# The cluster-core tests need only the Rust toolchain and a C compiler for crates that build C.
# sheepfs tests use fio, qemu-img/qemu-io (qemu-utils) and fusermount3 (fuse3); benchmarks
# compare with bindfs. Never install Debian's "fuse" (2.x, removes fuse3) or qemu-system-x86
# (removes qemu-utils 10). `bench report` draws its PNG charts with the DejaVu Sans TTF that
# fonts-dejavu-core installs (read at run time: nothing is needed to build). The etcd
# membership driver's tests (objstore/node/tests/membership_conformance.rs, testkit's etcd
# harness) start real etcd servers: etcd-server gives /usr/bin/etcd. protobuf-compiler gives
# protoc, which the etcd-client crate's build script needs to generate its gRPC code.
# iproute2 (`ip netns`, bridges, veths) puts nodes in network namespaces in the multi-host
# tests (fusefs/sheepfs/tests/multihost.rs; nsenter is util-linux, always there). man-db
# gives `man`, with which the package test (fusefs/sheepfs/tests/package.rs) reads every
# packaged man page; dpkg-deb, which builds the package (make deb), is in every Debian. The
# live-migration tests' VM (scripts/fetch-guest.sh, `make guest`, run by `make test`) needs
# nothing from here: it downloads qemu-system-x86, the libraries of it the host lacks, a
# kernel and busybox-static with apt-get download and unpacks them with dpkg-deb, tools every
# Debian system has, and busybox gives the cpio and depmod it builds the initramfs with.
case "${1:-all}" in
    build) PACKAGES=(gcc protobuf-compiler) ;;
    run) PACKAGES=(gcc protobuf-compiler fuse3 etcd-server) ;;
    all) PACKAGES=(gcc fio fuse3 qemu-utils bindfs fonts-dejavu-core etcd-server protobuf-compiler iproute2 man-db) ;;
    *) echo "install-deps: unknown set '$1': expected build, run or nothing (all)" >&2; exit 2 ;;
esac

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
