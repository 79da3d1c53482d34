//! One seed, start to finish: set up (the cluster, the VDI clients' VDIs), run clients and
//! nemesis, stop the faults, let recovery finish, flush each VDI client (as an unmount would),
//! then check every read of the history, read every block once more (a VDI's through its
//! client's handle and through a fresh handle of a fresh client), and compare the owners'
//! copies of every object (a VDI's inode too).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use objstore_client::transport::MemNetwork;
use objstore_client::vdi::{self, Vdi};
use objstore_client::{Client, ClientOptions};
use objstore_proto::keys;
use objstore_proto::oid::{ObjIndex, ObjectId};
use objstore_proto::redundancy::Redundancy;

use crate::checker::{Kind, Model, Violation};
use crate::cluster::SimCluster;
use crate::history::{decode_block, History, Op, OpKind, Outcome, BLOCK};
use crate::nemesis::{self, BASE_DELAY};
use crate::workload::{self, vdi as vdis, Shared, OBJECT_SIZE};
use crate::{Config, SimError};

/// The whole run, in simulated time; past it the run counts as stuck.
const RUN_LIMIT: Duration = Duration::from_secs(3600);

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stats {
    pub ops: usize,
    /// Operations that returned an error to the client (allowed while faults are active).
    pub failed: usize,
    pub blocks_checked: usize,
    pub crashes: usize,
    pub faults: usize,
    /// Simulated time of the whole run.
    pub sim_time: Duration,
}

/// What one seed did and found.
#[derive(Debug, Clone)]
pub struct Report {
    pub seed: u64,
    pub trace_hash: u64,
    pub violations: Vec<Violation>,
    pub stats: Stats,
    pub history: History,
}

impl Report {
    /// The kinds of violation found, each once, sorted.
    pub fn kinds(&self) -> Vec<Kind> {
        let mut k: Vec<Kind> = self.violations.iter().map(|v| v.kind).collect();
        k.sort();
        k.dedup();
        k
    }
}

fn client_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 1, i as u8 + 1], 4000))
}

fn options(cfg: &Config) -> ClientOptions {
    ClientOptions {
        timeout: cfg.op_timeout,
        request_timeout: cfg.request_timeout,
        key: None,
    }
}

thread_local! {
    /// When the seed running on this thread started (its paused clock).
    static STARTED: std::cell::Cell<Option<tokio::time::Instant>> = const { std::cell::Cell::new(None) };
}

/// Simulated time since the seed running on this thread started: for log lines (`SIM_LOG`).
pub fn elapsed() -> Option<Duration> {
    STARTED.with(|s| s.get()).map(|t| t.elapsed())
}

/// Runs seed `seed` with `cfg` (see the crate documentation).
pub fn run(seed: u64, cfg: &Config) -> Result<Report, SimError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(SimError::Runtime)?;
    let report = rt.block_on(async {
        let start = tokio::time::Instant::now();
        STARTED.with(|s| s.set(Some(start)));
        let mut r = match tokio::time::timeout(RUN_LIMIT, run_seed(seed, cfg)).await {
            Ok(r) => r?,
            Err(_) => Report {
                seed,
                trace_hash: 0,
                violations: vec![Violation {
                    kind: Kind::NotSettled,
                    at: RUN_LIMIT.as_micros() as u64,
                    detail: format!("the run did not end within {RUN_LIMIT:?} of simulated time"),
                }],
                stats: Stats::default(),
                history: History::default(),
            },
        };
        r.stats.sim_time = start.elapsed();
        Ok::<Report, SimError>(r)
    });
    // Dropping the runtime ends every task still alive (connections, old requests).
    drop(rt);
    report
}

async fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

async fn run_seed(seed: u64, cfg: &Config) -> Result<Report, SimError> {
    let mut master = StdRng::seed_from_u64(seed);
    let ids: Vec<u64> = (0..cfg.nodes).map(|_| master.gen::<u64>() >> 1).collect();
    let net = MemNetwork::seeded(master.gen());
    net.set_delay(Some(BASE_DELAY));
    let mut cluster = SimCluster::new(net.clone(), &ids);
    for i in 0..cfg.nodes {
        cluster.start(i, master.gen(), cfg.vnodes).await?;
    }
    let formed = wait_for(Duration::from_secs(30), || {
        let v = cluster.membership.latest();
        v.nodes.len() == cfg.nodes
            && cluster
                .nodes
                .iter()
                .all(|n| n.node().is_some_and(|x| x.epoch().view.epoch == v.epoch))
    })
    .await;
    if !formed {
        return Err(SimError::NoCluster(Duration::from_secs(30)));
    }
    let admin_addr = SocketAddr::from(([10, 0, 2, 1], 4000));
    let admin = Client::connect_via(
        Arc::new(net.endpoint(admin_addr)),
        &cluster.addrs(),
        options(cfg),
    )
    .await?;
    admin
        .format(cfg.copies, cfg.min_copies, OBJECT_SIZE as u64)
        .await?;
    if !wait_for(Duration::from_secs(30), || cluster.settled()).await {
        return Err(SimError::NoCluster(Duration::from_secs(30)));
    }
    if cfg.vdi_clients > 0 {
        assert!(
            (2..=vdis::MAX_OBJECTS).contains(&cfg.vdi_objects),
            "vdi_objects must be 2 to {}",
            vdis::MAX_OBJECTS
        );
        // The VDI clients' VDIs, before any fault, with ids clear of the object clients'.
        admin
            .kv_cas(keys::NEXT_VID, None, Some(&vdis::FIRST_VID.to_string()))
            .await?;
        for c in 0..cfg.vdi_clients {
            let ec = cfg.ec.filter(|_| cfg.ec_vdis);
            let info = vdi::create_with(&admin, &vdis::name(c), vdis::size(cfg), ec).await?;
            assert_eq!(info.vid, vdis::vid(c), "VDI client {c}'s VDI id");
        }
    }

    let shared = Arc::new(Shared::new());
    // The object clients', then the VDI clients' (the nemesis cuts their links too).
    let client_addrs: Vec<SocketAddr> = (0..cfg.clients + cfg.vdi_clients)
        .map(client_addr)
        .collect();
    let mut handles = Vec::new();
    for (c, &addr) in client_addrs[..cfg.clients].iter().enumerate() {
        let client = Arc::new(
            Client::connect_via(Arc::new(net.endpoint(addr)), &cluster.addrs(), options(cfg))
                .await?,
        );
        let rng = StdRng::seed_from_u64(master.gen());
        handles.push(tokio::spawn(workload::run_client(
            c,
            client,
            rng,
            *cfg,
            shared.clone(),
        )));
    }
    let nemesis_rng = StdRng::seed_from_u64(master.gen());
    // Each VDI client's client and handle, kept for the final flush and reads.
    let mut vdi_handles = Vec::new();
    for c in 0..cfg.vdi_clients {
        let addr = client_addrs[vdis::history_client(cfg, c)];
        let client = Arc::new(
            Client::connect_via(Arc::new(net.endpoint(addr)), &cluster.addrs(), options(cfg))
                .await?,
        );
        let v = Arc::new(Vdi::open(client.clone(), &vdis::name(c)).await?);
        let rng = StdRng::seed_from_u64(master.gen());
        handles.push(tokio::spawn(vdis::run_client(
            c,
            client.clone(),
            v.clone(),
            rng,
            *cfg,
            shared.clone(),
        )));
        vdi_handles.push(v);
    }
    nemesis::run(
        &mut cluster,
        &handles,
        &client_addrs,
        nemesis_rng,
        cfg,
        &shared,
    )
    .await?;
    for h in handles {
        // A client task that panicked is a bug of the simulator: let the test fail loudly.
        if let Err(e) = h.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }

    // Faults stop: every link up, base latency, no disk faults, every node up.
    shared.event("quiesce".into());
    net.heal();
    net.set_delay(Some(BASE_DELAY));
    for i in 0..cfg.nodes {
        cluster.nodes[i].store.clear_faults();
        if !cluster.nodes[i].is_up() {
            cluster.start(i, master.gen(), cfg.vnodes).await?;
        }
    }
    let mut violations = Vec::new();
    let settled = wait_for(cfg.settle, || cluster.settled()).await;
    if !settled {
        let states: Vec<String> = cluster
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| match n.node() {
                Some(x) => {
                    let s = x.recovery_status();
                    format!(
                        "node {i}: epoch {} recovery {:?} of epoch {} ({} pending, {} failed)",
                        x.epoch().view.epoch,
                        s.state,
                        s.epoch,
                        s.total.saturating_sub(s.done),
                        s.failed
                    )
                }
                None => format!("node {i}: down"),
            })
            .collect();
        violations.push(Violation {
            kind: Kind::NotSettled,
            at: shared.now(),
            detail: format!(
                "recovery not finished {:?} after the faults stopped: {}",
                cfg.settle,
                states.join("; ")
            ),
        });
    }

    // Background repairs run on timers (retries with backoff up to 5 s): give them time.
    tokio::time::sleep(cfg.grace).await;

    // Each VDI client's client is flushed, as closing the device or unmounting would: the
    // map entries it still holds (a background write of them failed) go to the inode.
    for (c, v) in vdi_handles.iter().enumerate() {
        let invoke = shared.now();
        let r = v.flush().await;
        let end = shared.now();
        shared.history.lock().unwrap().ops.push(Op {
            client: vdis::history_client(cfg, c),
            kind: OpKind::Flush,
            invoke,
            end,
            outcome: match &r {
                Ok(()) => Outcome::Ok,
                Err(e) => Outcome::Failed(e.to_string()),
            },
        });
        if let Err(e) = r {
            violations.push(Violation {
                kind: Kind::FinalReadFailed,
                at: end,
                detail: format!("VDI client {c}: the final flush failed: {e}"),
            });
        }
    }

    // Every block once more, through a fresh client.
    let reader = Arc::new(
        Client::connect_via(
            Arc::new(net.endpoint(SocketAddr::from(([10, 0, 2, 2], 4000)))),
            &cluster.addrs(),
            options(cfg),
        )
        .await?,
    );
    // (object, first block, values, invoked, returned)
    let mut finals = Vec::new();
    for obj in workload::all_objects(cfg.objects) {
        let t0 = shared.now();
        let r = workload::read_blocks(&reader, cfg.ec, obj, 0, cfg.blocks).await;
        let t1 = shared.now();
        match r {
            Ok(values) => {
                shared.event(format!("final read of object {obj}: {values:?}"));
                finals.push((obj, 0, values, t0, t1));
            }
            Err(e) => violations.push(Violation {
                kind: Kind::FinalReadFailed,
                at: t1,
                detail: format!("object {obj}: {e}"),
            }),
        }
    }
    // Every VDI block through the VDI client's handle, then through a fresh handle of the
    // fresh client.
    for (c, v) in vdi_handles.iter().enumerate() {
        let fresh = match Vdi::open(reader.clone(), &vdis::name(c)).await {
            Ok(f) => Some(f),
            Err(e) => {
                violations.push(Violation {
                    kind: Kind::FinalReadFailed,
                    at: shared.now(),
                    detail: format!("VDI client {c}: opening its VDI afresh: {e}"),
                });
                None
            }
        };
        for (which, h) in [
            ("its handle", Some(&**v)),
            ("a fresh handle", fresh.as_ref()),
        ] {
            let Some(h) = h else { continue };
            for w in vdis::windows(cfg) {
                let t0 = shared.now();
                let r = vdis::read_blocks(h, w.start, w.len()).await;
                let t1 = shared.now();
                match r {
                    Ok(values) => {
                        let what = format!("VDI client {c}'s blocks {w:?} through {which}");
                        shared.event(format!("final read of {what}: {values:?}"));
                        for (obj, first, values) in vdis::split(c, w.start, &values) {
                            finals.push((obj, first, values, t0, t1));
                        }
                    }
                    Err(e) => violations.push(Violation {
                        kind: Kind::FinalReadFailed,
                        at: t1,
                        detail: format!("VDI client {c}'s blocks {w:?} through {which}: {e}"),
                    }),
                }
            }
        }
    }

    // The owners' copies, byte for byte: every object, every VDI's data objects and inode.
    if settled {
        let mut objects: Vec<(String, ObjectId)> = workload::all_objects(cfg.objects)
            .into_iter()
            .map(|obj| (format!("object {obj}"), workload::oid(obj)))
            .collect();
        for c in 0..cfg.vdi_clients {
            for index in 0..cfg.vdi_objects {
                let oid = ObjectId::data(vdis::vid(c), ObjIndex(index as u32));
                objects.push((format!("VDI client {c}'s object {index} ({oid})"), oid));
            }
            let inode = ObjectId::inode(vdis::vid(c));
            objects.push((format!("VDI client {c}'s inode ({inode})"), inode));
        }
        // The stripes: the object clients' erasure-coded objects, and with `ec_vdis` every
        // VDI's data objects.
        let mut stripes: Vec<(String, ObjectId, Redundancy)> = Vec::new();
        for obj in workload::all_objects(cfg.objects) {
            if let Some(scheme) = workload::ec_of(cfg.ec, obj) {
                stripes.push((format!("object {obj}"), workload::oid(obj), scheme));
            }
        }
        for c in (0..cfg.vdi_clients).filter(|_| cfg.ec.is_some() && cfg.ec_vdis) {
            for index in 0..cfg.vdi_objects {
                let oid = ObjectId::data(vdis::vid(c), ObjIndex(index as u32));
                let what = format!("VDI client {c}'s object {index} ({oid})");
                stripes.extend(cfg.ec.map(|scheme| (what, oid, scheme)));
            }
        }
        for (what, oid, scheme) in stripes {
            if let Some(d) = cluster.stripe_divergence(oid, scheme, OBJECT_SIZE as u64) {
                violations.push(Violation {
                    kind: Kind::Divergent,
                    at: shared.now(),
                    detail: format!("{what}: {d}"),
                });
            }
        }
        for (what, oid) in objects {
            let copies = cluster.owner_copies(oid, cfg.copies as usize, OBJECT_SIZE as u64);
            if let Some(d) = divergence(&what, &copies) {
                violations.push(Violation {
                    kind: Kind::Divergent,
                    at: shared.now(),
                    detail: d,
                });
            }
        }
    }

    let history = shared.history.lock().unwrap().clone();
    let model = Model::with_registers(&history, workload::registers(cfg));
    let mut checked = 0;
    for op in &history.ops {
        if let (OpKind::Read { values, .. }, Outcome::Ok) = (&op.kind, &op.outcome) {
            checked += values.len();
        }
    }
    let mut found = model.check_reads(&history);
    for (obj, first, values, t0, t1) in &finals {
        for (b, v) in values.iter().enumerate() {
            checked += 1;
            found.extend(model.check(*obj, first + b, *v, *t0, *t1));
        }
    }
    found.extend(violations);
    found.sort_by_key(|v| (v.at, v.kind));
    for i in 0..cfg.nodes {
        cluster.crash(i);
    }
    let stats = Stats {
        ops: history.ops.len(),
        failed: history
            .ops
            .iter()
            .filter(|o| o.outcome != Outcome::Ok)
            .count(),
        blocks_checked: checked,
        crashes: history.crashes.len(),
        faults: history.events.len(),
        sim_time: Duration::ZERO,
    };
    Ok(Report {
        seed,
        trace_hash: history.trace_hash(),
        violations: found,
        stats,
        history,
    })
}

/// Where the owners' copies of `what` differ (a missing copy counts as zeros, and copies come
/// without trailing zeros), if they do.
fn divergence(what: &str, copies: &[(usize, Option<Vec<u8>>)]) -> Option<String> {
    fn bytes(c: &Option<Vec<u8>>) -> &[u8] {
        c.as_deref().unwrap_or(&[])
    }
    let first = bytes(&copies.first()?.1);
    let block = |b: &[u8], k: usize| -> Vec<u8> {
        let mut out = b.get(k * BLOCK..).unwrap_or(&[]).to_vec();
        out.resize(BLOCK, 0);
        out
    };
    let mut differing: BTreeMap<usize, Vec<String>> = BTreeMap::new();
    for (i, c) in copies {
        let b = bytes(c);
        if b == first {
            continue;
        }
        for k in 0..b.len().max(first.len()).div_ceil(BLOCK) {
            let (x, y) = (block(b, k), block(first, k));
            if x != y {
                differing.entry(k).or_default().push(format!(
                    "node {i} {:?} vs node {} {:?}",
                    decode_block(&x),
                    copies[0].0,
                    decode_block(&y)
                ));
            }
        }
    }
    if differing.is_empty() {
        return None;
    }
    let held: Vec<String> = copies
        .iter()
        .map(|(i, c)| format!("node {i}{}", if c.is_some() { "" } else { " (absent)" }))
        .collect();
    let blocks: Vec<String> = differing
        .iter()
        .take(4)
        .map(|(k, d)| format!("block {k}: {}", d.join(", ")))
        .collect();
    Some(format!(
        "{what}, owners {}: {}",
        held.join(", "),
        blocks.join("; ")
    ))
}
