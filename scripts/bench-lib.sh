# Shared by the benchmark scripts: a local cluster, sheepfs mounts, fio as JSON, cleanup.
# Source it after setting BIN; it sets WORK (a scratch dir under target/) and OUT.
# shellcheck shell=bash
WORK=$(mktemp -d "$PWD/target/bench-XXXXXX")
OUT=$PWD/target/bench
mkdir -p "$OUT"
pids=()
mounts=()

bench_cleanup() {
    for m in "${mounts[@]}"; do
        grep -q " $m " /proc/self/mountinfo && { umount "$m" 2>/dev/null || umount -l "$m"; }
    done
    # Newest first: each sheepfs pushes what it holds while the nodes are still up.
    local i
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        kill -TERM "${pids[$i]}" 2>/dev/null || true
        wait "${pids[$i]}" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap bench_cleanup EXIT INT TERM

# start_cluster FIRST_PORT N COPIES: N sheep on loopback, formatted; sets DOG.
start_cluster() {
    local port=$1 n=$2 copies=$3 i
    for ((i = 0; i < n; i++)); do
        "$BIN/sheep" --dir "$WORK/node$i" --listen "127.0.0.1:$((port + i))" \
            --cluster "local:$WORK/state" --log warn >>"$WORK/node$i.log" 2>&1 &
        pids+=($!)
    done
    DOG="$BIN/dog --address 127.0.0.1:$port"
    for _ in $(seq 100); do
        $DOG cluster info --json 2>/dev/null | grep -q "\"nodes\": $n" && break
        sleep 0.1
    done
    $DOG cluster format --copies "$copies" >/dev/null
}

# mount_sheepfs DIR PORT [sheepfs options...]: mounts and waits; sets MOUNT_PID.
mount_sheepfs() {
    local dir=$1 port=$2
    shift 2
    mkdir -p "$dir"
    "$BIN/sheepfs" --cluster "127.0.0.1:$port" "$dir" --foreground \
        --log-file "$dir.log" "$@" >/dev/null &
    MOUNT_PID=$!
    pids+=("$MOUNT_PID")
    mounts+=("$dir")
    for _ in $(seq 100); do grep -q " $dir " /proc/self/mountinfo && break; sleep 0.1; done
}

# fio_json NAME FILE SIZE RW BS DEPTH [extra...]: one fio job, JSON on stdout.
fio_json() {
    local name=$1 file=$2 size=$3 rw=$4 bs=$5 qd=$6
    shift 6
    fio --name="$name" --filename="$file" --size="$size" --rw="$rw" --bs="$bs" \
        --iodepth="$qd" --ioengine=libaio --direct=1 --group_reporting \
        --output-format=json "$@"
}
