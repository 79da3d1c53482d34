#!/usr/bin/env bash
# The CPU cost of large reads on the nodes, for comparing two builds side by side:
#   scripts/read-cpu.sh BIN_DIR [LABEL] [perf]
# starts 3 sheep from BIN_DIR (127.0.0.1:7100-7102, 3 copies, no scrub), writes a 512 MiB VDI,
# then times five `dog vdi read` of it and prints MiB/s and the CPU seconds per GiB read of the
# three nodes and of dog. With `perf` as third argument, the nodes are recorded with
# `perf record -g` meanwhile (the data is left in the run directory). Alternate two builds a
# few times on a quiet machine: one run is noisy.
set -euo pipefail
BIN=$1
LABEL=${2:-$(basename "$BIN")}
PERF=${3:-}
R=$(mktemp -d /tmp/read-cpu.XXXXXX)
chmod 700 "$R"
EXTRA=()
# Builds from before issue 25 have no scrub and no cluster key.
"$BIN/sheep" --help | grep -q scrub-rate && EXTRA=(--scrub-rate 0)
"$BIN/dog" cluster key new "$R/cluster.key" >/dev/null 2>&1 || true
export SHEEP_KEY_FILE=$R/cluster.key
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
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
head -c 512M /dev/urandom | "${DOG[@]}" vdi write v
sync
sleep 2
ticks() {
    local t=0 p
    for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
    echo "$t"
}
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
hz=$(getconf CLK_TCK)
awk -v l="$LABEL" -v s="$s" -v e="$e" -v c="$((c1 - c0))" -v hz="$hz" -v f="$R/dog-cpu" 'BEGIN {
    while ((getline line < f) > 0) { split(line, x, " "); d += x[1] + x[2] }
    printf "%s: 2.5 GiB read in %.2f s, %.0f MiB/s; sheep %.3f CPU s/GiB, dog %.3f CPU s/GiB\n",
        l, e - s, 2560 / (e - s), c / hz / 2.5, d / 2.5 }'
[ -n "$PERF" ] && echo "perf data: $R/perf.data" || rm -rf "$R"
