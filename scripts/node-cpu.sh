#!/usr/bin/env bash
# The CPU cost of large writes and reads on the nodes, for comparing two builds side by side:
#   scripts/node-cpu.sh BIN_DIR [LABEL] [perf]
# starts 3 sheep from BIN_DIR (127.0.0.1:7100-7102, 3 copies, no scrub), creates a 512 MiB VDI,
# times three `dog vdi write` of 512 MiB (from a file in /dev/shm) and five `dog vdi read`, and
# prints for each MiB/s and the CPU seconds per GiB of the three nodes together and of dog.
# With `perf` as third argument, the nodes are recorded with `perf record -g` during the reads
# (the data is left in the run directory). Alternate two builds a few times on a quiet
# machine: one run is noisy.
set -euo pipefail
BIN=$1
LABEL=${2:-$(basename "$BIN")}
PERF=${3:-}
R=$(mktemp -d /tmp/node-cpu.XXXXXX)
SRC=$(mktemp /dev/shm/node-cpu.XXXXXX)
chmod 700 "$R"
EXTRA=()
# Builds from before issue 25 have no scrub and no cluster key.
"$BIN/sheep" --help | grep -q scrub-rate && EXTRA=(--scrub-rate 0)
"$BIN/dog" cluster key new "$R/cluster.key" >/dev/null 2>&1 || true
export SHEEP_KEY_FILE=$R/cluster.key
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -f "$SRC"; }
trap cleanup EXIT
for i in 0 1 2; do
    "$BIN/sheep" --dir "$R/node$i" --listen "127.0.0.1:710$i" --cluster "local:$R/state" \
        "${EXTRA[@]}" >"$R/node$i.log" 2>&1 &
    pids+=($!)
done
DOG=("$BIN/dog" --address 127.0.0.1:7100)
for _ in $(seq 100); do
    "${DOG[@]}" cluster info --json 2>/dev/null | grep -q '"nodes": 3' && break
    sleep 0.2
done
"${DOG[@]}" cluster format --copies 3 >/dev/null
"${DOG[@]}" vdi create v 512M >/dev/null
head -c 512M /dev/urandom >"$SRC"
ticks() {
    local t=0 p
    for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    echo "$t"
}
hz=$(getconf CLK_TCK)
# report WHAT GIB START END TICKS DOG_CPU_FILE
report() {
    awk -v l="$LABEL" -v w="$1" -v g="$2" -v s="$3" -v e="$4" -v c="$5" -v hz="$hz" -v f="$6" 'BEGIN {
        while ((getline line < f) > 0) { split(line, x, " "); d += x[1] + x[2] }
        printf "%s: %.1f GiB %s in %.2f s, %.0f MiB/s; sheep %.3f CPU s/GiB, dog %.3f CPU s/GiB\n",
            l, g, w, e - s, g * 1024 / (e - s), c / hz / g, d / g }'
}
c0=$(ticks)
s=$(date +%s.%N)
for _ in 1 2 3; do
    /usr/bin/time -f "%U %S" -a -o "$R/dog-write-cpu" "${DOG[@]}" vdi write v <"$SRC"
done
e=$(date +%s.%N)
c1=$(ticks)
report written 1.5 "$s" "$e" "$((c1 - c0))" "$R/dog-write-cpu"
sync
sleep 2
c0=$(ticks)
if [ -n "$PERF" ]; then
    perf record -q -g -o "$R/perf.data" -p "$(IFS=,; echo "${pids[*]}")" &
    perf_pid=$!
    sleep 0.5
fi
s=$(date +%s.%N)
for _ in 1 2 3 4 5; do
    /usr/bin/time -f "%U %S" -a -o "$R/dog-cpu" "${DOG[@]}" vdi read v >/dev/null
done
e=$(date +%s.%N)
if [ -n "$PERF" ]; then kill -INT "$perf_pid"; wait "$perf_pid" || true; fi
c1=$(ticks)
report read 2.5 "$s" "$e" "$((c1 - c0))" "$R/dog-cpu"
[ -n "$PERF" ] && echo "perf data: $R/perf.data" || rm -rf "$R"
