//! The `scale` figures (issue 43): what recovery costs as the cluster grows, in process, on
//! metadata-only stores (versions, no bytes), so that hundreds of nodes and millions of
//! objects fit on one machine.
//!
//! - **Against nodes** (`join-N` and `kill-N`; `objstore_sim::scale`, simulated time): N
//!   nodes holding `scale_per_node` entries each (3 copies), one node joins, then one dies.
//!   Entries fetched to plan per object owned (the joiner's, and every node's), the joiner's
//!   requests and the simulated time to recover (planning costs no simulated time: its cost
//!   is in the next figures).
//! - **Against objects per node** (`restart-M`; `objstore_node::testing::scale`, real threads
//!   and clock): 2 nodes of M objects each (2 copies); one is stopped, 100 objects change, it
//!   comes back. Its plan (ms), its recovery (s), entries fetched per object owned, and the
//!   bytes per object of the index (the metadata-only store's; the file store's is
//!   `index/file-store`).
//! - **A read while peers list** (`read-4k-p99`): one node of `scale_listed` objects, 4 KiB
//!   reads one after another for a few seconds, alone and while 10 peers list the node
//!   whole over and over: the 99th percentile of the reads, in µs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use bytes::Bytes;
use serde_json::Value;

use objstore_client::conn::Conn;
use objstore_node::store::{FileStore, ObjectBackend, Version};
use objstore_node::testing::scale::{object, EpochCost, Harness, Shape};
use objstore_proto::frame::{Header, Opcode};
use objstore_proto::version::ListRequest;
use objstore_sim::scale::SimScale;

use super::plan::template;
use super::record::Recorder;
use super::settings::Settings;
use crate::figures::Figure;

/// Peers listing the node in the read figure.
const LISTERS: usize = 10;
/// How long each half of the read figure reads.
const READ_WINDOW: Duration = Duration::from_secs(3);

/// Figures this group records, for the progress count.
pub fn figures(s: &Settings) -> usize {
    s.matrix.scale_nodes.len() * 8 + s.matrix.scale_objects.len() * 4 + 1 + 2
}

fn fig(job: &str, target: &str, unit: &str, params: Vec<(&str, Value)>) -> Figure {
    let mut f = template("scale", job, target, unit, params);
    f.higher_is_better = false;
    f
}

fn put(rec: &mut Recorder, f: &Figure, value: f64) -> Result<()> {
    rec.announce(f, "")?;
    rec.record(f, value)
}

pub fn run(s: &Settings, rec: &mut Recorder) -> Result<()> {
    for &nodes in &s.matrix.scale_nodes {
        by_nodes(rec, nodes, s.matrix.scale_per_node)?;
    }
    for &objects in &s.matrix.scale_objects {
        by_objects(rec, objects)?;
    }
    file_index(rec, s.matrix.scale_file_objects)?;
    read_while_listed(rec, s.matrix.scale_listed)
}

/// `join-N`, `kill-N`.
fn by_nodes(rec: &mut Recorder, nodes: usize, per_node: u64) -> Result<()> {
    let copies = 3;
    let objects = nodes as u64 * per_node / u64::from(copies);
    eprintln!("bench: scale: {nodes} nodes of {per_node} entries each (simulated time)");
    let shape = Shape {
        nodes,
        objects,
        copies,
    };
    let mut sim = SimScale::start(shape, 43).map_err(|e| anyhow!("{nodes} nodes: {e}"))?;
    let params = || {
        vec![
            ("nodes", Value::from(nodes)),
            ("objects_per_node", Value::from(per_node)),
            ("copies", Value::from(copies)),
        ]
    };
    let join = sim.join().map_err(|e| anyhow!("join of {nodes}: {e}"))?;
    let j = join.plans.len() - 1;
    let job = format!("join-{nodes}");
    let per = |c: &EpochCost, i: usize| c.plans[i].plan_entries as f64 / c.owned[i].max(1) as f64;
    let unit = "entries/object";
    put(rec, &fig(&job, "joiner", unit, params()), per(&join, j))?;
    put(
        rec,
        &fig(&job, "all", unit, params()),
        join.entries_per_owned(),
    )?;
    // Bytes, digests included, against the 17 an object of a listing entry each.
    let p = &join.plans[j];
    let bytes = (17 * p.plan_entries + 24 * p.plan_digests) as f64 / join.owned[j].max(1) as f64;
    put(rec, &fig(&job, "joiner-bytes", "B/object", params()), bytes)?;
    let owned = join.owned.iter().sum::<u64>().max(1) as f64;
    let all_bytes = join.bytes() as f64 / owned;
    put(
        rec,
        &fig(&job, "all-bytes", "B/object", params()),
        all_bytes,
    )?;
    let requests = join.plans[j].plan_requests as f64;
    put(rec, &fig(&job, "requests", "requests", params()), requests)?;
    let recovered = join.recovered_in.as_secs_f64();
    put(rec, &fig(&job, "recovered", "s", params()), recovered)?;
    let kill = sim.kill(1).map_err(|e| anyhow!("kill in {nodes}: {e}"))?;
    let job = format!("kill-{nodes}");
    put(
        rec,
        &fig(&job, "all", unit, params()),
        kill.entries_per_owned(),
    )?;
    let recovered = kill.recovered_in.as_secs_f64();
    put(rec, &fig(&job, "recovered", "s", params()), recovered)
}

/// `restart-M`.
fn by_objects(rec: &mut Recorder, objects: u64) -> Result<()> {
    eprintln!("bench: scale: 2 nodes of {objects} objects each, one restarted");
    let mut h = Harness::start(Shape {
        nodes: 2,
        objects,
        copies: 2,
    });
    let index = h.store(1).index_bytes().unwrap_or(0) as f64 / objects as f64;
    h.cluster.kill(1);
    h.cluster.wait_members(1);
    let client = h.cluster.client_on(&h.rt, Duration::from_secs(30));
    h.rt.block_on(async {
        for k in 0..100 {
            let oid = object(k * (objects / 100).max(1) % objects);
            (client
                .write_obj(oid, 0, Bytes::from_static(&[7; 512]))
                .await)
                .with_context(|| format!("writing {oid} while node 1 is down"))?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    let cost = h.restart(1);
    let params = || {
        vec![
            ("nodes", Value::from(2)),
            ("objects_per_node", Value::from(objects)),
        ]
    };
    let job = format!("restart-{objects}");
    let plan = &cost.plans[1];
    put(rec, &fig(&job, "plan", "ms", params()), plan.plan_ms as f64)?;
    let recovered = cost.recovered_in.as_secs_f64();
    put(rec, &fig(&job, "recovered", "s", params()), recovered)?;
    let per = plan.plan_entries as f64 / cost.owned[1].max(1) as f64;
    put(rec, &fig(&job, "entries", "entries/object", params()), per)?;
    put(rec, &fig(&job, "index", "B/object", params()), index)
}

/// `index/file-store`: the file store's index, per object, holding `objects` (empty) objects.
fn file_index(rec: &mut Recorder, objects: u64) -> Result<()> {
    eprintln!("bench: scale: the file store's index of {objects} objects");
    let dir = tempfile::tempdir().context("a directory for the file store")?;
    let store = FileStore::open(dir.path()).context("opening a file store")?;
    for i in 0..objects {
        let oid = object(i);
        (store.write(oid, 0, &[], None, Version(1 << 32 | 1)))
            .with_context(|| format!("writing {oid} to the file store"))?;
    }
    let bytes = store.index_bytes().unwrap_or(0) as f64 / objects.max(1) as f64;
    let params = vec![("objects", Value::from(objects))];
    put(rec, &fig("index", "file-store", "B/object", params), bytes)
}

/// `read-4k-p99/idle` and `read-4k-p99/10-listing`.
fn read_while_listed(rec: &mut Recorder, objects: u64) -> Result<()> {
    eprintln!("bench: scale: 4 KiB reads of a node of {objects} objects, alone and while {LISTERS} peers list it");
    let h = Harness::start(Shape {
        nodes: 1,
        objects,
        copies: 1,
    });
    let node = h.cluster.node(0).expect("node 0 is up").clone();
    let (addr, epoch) = (h.cluster.addr(0), node.epoch().view.epoch);
    let req = ListRequest {
        owner: node.me().id,
        copies: 1,
        part: 0,
        parts: 1,
        extra: Vec::new(),
    }
    .encode();
    let client = h.cluster.client_on(&h.rt, Duration::from_secs(30));
    let reads = |client: Arc<objstore_client::Client>| async move {
        let mut lat = Vec::new();
        let started = Instant::now();
        let mut k = 0u64;
        while started.elapsed() < READ_WINDOW {
            let oid = object(k.wrapping_mul(7919) % objects);
            let t = Instant::now();
            client.read_obj(oid, 0, 4096).await?;
            lat.push(t.elapsed());
            k += 1;
        }
        Ok::<_, anyhow::Error>(lat)
    };
    let idle = h.rt.block_on(reads(client.clone()))?;
    let stop = Arc::new(AtomicBool::new(false));
    let listed = Arc::new(AtomicU64::new(0));
    // The peers run elsewhere in a real cluster: here, on threads of the lowest priority, so
    // that their side of the listings (reading and decoding them) does not take the CPU from
    // the node and the reading client.
    let peers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .on_thread_start(|| {
            // SAFETY: setpriority takes no pointer.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
        })
        .enable_all()
        .build()
        .context("the peers' runtime")?;
    let listing = h.rt.block_on(async {
        let mut listers = Vec::new();
        for _ in 0..LISTERS {
            let net = h.cluster.net.clone();
            let conn = (peers
                .spawn(async move { Conn::connect_via(&net, addr, Duration::from_secs(5)).await }))
            .await??;
            let (stop, listed, req) = (stop.clone(), listed.clone(), req.clone());
            listers.push(peers.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let h = Header::request(Opcode::PeerList, 0, epoch);
                    if conn
                        .call(h, req.clone(), Duration::from_secs(60))
                        .await
                        .is_ok()
                    {
                        listed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        let lat = reads(client.clone()).await;
        stop.store(true, Ordering::Relaxed);
        for l in listers {
            let _ = l.await;
        }
        lat
    })?;
    let p99 = |mut v: Vec<Duration>| {
        v.sort();
        v[(v.len() * 99 / 100).min(v.len() - 1)].as_secs_f64() * 1e6
    };
    let params = || vec![("objects", Value::from(objects))];
    let idle_fig = fig("read-4k-p99", "idle", "µs", params());
    put(rec, &idle_fig, p99(idle))?;
    let mut f = fig("read-4k-p99", &format!("{LISTERS}-listing"), "µs", params());
    f.reference = Some(idle_fig.id.clone());
    f.params.insert(
        "listings".into(),
        Value::from(listed.load(Ordering::Relaxed)),
    );
    put(rec, &f, p99(listing))
}
