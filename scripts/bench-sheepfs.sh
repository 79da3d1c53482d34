#!/usr/bin/env bash
# `make bench`, sheepfs entry: fio on a sheepfs file (3 nodes on loopback, 3 copies, no cache)
# side by side, in one run, with two references on the same disk: the raw file with O_DIRECT,
# and `bindfs --multithreaded` over that file (a FUSE passthrough served from the page cache,
# as our nodes serve theirs). Prints a markdown table with ratios to bindfs and writes
# target/bench/sheepfs.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/target/release
SIZE_MIB=${BENCH_FILE_MIB:-1024}
RUNTIME=${BENCH_RUNTIME:-10}
PORT=7110
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
mkdir -p "$WORK/raw" "$WORK/bind"
start_cluster $PORT 3 3
$DOG vdi create bench "${SIZE_MIB}M" >/dev/null
mount_sheepfs "$WORK/mnt" $PORT
FSPID=$MOUNT_PID

echo "filling ${SIZE_MIB} MiB in each target..." >&2
head -c "${SIZE_MIB}M" /dev/urandom >"$WORK/raw/file"
dd if="$WORK/raw/file" of="$WORK/mnt/bench" bs=1M oflag=direct conv=notrunc status=none
sync
bindfs --multithreaded "$WORK/raw" "$WORK/bind"
mounts+=("$WORK/bind")

declare -A TARGET=(
    [raw]="$WORK/raw/file"
    [bindfs]="$WORK/bind/file"
    [sheepfs]="$WORK/mnt/bench"
)
warm() {
    case $1 in
    sheepfs) $DOG vdi read bench >/dev/null ;;
    *) cat "$WORK/raw/file" >/dev/null ;;
    esac
}
# name rw bs iodepth
JOBS=(
    "randread-4k-qd1 randread 4k 1"
    "randread-4k-qd16 randread 4k 16"
    "randwrite-4k-qd1 randwrite 4k 1"
    "randwrite-4k-qd16 randwrite 4k 16"
    "read-1m-qd4 read 1M 4"
    "write-1m-qd4 write 1M 4"
)
echo "{" >"$WORK/results.json"
first=1
for job in "${JOBS[@]}"; do
    read -r name rw bs qd <<<"$job"
    for t in raw bindfs sheepfs; do
        echo "$name on $t..." >&2
        warm "$t"
        json=$(fio_json "$name" "${TARGET[$t]}" "${SIZE_MIB}M" "$rw" "$bs" "$qd" \
            --runtime="$RUNTIME" --time_based)
        [ $first = 1 ] || echo "," >>"$WORK/results.json"
        first=0
        printf '"%s/%s": %s' "$name" "$t" "$json" >>"$WORK/results.json"
    done
done
echo "}" >>"$WORK/results.json"
RSS_KIB=$(awk '/VmHWM/ {print $2}' "/proc/$FSPID/status")

python3 - "$WORK/results.json" "$RSS_KIB" "$OUT/sheepfs.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))
rss = int(sys.argv[2])
out = {"peak_rss_kib": rss, "figures": {}}
rows = []
jobs = list(dict.fromkeys(k.split("/")[0] for k in res))
for job in jobs:
    fig = {}
    for t in ("raw", "bindfs", "sheepfs"):
        j = res[f"{job}/{t}"]["jobs"][0]
        side = j["read"] if j["read"]["io_bytes"] > 0 else j["write"]
        fig[t] = {"iops": side["iops"], "mib_s": side["bw_bytes"] / 2**20}
    out["figures"][job] = fig
    big = "1m" in job
    unit = "MiB/s" if big else "IOPS"
    val = lambda t: fig[t]["mib_s"] if big else fig[t]["iops"]
    rows.append(f"| {job} | {unit} | {val('raw'):.0f} | {val('bindfs'):.0f} | {val('sheepfs'):.0f} "
                f"| {val('sheepfs') / val('bindfs'):.2f} | {val('sheepfs') / val('raw'):.2f} |")
json.dump(out, open(sys.argv[3], "w"), indent=1)
print("| fio job (libaio, direct=1) | unit | raw file O_DIRECT | bindfs --multithreaded | sheepfs | ÷ bindfs | ÷ raw |")
print("|---|---|---|---|---|---|---|")
print("\n".join(rows))
qd1 = out["figures"]["randread-4k-qd1"]["sheepfs"]["iops"]
qd16 = out["figures"]["randread-4k-qd16"]["sheepfs"]["iops"]
print(f"\nsheepfs 4k randread: qd16 / qd1 = {qd16 / qd1:.2f}; sheepfs peak RSS {rss / 1024:.0f} MiB")
PY
