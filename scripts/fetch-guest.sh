#!/usr/bin/env bash
# fetch-guest.sh [DIR]: the tiny VM that the live-migration tests boot (testkit's `guest`
# module), built from Debian packages without installing any of them.
#
#   DIR (default target/guest in the workspace)
#   ├── bin/qemu-system-x86_64   wrapper: the unpacked qemu with its libraries, modules, firmware
#   ├── vmlinuz                  Debian's cloud kernel
#   ├── initramfs.cpio.gz        busybox-static, the virtio-blk modules and /init (below)
#   ├── VERSIONS                 the packages used, NAME=VERSION, one a line
#   └── qemu/ kernel/ busybox    what the packages gave (qemu/ is their merged file tree)
#
# Packages are fetched with `apt-get download` and unpacked with `dpkg-deb -x`: installing
# qemu-system-x86 (Debian 12's 7.2) would replace the qemu-utils 10 and fuse3 the other
# tests use. Beside qemu-system-x86 and its data packages, only the libraries it depends on
# that the host has not installed (`dpkg-query` says which) are fetched; `ldd` then checks
# that none is missing. The script is idempotent: a package already unpacked (its stamp under
# DIR/.stamps) is neither downloaded nor unpacked again, and the initramfs is rebuilt only
# when /init or the packages changed. It prints each step it takes, and fails naming what is
# missing. Needs apt and dpkg (as root it refreshes the package lists once if a package has
# no candidate), gzip, find, flock and ldd: all on every Debian system, so
# scripts/install-deps.sh installs nothing for it. `make test` runs it before the tests
# (`make guest` alone); the tests run it too, which does nothing once DIR is ready.
#
# The guest's /init (kernel command line: console=ttyS0, guest.slots=K, guest.pace=SECONDS):
#   - loads virtio_pci and virtio_blk, waits for /dev/vda, prints `GUEST-DISK <bytes>`;
#   - starts a writer: for i = 1, 2, ...: the 4 KiB block at offset (i mod K) * 4096 gets
#     256 copies of the 16-byte line `SEQ %011d\n` (i), written with O_DIRECT and fsynced
#     (dd oflag=direct conv=fsync), then `GUEST-W <i>` is printed; `GUEST-WRITING <K>` once
#     it started;
#   - waits for a line containing `stop` on the console (ttyS0 input), lets the writer finish
#     its current block, prints `GUEST-LAST <last i>`, drops the page cache, prints
#     `GUEST-SUM <sha256 of all of /dev/vda>`, `GUEST-DONE`, and powers off;
#   - on any failure prints `GUEST-FAIL <why>` and powers off.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/target/guest}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
STAMPS="$DIR/.stamps"
mkdir -p "$STAMPS"
# One run at a time per directory (test processes may start it together).
exec 9>"$DIR/.lock"
flock 9

# qemu-system-x86 and the packages of its firmware and data. Its libraries are added below.
QEMU_PACKAGES=(qemu-system-x86 qemu-system-common qemu-system-data seabios)
# The cloud flavour: smallest Debian kernel with ACPI, 8250 serial and virtio as modules.
KERNEL_META=linux-image-cloud-amd64
# virtio-blk over PCI; their dependencies are taken from the kernel's modules.dep.
MODULES=(virtio_pci virtio_blk)

say() { echo "fetch-guest: $*"; }
die() {
    echo "fetch-guest: $*" >&2
    exit 1
}

for tool in apt-get apt-cache dpkg-deb gzip find flock ldd; do
    command -v "$tool" >/dev/null || die "$tool is missing (this script needs a Debian host with apt)"
done

# The candidate version of package $1, refreshing the lists once if there is none.
REFRESHED=
candidate() {
    local v
    v="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
    if [ -z "$v" ] || [ "$v" = "(none)" ]; then
        if [ -z "$REFRESHED" ] && [ "$(id -u)" -eq 0 ]; then
            say "no candidate for $1: apt-get update"
            apt-get update -qq >&2 || die "apt-get update failed"
            REFRESHED=1
            v="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}')"
        fi
    fi
    [ -n "$v" ] && [ "$v" != "(none)" ] || die "no installable version of $1 (run 'apt-get update' as root?)"
    echo "$v"
}

# Downloads package $1 into a fresh temporary directory and prints the .deb's path.
download() {
    local tmp="$DIR/.download"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    (cd "$tmp" && apt-get download -qq "$1" 2>&1 | grep -v -e '^W: Download is performed unsandboxed' >&2) ||
        true
    local deb
    deb="$(ls "$tmp"/*.deb 2>/dev/null | head -n1)"
    [ -n "$deb" ] || die "apt-get download $1 gave no .deb"
    echo "$deb"
}

# Unpacks package $1 into directory $2 unless its stamp says it already is.
unpack() {
    local pkg="$1" into="$2" stamp="$STAMPS/$1"
    if [ -s "$stamp" ]; then
        return
    fi
    local v deb
    v="$(candidate "$pkg")"
    say "downloading $pkg $v"
    deb="$(download "$pkg")"
    mkdir -p "$into"
    dpkg-deb -x "$deb" "$into" || die "dpkg-deb -x $deb failed"
    echo "$v" >"$stamp"
    rm -rf "$DIR/.download"
    say "unpacked $pkg into ${into#"$DIR"/}"
}

# Whether package $1 is installed on the host.
installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}

# qemu and what it needs at run time, merged into one tree: beside QEMU_PACKAGES, each
# library qemu-system-x86 depends on that the host lacks (on a host with the test packages:
# libcapstone4, libfdt1, libslirp0, libvdeplug2; on a bare one also pixman, libjpeg, libpng,
# libsasl2, ...), or that an earlier run unpacked.
for p in "${QEMU_PACKAGES[@]}"; do
    unpack "$p" "$DIR/qemu"
done
for p in $(apt-cache depends qemu-system-x86 2>/dev/null |
    awk '$1 ~ /Depends:$/ && $2 ~ /^lib/ {print $2}' | sort -u); do
    if [ -s "$STAMPS/$p" ] || ! installed "$p"; then
        unpack "$p" "$DIR/qemu"
    fi
done
QEMU_BIN="$DIR/qemu/usr/bin/qemu-system-x86_64"
QEMU_LIBS="$DIR/qemu/usr/lib/x86_64-linux-gnu"
[ -x "$QEMU_BIN" ] || die "$QEMU_BIN is missing after unpacking qemu-system-x86"
missing="$(LD_LIBRARY_PATH="$QEMU_LIBS" ldd "$QEMU_BIN" | awk '/not found/ {print $1}' | tr '\n' ' ')"
[ -z "$missing" ] || die "qemu-system-x86_64 lacks libraries: $missing(neither installed nor among the dependencies of qemu-system-x86 that apt lists)"

mkdir -p "$DIR/bin"
WRAPPER="$DIR/bin/qemu-system-x86_64"
cat >"$WRAPPER.tmp" <<'EOF'
#!/bin/sh
# qemu-system-x86_64 unpacked by scripts/fetch-guest.sh: its own libraries first, its
# accelerator modules (TCG is one) and firmware (SeaBIOS, linuxboot) from the same tree.
here="$(cd "$(dirname "$0")/.." && pwd)"
LD_LIBRARY_PATH="$here/qemu/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
QEMU_MODULE_DIR="$here/qemu/usr/lib/x86_64-linux-gnu/qemu" \
    exec "$here/qemu/usr/bin/qemu-system-x86_64" \
    -L "$here/qemu/usr/share/seabios" -L "$here/qemu/usr/share/qemu" "$@"
EOF
chmod +x "$WRAPPER.tmp"
if ! cmp -s "$WRAPPER.tmp" "$WRAPPER"; then
    mv "$WRAPPER.tmp" "$WRAPPER"
    say "wrote bin/qemu-system-x86_64"
else
    rm -f "$WRAPPER.tmp"
fi
"$WRAPPER" --version >/dev/null 2>&1 || die "$WRAPPER --version fails: $("$WRAPPER" --version 2>&1 | head -n3)"

# busybox-static: the guest's userland, and the host's cpio and depmod here.
if [ ! -s "$STAMPS/busybox-static" ]; then
    unpack busybox-static "$DIR/.busybox"
    cp "$DIR/.busybox/bin/busybox" "$DIR/busybox"
    rm -rf "$DIR/.busybox"
fi
BUSYBOX="$DIR/busybox"
[ -x "$BUSYBOX" ] || die "$BUSYBOX is missing: remove $STAMPS/busybox-static and run again"

# The kernel: vmlinuz and the closure of MODULES under modules.dep; the rest of the package
# (some 150 MB of modules) is dropped. Redone when MODULES changes.
KSTAMP="$STAMPS/kernel"
if [ ! -s "$KSTAMP" ] || [ "$(tail -n1 "$KSTAMP")" != "${MODULES[*]}" ]; then
    kpkg="$(apt-cache depends "$KERNEL_META" 2>/dev/null | awk '/Depends: linux-image-/ {print $2; exit}')"
    if [ -z "$kpkg" ]; then
        candidate "$KERNEL_META" >/dev/null
        kpkg="$(apt-cache depends "$KERNEL_META" | awk '/Depends: linux-image-/ {print $2; exit}')"
    fi
    [ -n "$kpkg" ] || die "cannot tell which kernel package $KERNEL_META depends on"
    kv="$(candidate "$kpkg")"
    say "downloading $kpkg $kv"
    deb="$(download "$kpkg")"
    tmp="$DIR/.kernel"
    rm -rf "$tmp" "$DIR/kernel"
    dpkg-deb -x "$deb" "$tmp"
    kver="$(ls "$tmp/lib/modules" | head -n1)"
    [ -n "$kver" ] || die "$kpkg has no lib/modules/<version>"
    "$BUSYBOX" depmod -b "$tmp" "$kver" || die "depmod over $kpkg failed"
    mkdir -p "$DIR/kernel/lib/modules/$kver"
    cp "$tmp/boot/vmlinuz-$kver" "$DIR/kernel/vmlinuz"
    for m in "${MODULES[@]}"; do
        line="$(grep -E "(^|/)$m\.ko(\.[a-z]+)?:" "$tmp/lib/modules/$kver/modules.dep" || true)"
        if [ -z "$line" ]; then
            grep -qE "/$m\.ko" "$tmp/lib/modules/$kver/modules.builtin" ||
                die "$kpkg has no module $m, built in or loadable"
            continue
        fi
        for f in ${line/:/}; do
            mkdir -p "$DIR/kernel/lib/modules/$kver/$(dirname "$f")"
            cp "$tmp/lib/modules/$kver/$f" "$DIR/kernel/lib/modules/$kver/$f"
        done
    done
    cp "$tmp/lib/modules/$kver/modules.builtin" "$tmp/lib/modules/$kver/modules.order" \
        "$DIR/kernel/lib/modules/$kver/"
    "$BUSYBOX" depmod -b "$DIR/kernel" "$kver"
    rm -rf "$tmp" "$DIR/.download"
    printf '%s=%s\n%s\n' "$kpkg" "$kv" "${MODULES[*]}" >"$KSTAMP"
    say "kernel $kver with modules: $(cd "$DIR/kernel/lib/modules/$kver" && find . -name '*.ko*' -printf '%f ')"
fi
ln -sfn kernel/vmlinuz "$DIR/vmlinuz"
KVER="$(ls "$DIR/kernel/lib/modules")"

# /init: see the top of this file.
INIT="$(
    cat <<'EOF'
#!/bin/busybox sh
# Written by scripts/fetch-guest.sh: the workload of testkit's guest module.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
say() { echo "GUEST-$*"; }
fail() {
    say "FAIL $*"
    poweroff -f
}
slots=1024
pace=0
for arg in $(cat /proc/cmdline); do
    case "$arg" in
    guest.slots=*) slots="${arg#*=}" ;;
    guest.pace=*) pace="${arg#*=}" ;;
    esac
done
say "BOOTED $(uname -r)"
modprobe virtio_pci || fail "modprobe virtio_pci"
modprobe virtio_blk || fail "modprobe virtio_blk"
n=0
while [ ! -b /dev/vda ]; do
    n=$((n + 1))
    [ $n -le 600 ] || fail "no /dev/vda after 60 s"
    sleep 0.1
done
size="$(blockdev --getsize64 /dev/vda)" || fail "blockdev /dev/vda"
say "DISK $size"
[ $((slots * 4096)) -le "$size" ] || fail "a disk of $size bytes holds fewer than $slots slots"

writer() {
    i=0
    while [ ! -e /tmp/stop ]; do
        i=$((i + 1))
        b="SEQ $(printf %011d $i)
"
        for _ in 1 2 3 4 5 6 7 8; do b="$b$b"; done
        printf %s "$b" >/tmp/block
        dd if=/tmp/block of=/dev/vda bs=4096 count=1 seek=$((i % slots)) \
            oflag=direct conv=fsync,notrunc 2>/tmp/dd.err || fail "write $i: $(cat /tmp/dd.err)"
        say "W $i"
        [ "$pace" = 0 ] || sleep "$pace"
    done
    echo "$i" >/tmp/last
}
writer &
wpid=$!
say "WRITING $slots"
while read -r line; do
    case "$line" in *stop*) break ;; esac
done
touch /tmp/stop
wait $wpid
last="$(cat /tmp/last)" || fail "the writer left no count"
say "LAST $last"
echo 3 >/proc/sys/vm/drop_caches
sum="$(sha256sum /dev/vda)" || fail "sha256sum /dev/vda"
say "SUM ${sum%% *}"
say DONE
poweroff -f
EOF
)"

# The initramfs: rebuilt when /init, busybox or the kernel changed.
INPUTS="$(printf '%s\n' "$INIT" "$(cat "$STAMPS/busybox-static" "$KSTAMP")" | sha256sum | cut -d' ' -f1)"
if [ ! -s "$DIR/initramfs.cpio.gz" ] || [ "$(cat "$STAMPS/initramfs" 2>/dev/null)" != "$INPUTS" ]; then
    stage="$DIR/.initramfs"
    rm -rf "$stage"
    mkdir -p "$stage"/{bin,dev,proc,sys,tmp,lib/modules}
    cp "$BUSYBOX" "$stage/bin/busybox"
    cp -r "$DIR/kernel/lib/modules/$KVER" "$stage/lib/modules/"
    printf '%s\n' "$INIT" >"$stage/init"
    chmod +x "$stage/init"
    (cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | "$BUSYBOX" cpio -o -H newc -R 0:0 2>/dev/null) |
        gzip -9 >"$DIR/initramfs.cpio.gz.tmp"
    mv "$DIR/initramfs.cpio.gz.tmp" "$DIR/initramfs.cpio.gz"
    rm -rf "$stage"
    echo "$INPUTS" >"$STAMPS/initramfs"
    say "built initramfs.cpio.gz ($(du -k "$DIR/initramfs.cpio.gz" | cut -f1) KiB)"
fi

# Every package unpacked (a stamp each, but for the kernel's and the initramfs's own).
{
    for s in "$STAMPS"/*; do
        case "${s##*/}" in
        kernel | initramfs) ;;
        *) echo "${s##*/}=$(cat "$s")" ;;
        esac
    done
    head -n1 "$KSTAMP"
} >"$DIR/VERSIONS"
say "ready: $DIR ($(du -sh "$DIR" | cut -f1))"
