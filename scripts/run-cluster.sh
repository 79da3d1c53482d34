#!/usr/bin/env bash
# `make run`: a 3-node cluster on 127.0.0.1:7000-7002 with the local membership driver, state
# under ./run, and sheepfs mounted at ./mnt with a 1G writeback object cache in ./run/cache. Reuses what a previous run left (data, format,
# VDIs); FRESH=1 starts empty. Ctrl-C unmounts and stops every node cleanly.
# `CLUSTER=etcd make run`: the same on the etcd driver: a one-member etcd (/usr/bin/etcd, or
# $ETCD_BIN) with its data in ./run/etcd, its log in ./run/etcd.log, client port 2379 (or a
# free one, kept for later runs in ./run/etcd.ports), and the nodes started with
# --cluster etcd://127.0.0.1:PORT/sheep. A run's data belongs to one driver: switching needs
# FRESH=1. BIN_DIR picks the binaries (default target/release).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN_DIR:-target/release}
RUN=${RUN_DIR:-run}
PORTS=(7000 7001 7002)
MNT=${MNT_DIR:-mnt}
DOG="$BIN/dog --address 127.0.0.1:${PORTS[0]}"
CLUSTER=${CLUSTER:-local}
case "$CLUSTER" in
    local | etcd) ;;
    *) echo "run: CLUSTER=$CLUSTER: expected local or etcd" >&2; exit 1 ;;
esac

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

stop_leftovers() {
    for pidfile in "$RUN"/*.pid; do
        [ -e "$pidfile" ] || continue
        pid=$(cat "$pidfile")
        prog=sheep
        [ "$(basename "$pidfile")" = etcd.pid ] && prog=etcd
        if kill -0 "$pid" 2>/dev/null && grep -q "$prog" "/proc/$pid/cmdline" 2>/dev/null; then
            echo "stopping $prog $pid left by a previous run"
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
chmod 700 "$RUN"

# The cluster key: every connection to a node proves it holds it (sheep, dog and sheepfs read
# SHEEP_KEY_FILE). Made once; kept with the run's data.
if [ ! -e "$RUN/cluster.key" ]; then
    "$BIN/dog" cluster key new "$RUN/cluster.key" >/dev/null
fi
export SHEEP_KEY_FILE="$(realpath "$RUN/cluster.key")"

# The nodes' data directories belong to the cluster of one membership store.
if [ -e "$RUN/driver" ] && [ "$(cat "$RUN/driver")" != "$CLUSTER" ]; then
    echo "run: $RUN holds a cluster on the $(cat "$RUN/driver") driver; FRESH=1 CLUSTER=$CLUSTER make run starts empty" >&2
    exit 1
fi
echo "$CLUSTER" >"$RUN/driver"

for port in "${PORTS[@]}"; do
    if port_in_use "$port"; then
        echo "run: port $port is in use by another program; stop it first (ss -ltnp 'sport = :$port')" >&2
        exit 1
    fi
done

pids=()
etcd_pid=
stop_etcd() {
    [ -n "$etcd_pid" ] || return 0
    kill -TERM "$etcd_pid" 2>/dev/null || true
    wait "$etcd_pid" 2>/dev/null || true
    rm -f "$RUN/etcd.pid"
}
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
    # etcd last: the nodes leave through it.
    stop_etcd
    rm -f "$RUN"/*.pid
    echo "stopped; data stays in $RUN (FRESH=1 make run starts empty)"
}
trap stop INT TERM EXIT

etcd_healthy() {
    timeout 2 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n" >&3
        grep -q "\"health\":\"true\"" <&3' _ "$1" 2>/dev/null
}

# Picks etcd's client and peer ports: those of the last run (its data names its peer URL),
# else 2379 and 2380, else free ones above 23790.
etcd_ports() {
    if [ -s "$RUN/etcd.ports" ]; then
        read -r ETCD_PORT ETCD_PEER_PORT <"$RUN/etcd.ports"
        for p in "$ETCD_PORT" "$ETCD_PEER_PORT"; do
            if port_in_use "$p"; then
                echo "run: port $p (etcd's, from $RUN/etcd.ports) is in use by another program; stop it first (ss -ltnp 'sport = :$p')" >&2
                exit 1
            fi
        done
        return
    fi
    local free=()
    for p in 2379 2380 $(seq 23790 23999); do
        port_in_use "$p" || free+=("$p")
        [ ${#free[@]} -eq 2 ] && break
    done
    [ ${#free[@]} -eq 2 ] || { echo "run: no free port for etcd" >&2; exit 1; }
    ETCD_PORT=${free[0]} ETCD_PEER_PORT=${free[1]}
    echo "$ETCD_PORT $ETCD_PEER_PORT" >"$RUN/etcd.ports"
}

SPEC="local:$RUN/state"
if [ "$CLUSTER" = etcd ]; then
    ETCD=${ETCD_BIN:-/usr/bin/etcd}
    [ -x "$ETCD" ] || { echo "run: $ETCD is missing: install etcd-server (make deps)" >&2; exit 1; }
    etcd_ports
    "$ETCD" --name sheep-run --data-dir "$RUN/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "sheep-run=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new \
        --logger zap --log-outputs stderr >>"$RUN/etcd.log" 2>&1 &
    etcd_pid=$!
    echo "$etcd_pid" >"$RUN/etcd.pid"
    echo -n "waiting for etcd on 127.0.0.1:$ETCD_PORT"
    for _ in $(seq 100); do
        etcd_healthy "$ETCD_PORT" && break
        kill -0 "$etcd_pid" 2>/dev/null || { echo; echo "run: etcd exited; see $RUN/etcd.log" >&2; tail -n 5 "$RUN/etcd.log" >&2; exit 1; }
        echo -n .; sleep 0.2
    done
    echo
    etcd_healthy "$ETCD_PORT" || { echo "run: etcd is not healthy; see $RUN/etcd.log" >&2; exit 1; }
    SPEC="etcd://127.0.0.1:$ETCD_PORT/sheep"
fi

for i in "${!PORTS[@]}"; do
    "$BIN/sheep" --dir "$RUN/node$i" --listen "127.0.0.1:${PORTS[$i]}" \
        --cluster "$SPEC" >>"$RUN/node$i.log" 2>&1 &
    pids+=($!)
    echo $! >"$RUN/node$i.pid"
done

echo -n "waiting for 3 nodes"
for _ in $(seq 100); do
    if $DOG cluster info --json 2>/dev/null | grep -q '"nodes": 3'; then break; fi
    for pid in "${pids[@]}"; do
        kill -0 "$pid" 2>/dev/null || { echo; echo "run: a sheep exited; see $RUN/node*.log" >&2; tail -n 5 "$RUN"/node*.log >&2; exit 1; }
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
is_mounted || { echo "run: sheepfs did not mount; see $RUN/sheepfs.log" >&2; tail -n 5 "$RUN/sheepfs.log" >&2; exit 1; }

ETCD_NOTE=
if [ "$CLUSTER" = etcd ]; then
    ETCD_NOTE="
etcd (pid $etcd_pid, data in $RUN/etcd, log in $RUN/etcd.log) serves on 127.0.0.1:$ETCD_PORT."
fi

$DOG cluster info
echo
$DOG vdi list
echo
ls -l "$MNT"
cat <<MSG

The cluster is up: 3 sheep on 127.0.0.1:7000-7002 (logs in $RUN/node*.log) with --cluster
$SPEC, and sheepfs shows every VDI as a file in $MNT (log in $RUN/sheepfs.log), through a 1G
writeback cache in $RUN/cache.$ETCD_NOTE
Every connection proves it holds the cluster key $SHEEP_KEY_FILE; in another terminal,
first: export SHEEP_KEY_FILE=$SHEEP_KEY_FILE (dog and sheepfs read it; or --key-file). Try:
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
Press Ctrl-C here to stop the cluster: sheepfs, then the nodes, then etcd (CLUSTER=etcd).
If this terminal is gone: kill \$(cat $RUN/sheepfs.pid) \$(cat $RUN/node*.pid) and then
kill \$(cat $RUN/etcd.pid) (with CLUSTER=etcd); the next make run stops what is left too.
MSG
wait
