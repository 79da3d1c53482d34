#!/usr/bin/env bash
# `make run`: a 3-node cluster on 127.0.0.1:7000-7002 with the local membership driver, state
# under ./run, and sheepfs mounted at ./mnt with a 1G writeback object cache in ./run/cache. Reuses what a previous run left (data, format,
# VDIs); FRESH=1 starts empty. Ctrl-C unmounts and stops every node cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release
RUN=${RUN_DIR:-run}
PORTS=(7000 7001 7002)
MNT=${MNT_DIR:-mnt}
DOG="$BIN/dog --address 127.0.0.1:${PORTS[0]}"

stop_leftovers() {
    for pidfile in "$RUN"/*.pid; do
        [ -e "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        if kill -0 "$pid" 2>/dev/null && grep -q sheep "/proc/$pid/cmdline" 2>/dev/null; then
            echo "stopping sheep $pid left by a previous run"
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$pidfile"
    done
}

is_mounted() { grep -q " $(realpath -m "$MNT") " /proc/self/mountinfo; }

# A mount left by a previous run (live or dead) goes first, then its nodes.
if [ -d "$MNT" ] && is_mounted; then
    echo "unmounting $MNT left by a previous run"
    umount "$MNT" 2>/dev/null || umount -l "$MNT"
fi
stop_leftovers
[ "${FRESH:-0}" = 1 ] && rm -rf "$RUN"
mkdir -p "$RUN"

for port in "${PORTS[@]}"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "run: port $port is in use by another program; stop it first (ss -ltnp 'sport = :$port')" >&2
        exit 1
    fi
done

pids=()
stop() {
    trap - INT TERM EXIT
    echo
    echo "stopping the cluster..."
    if is_mounted; then
        umount "$MNT" 2>/dev/null || { echo "$MNT is busy: detaching it"; umount -l "$MNT"; }
    fi
    # sheepfs first (it pushes its cache's dirty data and releases its locks while the nodes
    # are still up), then the nodes.
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -f "$RUN"/*.pid
    echo "stopped; data stays in $RUN (FRESH=1 make run starts empty)"
}
trap stop INT TERM EXIT

for i in "${!PORTS[@]}"; do
    "$BIN/sheep" --dir "$RUN/node$i" --listen "127.0.0.1:${PORTS[$i]}" \
        --cluster "local:$RUN/state" >>"$RUN/node$i.log" 2>&1 &
    pids+=($!)
    echo $! >"$RUN/node$i.pid"
done

echo -n "waiting for 3 nodes"
for _ in $(seq 100); do
    if $DOG cluster info --json 2>/dev/null | grep -q '"nodes": 3'; then break; fi
    for pid in "${pids[@]}"; do
        kill -0 "$pid" 2>/dev/null || { echo; echo "run: a sheep exited; see $RUN/node*.log" >&2; tail -5 "$RUN"/node*.log >&2; exit 1; }
    done
    echo -n .; sleep 0.2
done
echo
$DOG cluster info --json | grep -q '"nodes": 3' || { echo "run: the nodes did not form a cluster; see $RUN/node*.log" >&2; exit 1; }

if $DOG cluster info --json | grep -q '"status": "unformatted"'; then
    $DOG cluster format --copies 3
fi
$DOG vdi info demo >/dev/null 2>&1 || $DOG vdi create demo 1G

mkdir -p "$MNT"
"$BIN/sheepfs" --cluster "127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]}" "$MNT" \
    --foreground --log-file "$RUN/sheepfs.log" --cache-dir "$RUN/cache" --cache-size 1G &
pids=("$!" "${pids[@]}")
echo $! >"$RUN/sheepfs.pid"
for _ in $(seq 100); do is_mounted && break; sleep 0.1; done
is_mounted || { echo "run: sheepfs did not mount; see $RUN/sheepfs.log" >&2; tail -5 "$RUN/sheepfs.log" >&2; exit 1; }

$DOG cluster info
echo
$DOG vdi list
echo
ls -l "$MNT"
cat <<MSG

The cluster is up: 3 sheep on 127.0.0.1:7000-7002 (logs in $RUN/node*.log), and sheepfs
shows every VDI as a file in $MNT (log in $RUN/sheepfs.log), through a 1G writeback cache in
$RUN/cache.
Try, in another terminal:
  qemu-img info $MNT/demo
  qemu-io -f raw -t none --native-aio -c "write -P 0xab 0 1M" -c "read -P 0xab 0 1M" $MNT/demo
  qemu-img create -f raw $MNT/disk2 10G && $BIN/dog vdi list
  fio --name=t --filename=$MNT/demo --rw=randread --bs=4k --iodepth=16 --ioengine=libaio --direct=1 --runtime=10 --time_based
  qemu-system-x86_64 -m 1G -drive file=$PWD/$MNT/demo,format=raw,if=virtio,cache=none,aio=io_uring,discard=unmap ...
  $BIN/cachectl --cache-dir $RUN/cache stats          # hits, misses, dirty bytes
  $BIN/cachectl --cache-dir $RUN/cache flush          # push dirty data to the cluster
  $BIN/dog vdi lock list                              # who has each VDI attached
  $BIN/dog node list
  $BIN/dog vdi create scratch 1G                      # dog vdi write refuses a VDI a cache holds (demo, once opened)
  echo hello | $BIN/dog vdi write scratch 0
  $BIN/dog vdi read scratch 0 5
  head -c 64M /dev/urandom > /tmp/x && $BIN/dog vdi write scratch < /tmp/x && $BIN/dog vdi read scratch 0 64M | cmp - /tmp/x
  $BIN/dog vdi object demo 0
  kill -9 \$(cat $RUN/node2.pid); $BIN/dog node recovery     # a node dies; data stays
  $BIN/dog --help
Press Ctrl-C here to stop the cluster.
MSG
wait
