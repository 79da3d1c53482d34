#!/usr/bin/env bash
# `make bench`, object-cache entry: fio through sheepfs with the cache, side by side in one run
# with the same VDI through a sheepfs without cache (cache off), and with the raw file
# (O_DIRECT) and `bindfs --multithreaded` over it on the cache's disk. Figures: warm (every
# read hits), cold (first reads), a hit-ratio sweep, writeback writes, `cachectl flush` of
# dirty data against the cluster's sequential write speed, and sheepfs RSS with a 10 GiB
# cache. Prints markdown tables and writes target/bench/cache.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/target/release
SIZE_MIB=${BENCH_FILE_MIB:-1024}
RUNTIME=${BENCH_RUNTIME:-10}
FLUSH_MIB=${BENCH_FLUSH_MIB:-1024}
PORT=7120
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
mkdir -p "$WORK/raw" "$WORK/bind"
start_cluster $PORT 3 3
$DOG vdi create bench "${SIZE_MIB}M" >/dev/null
$DOG vdi create wb "${SIZE_MIB}M" >/dev/null
$DOG vdi create flush "${FLUSH_MIB}M" >/dev/null
$DOG vdi create seqw "${FLUSH_MIB}M" >/dev/null
CACHE=$WORK/cache
CTL="$BIN/cachectl --cache-dir $CACHE"
mount_sheepfs "$WORK/off" $PORT
mount_sheepfs "$WORK/on" $PORT --cache-dir "$CACHE" --cache-size 10G \
    --cache-max-dirty 8G --cache-max-dirty-age 3600
FSPID=$MOUNT_PID

echo "filling ${SIZE_MIB} MiB..." >&2
head -c "${SIZE_MIB}M" /dev/urandom >"$WORK/raw/file"
$DOG vdi write bench <"$WORK/raw/file"
bindfs --multithreaded "$WORK/raw" "$WORK/bind"
mounts+=("$WORK/bind")

RES=$WORK/results.jsonl
: >"$RES"
# job NAME TARGET-LABEL FILE RW BS QD [fio options]: runs fio, records IOPS and MiB/s.
job() {
    local name=$1 label=$2 file=$3 rw=$4 bs=$5 qd=$6
    shift 6
    echo "$name on $label..." >&2
    fio_json "$name" "$file" "${SIZE_MIB}M" "$rw" "$bs" "$qd" "$@" |
        python3 -c '
import json, sys
j = json.load(sys.stdin)["jobs"][0]
side = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
print(json.dumps({"job": sys.argv[1], "target": sys.argv[2], "iops": side["iops"],
                  "mib_s": side["bw_bytes"] / 2**20}))' "$name" "$label" >>"$RES"
}
timed() { job "$@" --runtime="$RUNTIME" --time_based; }
warm_ref() { cat "$WORK/raw/file" >/dev/null; }
warm_cache() { dd if="$WORK/on/bench" of=/dev/null bs=1M iflag=direct status=none; }
off_file=$WORK/off/bench
on_file=$WORK/on/bench
# Attach the VDI read-write so the cache serves it (as qemu would).
exec 7<>"$on_file"

# Cold: the first pass through an empty cache, against the same pass with the cache off.
$CTL evict >/dev/null
job cold-seqread-1m cache "$on_file" read 1M 4
job cold-seqread-1m off "$off_file" read 1M 4
$CTL evict >/dev/null
timed cold-randread-4k-qd1 cache "$on_file" randread 4k 1
timed cold-randread-4k-qd1 off "$off_file" randread 4k 1
$CTL evict >/dev/null
timed cold-randread-4k-qd16 cache "$on_file" randread 4k 16
timed cold-randread-4k-qd16 off "$off_file" randread 4k 16

# Warm: every read hits; references warmed right before.
for spec in "randread-4k-qd1 randread 4k 1" "randread-4k-qd16 randread 4k 16" "seqread-1m read 1M 4"; do
    read -r name rw bs qd <<<"$spec"
    warm_cache
    timed "warm-$name" cache "$on_file" "$rw" "$bs" "$qd"
    warm_ref
    timed "warm-$name" bindfs "$WORK/bind/file" "$rw" "$bs" "$qd"
    warm_ref
    timed "warm-$name" raw "$WORK/raw/file" "$rw" "$bs" "$qd"
done

# Writeback writes (acknowledged from the cache) against bindfs and cache off.
exec 8<>"$WORK/on/wb"
for qd in 1 16; do
    timed "writeback-randwrite-4k-qd$qd" cache "$WORK/on/wb" randwrite 4k $qd
    timed "writeback-randwrite-4k-qd$qd" bindfs "$WORK/bind/file" randwrite 4k $qd
    timed "writeback-randwrite-4k-qd$qd" off "$WORK/off/wb" randwrite 4k $qd
done
exec 8>&-
$CTL flush >/dev/null

# Hit-ratio sweep: a cache of X% of the file, filled by a full read, then uniform random
# reads: LRU keeps X% of the blocks, so about X% of reads hit.
timed sweep-off off "$off_file" randread 4k 16
for pct in 0 25 50 75 100; do
    size=$((SIZE_MIB * pct / 100 + 16))
    $CTL evict >/dev/null
    $CTL resize "${size}M" >/dev/null
    warm_cache
    before=$($CTL stats bench --json)
    timed "sweep-$pct" cache "$on_file" randread 4k 16
    after=$($CTL stats bench --json)
    python3 -c '
import json, sys
b, a = json.loads(sys.argv[1])["vdis"][0], json.loads(sys.argv[2])["vdis"][0]
h, m = a["hits"] - b["hits"], a["misses"] - b["misses"]
print(json.dumps({"job": "sweep-%s" % sys.argv[3], "target": "hit-ratio", "iops": h / max(h + m, 1), "mib_s": 0}))' \
        "$before" "$after" "$pct" >>"$RES"
done
$CTL resize 10G >/dev/null
exec 7>&-

# cachectl flush of dirty data against the cluster's sequential write speed (cache off).
exec 9<>"$WORK/on/flush"
dd if=/dev/urandom of="$WORK/on/flush" bs=1M count="$FLUSH_MIB" conv=notrunc status=none
t0=$(date +%s.%N)
$CTL flush flush >/dev/null
t1=$(date +%s.%N)
exec 9>&-
awk -v s="$FLUSH_MIB" -v a="$t0" -v b="$t1" \
    'BEGIN { printf "{\"job\": \"flush\", \"target\": \"cache\", \"iops\": 0, \"mib_s\": %f}\n", s / (b - a) }' >>"$RES"
job seqwrite-1m off "$WORK/off/seqw" write 1M 4 --size="${FLUSH_MIB}M"
RSS_KIB=$(awk '/VmHWM/ {print $2}' "/proc/$FSPID/status")

python3 - "$RES" "$RSS_KIB" "$OUT/cache.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
fig = {}
for r in rows:
    fig.setdefault(r["job"], {})[r["target"]] = r
json.dump({"peak_rss_kib": int(sys.argv[2]), "figures": fig}, open(sys.argv[3], "w"), indent=1)
def v(job, t, key="iops"):
    return fig[job][t][key]
print("| figure (fio, libaio, direct=1) | cache | reference | ratio | target |")
print("|---|---|---|---|---|")
def line(label, job, ref, key, unit, target):
    a, b = v(job, "cache", key), v(job, ref, key)
    print(f"| {label} | {a:.0f} {unit} | {ref}: {b:.0f} {unit} | {a / b:.2f} | {target} |")
line("warm 4k randread qd1", "warm-randread-4k-qd1", "bindfs", "iops", "IOPS", "≥ 0.9× bindfs")
line("warm 4k randread qd16", "warm-randread-4k-qd16", "bindfs", "iops", "IOPS", "≥ 0.9× bindfs")
line("warm 1M seq read qd4", "warm-seqread-1m", "bindfs", "mib_s", "MiB/s", "≥ 0.9× bindfs")
line("writeback 4k randwrite qd1", "writeback-randwrite-4k-qd1", "bindfs", "iops", "IOPS", "≥ 0.8× bindfs")
line("writeback 4k randwrite qd16", "writeback-randwrite-4k-qd16", "bindfs", "iops", "IOPS", "≥ 0.8× bindfs")
line("cold first seq read 1M qd4", "cold-seqread-1m", "off", "mib_s", "MiB/s", "≥ 0.9× off")
line("cold 4k randread qd1", "cold-randread-4k-qd1", "off", "iops", "IOPS", "≥ 0.9× off")
line("cold 4k randread qd16", "cold-randread-4k-qd16", "off", "iops", "IOPS", "≥ 0.9× off")
fl, sw = v("flush", "cache", "mib_s"), v("seqwrite-1m", "off", "mib_s")
print(f"| cachectl flush of dirty data | {fl:.0f} MiB/s | cluster seq write (off): {sw:.0f} MiB/s | {fl / sw:.2f} | ≥ 0.8× |")
print()
off = v("sweep-off", "off")
print(f"Hit-ratio sweep, 4k randread qd16 (cache off: {off:.0f} IOPS):\n")
print("| cache size (% of file) | measured hit ratio | IOPS | ÷ cache off |")
print("|---|---|---|---|")
for p in (0, 25, 50, 75, 100):
    i = v(f"sweep-{p}", "cache")
    print(f"| {p}% | {fig[f'sweep-{p}']['hit-ratio']['iops'] * 100:.0f}% | {i:.0f} | {i / off:.2f} |")
print(f"\nsheepfs peak RSS with a 10 GiB cache: {int(sys.argv[2]) / 1024:.0f} MiB")
PY
