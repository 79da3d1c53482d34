//! Copy-on-write against plain writes, 4 KiB at queue depth 16, on a local cluster of real
//! `sheep` processes (issue 26's goal: the first write to a shared object at least 0.5× a write
//! to an unshared one).
//!
//! ```text
//! cargo run --release -p objstore-node --example cow_bench -- [N] [NODES] [COPIES]
//! ```
//!
//! Writes N whole 4 MiB source objects, then times, each at 16 in flight:
//! - `cow`: N `cow_write_obj` of 4 KiB into N distinct new targets (one per source);
//! - `write existing`: N `write_obj` of 4 KiB into N distinct existing objects;
//! - `write new`: N `write_obj` of 4 KiB into N distinct new objects;
//! - `write new whole`: N `write_obj` of a whole object into N distinct new objects (what a
//!   COW stores on every owner: its floor when the copy itself costs nothing).
//!
//! Defaults: N = 128, 3 nodes, 3 copies. `COW_BENCH_BIN_DIR` runs the `sheep` and `dog` in
//! that directory (another build, side by side) instead of building them. A measurement, not
//! a test: it asserts nothing but that every operation succeeded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use objstore_client::Client;
use objstore_proto::{ObjIndex, ObjectId, Vid};
use testkit::cluster::{Bins, Cluster};

const DEPTH: usize = 16;
const KIB4: usize = 4096;

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .map(|a| a.parse().expect("a number"))
        .unwrap_or(default)
}

/// Runs `op(i)` for i in 0..n, `DEPTH` at a time; the time it took.
async fn timed<F, Fut>(n: u32, op: F) -> Duration
where
    F: Fn(u32) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(op)
        .buffer_unordered(DEPTH)
        .collect::<Vec<()>>()
        .await;
    t.elapsed()
}

fn report(what: &str, n: u32, took: Duration) -> f64 {
    let iops = n as f64 / took.as_secs_f64();
    println!(
        "{what:>16}: {n} x 4 KiB at qd{DEPTH} in {:.3} s: {iops:.0} IOPS, {:.2} ms each on average",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 * DEPTH as f64 / n as f64
    );
    iops
}

fn main() {
    let n = arg(1, 128) as u32;
    let nodes = arg(2, 3);
    let copies = arg(3, 3);
    let bins = match std::env::var_os("COW_BENCH_BIN_DIR") {
        Some(d) => Bins::in_dir(std::path::Path::new(&d)).expect("binaries in COW_BENCH_BIN_DIR"),
        None => Bins::fresh(),
    };
    let c = Cluster::start(&bins, nodes);
    c.dog_ok(&["cluster", "format", "--copies", &copies.to_string()]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let addrs: Vec<SocketAddr> = (0..nodes).map(|i| c.addr(i).parse().unwrap()).collect();
        let cl = Arc::new(
            Client::connect(&addrs, testkit::auth::client_options())
                .await
                .unwrap(),
        );
        let size = cl.view().config().unwrap().object_size as usize;
        let src = |i: u32| ObjectId::data(Vid(0x61), ObjIndex(i));
        let dst = |i: u32| ObjectId::data(Vid(0x62), ObjIndex(i));
        let fresh = |i: u32| ObjectId::data(Vid(0x63), ObjIndex(i));
        let fresh_whole = |i: u32| ObjectId::data(Vid(0x64), ObjIndex(i));
        let whole = Bytes::from(vec![0x5a; size]);
        let block = Bytes::from(vec![0xa5; KIB4]);
        let offset = |i: u32| ((i as usize * 37) % (size / KIB4) * KIB4) as u64;
        let t = timed(n, |i| {
            let (cl, whole) = (cl.clone(), whole.clone());
            async move { cl.write_obj(src(i), 0, whole).await.unwrap() }
        })
        .await;
        println!(
            "{n} sources of {} MiB written in {:.1} s ({nodes} nodes, {copies} copies)",
            size >> 20,
            t.as_secs_f64()
        );
        cl.flush().await.unwrap();

        let cow = timed(n, |i| {
            let (cl, block) = (cl.clone(), block.clone());
            async move {
                cl.cow_write_obj(dst(i), src(i), offset(i), block)
                    .await
                    .unwrap()
            }
        })
        .await;
        cl.flush().await.unwrap();
        let existing = timed(n, |i| {
            let (cl, block) = (cl.clone(), block.clone());
            async move { cl.write_obj(src(i), offset(i), block).await.unwrap() }
        })
        .await;
        cl.flush().await.unwrap();
        let new = timed(n, |i| {
            let (cl, block) = (cl.clone(), block.clone());
            async move { cl.write_obj(fresh(i), offset(i), block).await.unwrap() }
        })
        .await;
        cl.flush().await.unwrap();
        let new_whole = timed(n, |i| {
            let (cl, whole) = (cl.clone(), whole.clone());
            async move { cl.write_obj(fresh_whole(i), 0, whole).await.unwrap() }
        })
        .await;
        cl.flush().await.unwrap();
        let cow = report("cow", n, cow);
        let existing = report("write existing", n, existing);
        let new = report("write new", n, new);
        report("write new whole", n, new_whole);
        println!(
            "cow / write existing = {:.2}, cow / write new = {:.2}",
            cow / existing,
            cow / new
        );
    });
}
