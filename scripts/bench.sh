#!/usr/bin/env bash
# `make bench`, first entry: dog vdi write / dog vdi read of SIZE on a 3-node loopback cluster
# (3 copies), side by side with cp of a file of the same size on the same disk, in one run.
# Each figure is measured BENCH_ROUNDS times; the table shows the median and the range.
# Output: a markdown table on stdout and target/bench/dog-vs-cp.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=$PWD/target/release
SIZE_MIB=${BENCH_SIZE_MIB:-1024}
ROUNDS=${BENCH_ROUNDS:-3}
# shellcheck source=scripts/bench-lib.sh
. scripts/bench-lib.sh
start_cluster 7100 3 3
$DOG vdi create bench "${SIZE_MIB}M" >/dev/null

echo "generating ${SIZE_MIB} MiB of random data..." >&2
head -c "${SIZE_MIB}M" /dev/urandom >"$WORK/src"

now() { date +%s.%N; }
# MiB/s of running "$@" once.
rate() {
    local t0 t1
    t0=$(now)
    "$@"
    t1=$(now)
    awk -v s="$SIZE_MIB" -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", s / (b - a) }'
}
cp_copy() { cp "$WORK/src" "$WORK/dst"; rm -f "$WORK/dst"; }
cp_copy_sync() { cp "$WORK/src" "$WORK/dst" && sync -f "$WORK/dst"; rm -f "$WORK/dst"; }
dog_write() { $DOG vdi write bench <"$WORK/src"; }
dog_read() { $DOG vdi read bench >"$WORK/dst"; rm -f "$WORK/dst"; }

cat "$WORK/src" >/dev/null # warm the page cache for every reader alike
echo "allocating write (every object new: created crash-safely, fsynced)..." >&2
alloc=$(rate dog_write)
declare -A results
for r in $(seq "$ROUNDS"); do
    echo "round $r/$ROUNDS" >&2
    cat "$WORK/src" >/dev/null
    for f in cp_copy cp_copy_sync dog_write dog_read; do
        results[$f]+="$(rate $f) "
    done
done

stats() { # median min max
    tr ' ' '\n' <<<"$1" | grep -v '^$' | sort -g |
        awk '{a[NR]=$1} END {printf "%.0f %.0f %.0f", a[int((NR+1)/2)], a[1], a[NR]}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
read -r cp cp_lo cp_hi <<<"$(stats "${results[cp_copy]}")"
read -r cps cps_lo cps_hi <<<"$(stats "${results[cp_copy_sync]}")"
read -r dw dw_lo dw_hi <<<"$(stats "${results[dog_write]}")"
read -r dr dr_lo dr_hi <<<"$(stats "${results[dog_read]}")"

cat <<TABLE
| figure (${SIZE_MIB} MiB; median of ${ROUNDS}, min–max) | MiB/s | ÷ cp | ÷ cp+sync |
|---|---|---|---|
| \`cp\` file to file, same disk | $cp ($cp_lo–$cp_hi) | 1.00 | |
| \`cp\` + \`sync\` | $cps ($cps_lo–$cps_hi) | $(ratio "$cps" "$cp") | 1.00 |
| \`dog vdi read\` > file, same disk | $dr ($dr_lo–$dr_hi) | $(ratio "$dr" "$cp") | |
| \`dog vdi write\`, 3 copies, flushed, overwrite | $dw ($dw_lo–$dw_hi) | $(ratio "$dw" "$cp") | $(ratio "$dw" "$cps") |
| \`dog vdi write\`, 3 copies, flushed, allocating (one run) | $alloc | $(ratio "$alloc" "$cp") | $(ratio "$alloc" "$cps") |
TABLE
cat >"$OUT/dog-vs-cp.json" <<JSON
{"size_mib": $SIZE_MIB, "rounds": $ROUNDS, "cp_mibs": $cp, "cp_sync_mibs": $cps,
 "dog_read_mibs": $dr, "dog_write_overwrite_mibs": $dw, "dog_write_allocating_mibs": $alloc}
JSON
