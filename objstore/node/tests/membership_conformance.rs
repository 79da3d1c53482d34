//! One conformance suite for every membership driver: the contract of
//! `objstore_node::membership` (its module doc) checked case by case against the `local`
//! driver and against the `etcd` driver on a real etcd server (testkit's [`Etcd`]).
//!
//! Each case is a function taking a [`Store`]: a factory that opens a new driver on one shared
//! store (local: the same state directory; etcd: the same endpoints and a prefix fresh for the
//! test), so "another node" is another driver object, as it is another process in production.
//! `pair!` makes a `local_*` and an `etcd_*` test of each; the etcd cases that fault the
//! server (restart, watch after reconnect) exist for etcd only. The etcd tests are skipped,
//! loudly, only when `/usr/bin/etcd` is missing (`make test` installs etcd-server first).
//!
//! Waits poll with deadlines taken from the contract (`DEAD_AFTER`, the lease TTL, one tick)
//! plus one second of slack; nothing sleeps to be ready.

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use objstore_node::membership::{
    self, Driver, DriverError, DriverOptions, DEAD_AFTER, DEFAULT_LEASE_TTL, TICK,
};
use objstore_proto::view::{NodeInfo, View};
use testkit::etcd::{skip_without_etcd, Etcd};

/// Opens a new driver on a store.
type Opener = Box<dyn Fn(DriverOptions) -> Result<Box<dyn Driver>, DriverError>>;

/// A shared membership store and a way to open drivers on it.
struct Store {
    name: &'static str,
    open: Opener,
    /// Whether [`Driver::member_until`] must bound membership (a driver whose nodes can be cut
    /// off from the store: etcd).
    bounded: bool,
    /// The etcd server behind an etcd store, for the cases that fault it.
    etcd: Option<Etcd>,
    _dir: Option<tempfile::TempDir>,
}

impl Store {
    /// A new driver on this store with the default options.
    fn driver(&self) -> Arc<dyn Driver> {
        self.driver_with(DriverOptions::default())
    }

    fn driver_with(&self, opts: DriverOptions) -> Arc<dyn Driver> {
        match (self.open)(opts) {
            Ok(d) => Arc::from(d),
            Err(e) => panic!("{}: opening a driver: {}", self.name, chain(&e)),
        }
    }

    fn etcd(&mut self) -> &mut Etcd {
        self.etcd.as_mut().expect("an etcd store")
    }
}

fn local_store() -> Store {
    let dir = tempfile::tempdir().unwrap();
    let spec = format!("local:{}", dir.path().display());
    Store {
        name: "local",
        open: Box::new(move |opts| membership::open(&spec, opts)),
        bounded: false,
        etcd: None,
        _dir: Some(dir),
    }
}

/// A fresh single-member etcd and a prefix of its own; `None` (with a loud message) when
/// etcd is not installed.
fn etcd_store() -> Option<Store> {
    etcd_store_of(1)
}

/// Like [`etcd_store`] on an etcd cluster of `members`, every member given to the drivers.
fn etcd_store_of(members: usize) -> Option<Store> {
    if skip_without_etcd("the etcd driver is") {
        return None;
    }
    // The driver's log goes with a failing test's output (it says which member a call used).
    let _ = tracing_subscriber::fmt()
        .with_env_filter("objstore_node=debug")
        .with_test_writer()
        .try_init();
    let etcd = Etcd::start(members);
    let spec = etcd.cluster_spec(&format!("conformance-{:016x}", rand_u64()));
    Some(Store {
        name: "etcd",
        open: Box::new(move |opts| membership::open(&spec, opts)),
        bounded: true,
        etcd: Some(etcd),
        _dir: None,
    })
}

fn rand_u64() -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    blake3::hash(format!("{}-{:?}", std::process::id(), t).as_bytes()).as_bytes()[..8]
        .iter()
        .fold(0, |a, b| a << 8 | u64::from(*b))
}

macro_rules! pair {
    ($case:ident, $local:ident, $etcd:ident) => {
        #[test]
        fn $local() {
            $case(&mut local_store());
        }
        #[test]
        fn $etcd() {
            if let Some(mut s) = etcd_store() {
                $case(&mut s);
            }
        }
    };
}

macro_rules! etcd_only {
    ($case:ident, $etcd:ident) => {
        #[test]
        fn $etcd() {
            if let Some(mut s) = etcd_store() {
                $case(&mut s);
            }
        }
    };
}

pair!(join, local_join, etcd_join);
pair!(leave, local_leave, etcd_leave);
pair!(crash, local_crash, etcd_crash);
pair!(
    restart_new_incarnation,
    local_restart_new_incarnation,
    etcd_restart_new_incarnation
);
pair!(epoch_order, local_epoch_order, etcd_epoch_order);
pair!(vdi_create_race, local_vdi_create_race, etcd_vdi_create_race);
pair!(kv_basics, local_kv_basics, etcd_kv_basics);
pair!(
    lease_lock_contention,
    local_lease_lock_contention,
    etcd_lease_lock_contention
);
pair!(
    lease_lock_expiry,
    local_lease_lock_expiry,
    etcd_lease_lock_expiry
);
pair!(
    lease_revoke_and_unbind,
    local_lease_revoke_and_unbind,
    etcd_lease_revoke_and_unbind
);
etcd_only!(watch_after_reconnect, etcd_watch_after_reconnect);
etcd_only!(store_restart, etcd_store_restart);

#[test]
fn etcd_member_loss() {
    if let Some(mut s) = etcd_store_of(3) {
        member_loss(&mut s);
    }
}

#[test]
fn etcd_leader_loss() {
    if let Some(mut s) = etcd_store_of(3) {
        leader_loss(&mut s);
    }
}

// ---- helpers ----

fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out.push_str(": ");
        out.push_str(&s.to_string());
        next = s.source();
    }
    out
}

#[track_caller]
fn ok<T>(what: &str, r: Result<T, DriverError>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {}", chain(&e)))
}

fn node(id: u64, incarnation: u64) -> NodeInfo {
    NodeInfo {
        id,
        addr: format!("127.0.0.1:{}", 7000 + id).parse().unwrap(),
        zone: id as u32,
        vnodes: 8,
        incarnation,
    }
}

fn ids(v: &View) -> Vec<u64> {
    v.nodes.iter().map(|n| n.id).collect()
}

/// Ticks `d` every [`TICK`] until its view satisfies `cond`; panics after `within`.
#[track_caller]
fn tick_until(d: &dyn Driver, what: &str, within: Duration, cond: impl Fn(&View) -> bool) -> View {
    let deadline = Instant::now() + within;
    loop {
        let last = match d.tick() {
            Ok(v) if cond(&v) => return v,
            Ok(v) => Ok(v),
            Err(e) => Err(chain(&e)),
        };
        if Instant::now() >= deadline {
            panic!("no view with {what} within {within:?}; last tick: {last:?}");
        }
        std::thread::sleep(TICK);
    }
}

/// Keeps `drivers` ticking every [`TICK`] on a thread (live nodes of a test) until dropped.
struct Ticker {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Ticker {
    fn new(drivers: Vec<Arc<dyn Driver>>) -> Ticker {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                for d in &drivers {
                    let _ = d.tick();
                }
                std::thread::sleep(TICK);
            }
        });
        Ticker {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Ticker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `f` on a thread; panics if it takes longer than `limit` (a call that blocks while
/// the store is down).
#[track_caller]
fn bounded<T: Send + 'static>(
    what: &str,
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(_) => panic!("{what} blocked for more than {limit:?}"),
    }
}

// ---- cases ----

/// A join returns a view containing the node; each join is one new epoch, one above the
/// last; a tick without a change makes none; past views stay readable.
fn join(s: &mut Store) {
    let a = s.driver();
    let b = s.driver();
    let id_a = ok("cluster_id", a.cluster_id());
    assert!(!id_a.is_empty());
    assert_eq!(
        ok("cluster_id", b.cluster_id()),
        id_a,
        "one store, one cluster id"
    );
    let v1 = ok("a joins", a.join(&node(1, 1)));
    assert_eq!(v1.epoch, 1, "the first epoch of a fresh store is 1: {v1:?}");
    assert_eq!(v1.nodes, vec![node(1, 1)]);
    let v2 = ok("b joins", b.join(&node(2, 1)));
    assert_eq!(v2.epoch, v1.epoch + 1, "{v2:?}");
    assert_eq!(v2.nodes, vec![node(1, 1), node(2, 1)], "sorted by id");
    let seen = tick_until(&*a, "b's join", Duration::from_secs(2), |v| {
        v.epoch >= v2.epoch
    });
    assert_eq!(seen, v2, "a sees the same epoch 2");
    std::thread::sleep(TICK);
    assert_eq!(ok("tick", a.tick()), v2, "no change, no new epoch");
    assert_eq!(ok("tick", b.tick()), v2, "no change, no new epoch");
    assert_eq!(ok("view_at 1", a.view_at(1)), Some(v1));
    assert_eq!(ok("view_at 2", b.view_at(2)), Some(v2));
    assert_eq!(ok("view_at 3", a.view_at(3)), None, "no epoch 3 yet");
    let until = a.member_until();
    if s.bounded {
        let u = until.expect("a driver whose nodes can be cut off bounds membership");
        assert!(u > Instant::now(), "just ticked, yet member_until is past");
        assert!(
            u <= Instant::now() + DEFAULT_LEASE_TTL + Duration::from_secs(1),
            "member_until {:?} away, beyond the lease TTL {DEFAULT_LEASE_TTL:?}",
            u - Instant::now()
        );
    } else {
        assert_eq!(until, None, "the local driver has no bound");
    }
}

/// A leave removes the node at once: the next epoch, one above, lacks it.
fn leave(s: &mut Store) {
    let a = s.driver();
    let b = s.driver();
    ok("a joins", a.join(&node(1, 1)));
    let v2 = ok("b joins", b.join(&node(2, 1)));
    ok("b leaves", b.leave());
    // Past b's join: a's view may still be from before it (b absent there too).
    let v3 = tick_until(&*a, "b gone", Duration::from_secs(2), |v| {
        v.epoch > v2.epoch && v.node(2).is_none()
    });
    assert_eq!(v3.epoch, v2.epoch + 1, "one epoch for the leave: {v3:?}");
    assert_eq!(v3.nodes, vec![node(1, 1)]);
    std::thread::sleep(TICK);
    assert_eq!(ok("tick", a.tick()), v3, "no change, no new epoch");
    ok("a leaves", a.leave());
    let c = s.driver();
    let v = ok("c joins", c.join(&node(3, 1)));
    assert_eq!(
        v.epoch,
        v3.epoch + 2,
        "a's leave made one epoch, c's join one: {v:?}"
    );
    assert_eq!(v.nodes, vec![node(3, 1)]);
    assert_eq!(
        ok("view_at", c.view_at(v3.epoch + 1)).map(|v| v.nodes),
        Some(vec![])
    );
}

/// A node that stops ticking without leaving (its driver dropped: an etcd driver must stop
/// its keepalive then) is dropped within DEAD_AFTER (local) or its lease TTL (etcd), plus a
/// tick and a second, in exactly one new epoch.
fn crash(s: &mut Store) {
    let ttl = Duration::from_secs(2);
    let a = s.driver();
    ok("a joins", a.join(&node(1, 1)));
    let c = s.driver_with(DriverOptions { lease_ttl: ttl });
    let v2 = ok("c joins", c.join(&node(3, 1)));
    assert_eq!(ids(&v2), vec![1, 3]);
    tick_until(&*a, "c's join", Duration::from_secs(2), |v| {
        v.epoch == v2.epoch
    });
    drop(c);
    let crashed = Instant::now();
    let limit = if s.bounded { ttl } else { DEAD_AFTER } + TICK + Duration::from_secs(1);
    let v3 = tick_until(&*a, "c dropped", limit + Duration::from_secs(1), |v| {
        v.node(3).is_none()
    });
    let took = crashed.elapsed();
    eprintln!("{}: a crashed node left the view after {took:?}", s.name);
    assert!(
        took <= limit,
        "c dropped {took:?} after it stopped; the contract says {limit:?}"
    );
    assert_eq!(v3.epoch, v2.epoch + 1, "one epoch for the death: {v3:?}");
    assert_eq!(v3.nodes, vec![node(1, 1)]);
}

/// The same id joining with a new incarnation (a restart after a crash, before the old one
/// was noticed dead) is one new epoch holding the new incarnation; the old incarnation's end
/// (its lease expiring) removes nothing.
fn restart_new_incarnation(s: &mut Store) {
    let ttl = Duration::from_secs(2);
    let a = s.driver();
    ok("a joins", a.join(&node(1, 1)));
    let old = s.driver_with(DriverOptions { lease_ttl: ttl });
    let v2 = ok("b joins", old.join(&node(2, 1)));
    drop(old); // crashed: no leave
    let new = s.driver_with(DriverOptions { lease_ttl: ttl });
    let v3 = ok("b joins again", new.join(&node(2, 2)));
    assert_eq!(v3.epoch, v2.epoch + 1, "one epoch for the restart: {v3:?}");
    assert_eq!(v3.nodes, vec![node(1, 1), node(2, 2)]);
    // Well past the old incarnation's death: still the same epoch for everyone.
    let ticker = Ticker::new(vec![a.clone(), new.clone()]);
    std::thread::sleep(ttl.max(DEAD_AFTER) + TICK * 2);
    drop(ticker);
    let v = ok("tick", a.tick());
    assert_eq!(v, v3, "the old incarnation's end changed the view");
    assert_eq!(ok("tick", new.tick()), v3);
}

/// Many nodes joining at once: epochs go up one at a time from 1, every one readable with
/// `view_at`, no epoch number with two different views, consecutive views differ, and every
/// join's view holds the node that joined.
fn epoch_order(s: &mut Store) {
    const N: u64 = 8;
    let drivers: Vec<Arc<dyn Driver>> = (0..N).map(|_| s.driver()).collect();
    let barrier = Arc::new(Barrier::new(N as usize));
    let threads: Vec<_> = drivers
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let d = d.clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let me = node(i as u64 + 1, 1);
                barrier.wait();
                let mut seen = vec![d.join(&me).map_err(|e| chain(&e))?];
                assert!(
                    seen[0].node(me.id) == Some(&me),
                    "join's view lacks me: {:?}",
                    seen[0]
                );
                for _ in 0..4 {
                    std::thread::sleep(TICK / 5);
                    seen.push(d.tick().map_err(|e| chain(&e))?);
                }
                Ok::<_, String>(seen)
            })
        })
        .collect();
    let mut by_epoch: BTreeMap<u32, View> = BTreeMap::new();
    for t in threads {
        for v in t
            .join()
            .expect("a joining thread panicked")
            .expect("join or tick failed")
        {
            if let Some(other) = by_epoch.get(&v.epoch) {
                assert_eq!(other, &v, "two views for epoch {}", v.epoch);
            }
            by_epoch.insert(v.epoch, v);
        }
    }
    let last = tick_until(&*drivers[0], "every node", Duration::from_secs(3), |v| {
        v.nodes.len() == N as usize
    });
    let mut prev = View::default();
    for e in 1..=last.epoch {
        let v = ok("view_at", drivers[(e as usize) % N as usize].view_at(e))
            .unwrap_or_else(|| panic!("view_at({e}) is None; last epoch {}", last.epoch));
        assert_eq!(v.epoch, e);
        if let Some(seen) = by_epoch.get(&e) {
            assert_eq!(
                seen, &v,
                "epoch {e} returned as one view, stored as another"
            );
        }
        assert_ne!(
            v.nodes,
            prev.nodes,
            "epochs {} and {e} hold the same nodes",
            e - 1
        );
        prev = v;
    }
    assert_eq!(prev, last);
    // Joins that overlap may share an epoch (etcd: the node that makes the next epoch puts
    // every node registered by then in it); joins one after another make one epoch each (the
    // `join` case).
}

/// Many nodes creating the same key at once (a VDI create race): exactly one wins, and the
/// value is the winner's.
fn vdi_create_race(s: &mut Store) {
    const N: usize = 12;
    let drivers: Vec<Arc<dyn Driver>> = (0..N).map(|_| s.driver()).collect();
    for round in 0..3 {
        let key = format!("vdi/race{round}");
        let barrier = Arc::new(Barrier::new(N));
        let threads: Vec<_> = drivers
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (d, key, barrier) = (d.clone(), key.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    d.kv_cas(&key, None, Some(format!("creator {i}").as_bytes()))
                        .map_err(|e| chain(&e))
                })
            })
            .collect();
        let wins: Vec<usize> = threads
            .into_iter()
            .enumerate()
            .filter_map(|(i, t)| t.join().unwrap().expect("kv_cas failed").then_some(i))
            .collect();
        assert_eq!(wins.len(), 1, "round {round}: winners {wins:?}");
        let v = ok("kv_get", drivers[0].kv_get(&key));
        assert_eq!(v, Some(format!("creator {}", wins[0]).into_bytes()));
    }
}

/// The key-value store: compare-and-swap, delete, list by prefix, long keys.
fn kv_basics(s: &mut Store) {
    let a = s.driver();
    let b = s.driver();
    assert!(ok("cas", a.kv_cas("vdi/x", None, Some(b"1"))));
    assert!(
        !ok("cas", b.kv_cas("vdi/x", None, Some(b"2"))),
        "exists already"
    );
    assert!(
        !ok("cas", b.kv_cas("vdi/x", Some(b"0"), Some(b"2"))),
        "wrong expected"
    );
    assert!(ok("cas", b.kv_cas("vdi/x", Some(b"1"), Some(b"2"))));
    assert!(ok("cas", a.kv_cas("vdi/y/z", None, Some(b"3"))));
    assert!(ok("cas", a.kv_cas("other", None, Some(b"4"))));
    assert!(ok("cas", a.kv_cas("vdi", None, Some(b"5"))));
    assert_eq!(
        ok("list", b.kv_list("vdi/")),
        vec![
            ("vdi/x".to_string(), b"2".to_vec()),
            ("vdi/y/z".to_string(), b"3".to_vec())
        ]
    );
    assert!(ok("cas", a.kv_cas("vdi/x", Some(b"2"), None)), "delete");
    assert_eq!(ok("get", b.kv_get("vdi/x")), None);
    assert!(
        !ok("cas", a.kv_cas("vdi/x", Some(b"2"), None)),
        "deleted already"
    );
    assert!(
        ok("cas", a.kv_cas("vdi/x", None, None)),
        "absent stays absent"
    );
    let long = format!("lock/{}", "n".repeat(300));
    assert!(ok("cas", a.kv_cas(&long, None, Some(&[0, 255, 1]))));
    assert_eq!(ok("get", b.kv_get(&long)), Some(vec![0, 255, 1]));
    assert_eq!(
        ok("list", b.kv_list("lock/")),
        vec![(long, vec![0, 255, 1])]
    );
}

/// Many nodes taking one lock, each under its own lease: exactly one wins; the others win
/// neither while it holds it nor with a lease that ended.
fn lease_lock_contention(s: &mut Store) {
    const N: usize = 10;
    let ttl = Duration::from_secs(5);
    let drivers: Vec<Arc<dyn Driver>> = (0..N).map(|_| s.driver()).collect();
    let barrier = Arc::new(Barrier::new(N));
    let threads: Vec<_> = drivers
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let (d, barrier) = (d.clone(), barrier.clone());
            std::thread::spawn(move || {
                let lease = d.lease_grant(ttl).map_err(|e| chain(&e))?;
                barrier.wait();
                let won = d
                    .kv_cas_leased("lock/disk0", None, format!("owner {i}").as_bytes(), lease)
                    .map_err(|e| chain(&e))?;
                Ok::<_, String>((won, lease))
            })
        })
        .collect();
    let results: Vec<(bool, u64)> = threads
        .into_iter()
        .map(|t| {
            t.join()
                .unwrap()
                .expect("lease_grant or kv_cas_leased failed")
        })
        .collect();
    let wins: Vec<usize> = (0..N).filter(|&i| results[i].0).collect();
    assert_eq!(wins.len(), 1, "winners {wins:?}");
    let w = wins[0];
    let leases: std::collections::BTreeSet<u64> = results.iter().map(|r| r.1).collect();
    assert_eq!(leases.len(), N, "lease ids are unique cluster-wide");
    let value = format!("owner {w}").into_bytes();
    assert_eq!(
        ok("get", drivers[0].kv_get("lock/disk0")),
        Some(value.clone())
    );
    // A loser cannot take it over, whatever it expects.
    let loser = (w + 1) % N;
    assert!(!ok(
        "cas leased",
        drivers[loser].kv_cas_leased("lock/disk0", None, b"thief", results[loser].1)
    ));
    // Its owner may rewrite it under its lease (expected = the current value).
    assert!(ok(
        "cas leased",
        drivers[w].kv_cas_leased("lock/disk0", Some(&value), b"owner again", results[w].1)
    ));
    // A lease that ended binds nothing.
    let gone = ok("grant", drivers[loser].lease_grant(ttl));
    ok("revoke", drivers[loser].lease_revoke(gone));
    assert!(
        !ok(
            "cas leased",
            drivers[loser].kv_cas_leased("lock/other", None, b"x", gone)
        ),
        "a revoked lease took a key"
    );
    assert_eq!(ok("get", drivers[0].kv_get("lock/other")), None);
    for (i, d) in drivers.iter().enumerate() {
        ok("revoke", d.lease_revoke(results[i].1));
    }
}

/// A leased key lives while its lease is renewed (from any node) and vanishes within its TTL
/// plus a second once renewals stop; then another node can take it.
fn lease_lock_expiry(s: &mut Store) {
    let ttl = Duration::from_secs(2);
    let a = s.driver();
    let b = s.driver();
    let la = renewed_lock(&*a, &*b, ttl);
    // No more renewals: gone within the TTL plus a second.
    let stopped = Instant::now();
    let limit = ttl + Duration::from_secs(1);
    while ok("get", b.kv_get("lock/vm1")).is_some() {
        assert!(
            stopped.elapsed() <= limit + Duration::from_millis(500),
            "the key outlived its lease by more than a second"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = stopped.elapsed();
    assert!(
        took <= limit,
        "the key went {took:?} after the last renewal; TTL {ttl:?}"
    );
    assert!(
        !ok("keepalive", a.lease_keepalive(la)),
        "an ended lease was renewed"
    );
    assert!(
        !ok("cas leased", a.kv_cas_leased("lock/vm1", None, b"a", la)),
        "an ended lease took a key"
    );
    let lb = ok("grant", b.lease_grant(ttl));
    assert!(
        ok("cas leased", b.kv_cas_leased("lock/vm1", None, b"b", lb)),
        "b takes it"
    );
    assert_eq!(ok("get", a.kv_get("lock/vm1")), Some(b"b".to_vec()));
    ok("revoke", b.lease_revoke(lb));
}

/// Binds `lock/vm1` to a new lease of `a` and renews it from `b` (lease ids are cluster-wide)
/// every 400 ms for twice its TTL, checking that the key stays. A renewal or read that comes
/// a TTL or more after the last renewal (the host stalled the test) may find the lease ended,
/// as the contract allows: that try proves nothing and the test starts over, at most three
/// times. Returns the lease.
fn renewed_lock(a: &dyn Driver, b: &dyn Driver, ttl: Duration) -> u64 {
    for attempt in 1..=3 {
        let mut renewed = Instant::now();
        let la = ok("grant", a.lease_grant(ttl));
        assert!(ok(
            "cas leased",
            a.kv_cas_leased("lock/vm1", None, b"a", la)
        ));
        let start = Instant::now();
        let mut stalled = None;
        while start.elapsed() < ttl * 2 {
            let asked = Instant::now();
            let alive = ok("keepalive", b.lease_keepalive(la));
            if !alive && renewed.elapsed() >= ttl {
                stalled = Some(renewed.elapsed());
                break;
            }
            assert!(
                alive,
                "a live lease ended {:?} after its renewal",
                renewed.elapsed()
            );
            renewed = asked;
            std::thread::sleep(Duration::from_millis(400));
            let got = ok("get", b.kv_get("lock/vm1"));
            if got.is_none() && renewed.elapsed() >= ttl {
                stalled = Some(renewed.elapsed());
                break;
            }
            assert_eq!(got, Some(b"a".to_vec()), "renewed yet gone");
        }
        let Some(gap) = stalled else {
            return la;
        };
        eprintln!("try {attempt}: {gap:?} since the last renewal (the host stalled); again");
        ok("revoke", a.lease_revoke(la));
    }
    panic!("the host stalled the renewals longer than the TTL in three tries: no verdict");
}

/// Revoking a lease frees its keys at once (no wait for the TTL); revoking an unknown lease is
/// no error; a plain kv_cas of a leased key unbinds it from its lease.
fn lease_revoke_and_unbind(s: &mut Store) {
    let ttl = Duration::from_secs(30);
    let a = s.driver();
    let b = s.driver();
    let la = ok("grant", a.lease_grant(ttl));
    assert!(ok(
        "cas leased",
        a.kv_cas_leased("lock/vm1", None, b"a", la)
    ));
    assert!(ok(
        "cas leased",
        a.kv_cas_leased("lock/vm2", None, b"a", la)
    ));
    ok("revoke", a.lease_revoke(la));
    assert_eq!(ok("get", b.kv_get("lock/vm1")), None, "revoke left the key");
    assert_eq!(ok("get", b.kv_get("lock/vm2")), None, "revoke left the key");
    let lb = ok("grant", b.lease_grant(ttl));
    assert!(
        ok("cas leased", b.kv_cas_leased("lock/vm1", None, b"b", lb)),
        "taken at once"
    );
    ok("revoke unknown", b.lease_revoke(la));
    ok("revoke unknown", b.lease_revoke(0x7fff_ffff_0000_0001));
    assert!(!ok("keepalive", b.lease_keepalive(la)));
    // A plain kv_cas unbinds: the key outlives the lease it was written under.
    assert!(ok("cas", a.kv_cas("lock/vm1", Some(b"b"), Some(b"plain"))));
    ok("revoke", b.lease_revoke(lb));
    assert_eq!(
        ok("get", a.kv_get("lock/vm1")),
        Some(b"plain".to_vec()),
        "unbound key went"
    );
    // kv_list sees leased keys too, and no longer sees them once revoked.
    let lc = ok("grant", a.lease_grant(ttl));
    assert!(ok(
        "cas leased",
        a.kv_cas_leased("lock/vm3", None, b"c", lc)
    ));
    assert_eq!(
        ok("list", b.kv_list("lock/")),
        vec![
            ("lock/vm1".to_string(), b"plain".to_vec()),
            ("lock/vm3".to_string(), b"c".to_vec())
        ]
    );
    ok("revoke", a.lease_revoke(lc));
    assert_eq!(
        ok("list", b.kv_list("lock/")),
        vec![("lock/vm1".to_string(), b"plain".to_vec())]
    );
}

/// etcd killed and started again under live nodes: once it is back, views keep following
/// joins and leaves (the watch, or whatever tells a node of changes, resumes).
fn watch_after_reconnect(s: &mut Store) {
    let a = s.driver();
    let b = s.driver();
    ok("a joins", a.join(&node(1, 1)));
    let v2 = ok("b joins", b.join(&node(2, 1)));
    tick_until(&*a, "b's join", Duration::from_secs(2), |v| {
        v.epoch == v2.epoch
    });
    // Killed and back at once (well within the lease TTL): the nodes stay members.
    s.etcd().kill(0);
    s.etcd().start_member(0);
    let ticker = Ticker::new(vec![b.clone()]);
    tick_until(
        &*a,
        "a tick that works again",
        Duration::from_secs(15),
        |_| true,
    );
    let c = s.driver();
    let vc = ok("c joins", c.join(&node(3, 1)));
    assert_eq!(
        ids(&vc),
        vec![1, 2, 3],
        "a or b was dropped across the restart: {vc:?}"
    );
    let ticker_c = Ticker::new(vec![c.clone()]);
    tick_until(
        &*a,
        "c's join after the restart",
        Duration::from_secs(3),
        |v| v.epoch >= vc.epoch && v.node(3).is_some(),
    );
    drop(ticker_c);
    ok("c leaves", c.leave());
    let v = tick_until(
        &*a,
        "c's leave after the restart",
        Duration::from_secs(3),
        |v| v.node(3).is_none(),
    );
    assert_eq!(v.epoch, vc.epoch + 1, "{v:?}");
    drop(ticker);
}

/// etcd stopped and started again: key-value calls fail (boundedly) meanwhile, and ticks
/// either fail or return the last view (the etcd driver renews its lease on its own stream,
/// so a tick reports the view it knows); a node cut off for its lease TTL is no longer surely
/// a member (`member_until` passes); afterwards ticks work, and every key-value datum and
/// past view survive.
fn store_restart(s: &mut Store) {
    let ttl = Duration::from_secs(2);
    let a = s.driver_with(DriverOptions { lease_ttl: ttl });
    let v1 = ok("a joins", a.join(&node(1, 1)));
    assert!(ok("cas", a.kv_cas("vdi/keep", None, Some(b"data"))));
    let lease = ok("grant", a.lease_grant(Duration::from_secs(60)));
    assert!(ok(
        "cas leased",
        a.kv_cas_leased("lock/keep", None, b"l", lease)
    ));
    s.etcd().stop(0);
    let down = Instant::now();
    // Key-value calls fail, without blocking for long, while the store is down.
    let d = a.clone();
    let w = bounded(
        "a kv_cas while etcd is down",
        Duration::from_secs(15),
        move || d.kv_cas("vdi/new", None, Some(b"x")).map_err(|e| chain(&e)),
    );
    assert!(w.is_err(), "a kv_cas succeeded with etcd down: {w:?}");
    let d = a.clone();
    let r = bounded(
        "a kv_get while etcd is down",
        Duration::from_secs(15),
        move || d.kv_get("vdi/keep").map_err(|e| chain(&e)),
    );
    assert!(r.is_err(), "a kv_get succeeded with etcd down: {r:?}");
    // Cut off for the TTL: no longer surely a member, whatever the ticks (which fail, or
    // report the last view known).
    loop {
        let d = a.clone();
        let t = bounded(
            "a tick while etcd is down",
            Duration::from_secs(15),
            move || d.tick(),
        );
        if let Ok(v) = t {
            assert_eq!(
                v, v1,
                "a tick with etcd down returned a view etcd never had"
            );
        }
        match a.member_until() {
            Some(u) if u <= Instant::now() => break,
            Some(_) => {}
            None => panic!("the etcd driver must bound membership"),
        }
        assert!(
            down.elapsed() <= ttl + Duration::from_secs(2),
            "member_until still ahead {:?} after etcd went down (TTL {ttl:?})",
            down.elapsed()
        );
        std::thread::sleep(TICK);
    }
    s.etcd().start_member(0);
    // Back: the node hears from etcd again (member_until ahead once more) and ticks, joining
    // again if its lease ended meanwhile.
    let deadline = Instant::now() + Duration::from_secs(15);
    let view = loop {
        let back = a.member_until().is_some_and(|u| u > Instant::now());
        match a.tick() {
            Ok(v) if back && v.node(1).is_some() => break v,
            Ok(v) if back => panic!("a tick after the restart returned a view without me: {v:?}"),
            Ok(_) => {}
            Err(DriverError::LeaseExpired) => {
                let v = ok("a joins again", a.join(&node(1, 2)));
                assert!(v.node(1).is_some());
            }
            Err(e) => eprintln!("tick after the restart: {}", chain(&e)),
        }
        assert!(
            Instant::now() < deadline,
            "a does not hear from etcd 15 s after it came back"
        );
        std::thread::sleep(TICK);
    };
    assert!(view.epoch >= v1.epoch);
    assert_eq!(ok("get", a.kv_get("vdi/keep")), Some(b"data".to_vec()));
    assert_eq!(
        ok("get", a.kv_get("lock/keep")),
        Some(b"l".to_vec()),
        "a 60 s lease ended"
    );
    assert_eq!(
        ok("get", a.kv_get("vdi/new")),
        None,
        "a failed kv_cas took effect"
    );
    assert_eq!(ok("view_at", a.view_at(v1.epoch)), Some(v1));
    assert!(ok(
        "cas",
        a.kv_cas("vdi/keep", Some(b"data"), Some(b"more"))
    ));
    ok("revoke", a.lease_revoke(lease));
}

/// One member of a 3-member etcd killed (the first endpoint every driver was given): with a
/// quorum left, every call of every driver works, old or opened since, and membership still
/// changes.
fn member_loss(s: &mut Store) {
    let a = s.driver();
    let b = s.driver();
    ok("a joins", a.join(&node(1, 1)));
    let v2 = ok("b joins", b.join(&node(2, 1)));
    s.etcd().kill(0);
    let ticker = Ticker::new(vec![a.clone(), b.clone()]);
    let c = s.driver();
    let mut failures = Vec::new();
    for i in 0..30 {
        for (name, d) in [("a", &a), ("c", &c)] {
            let key = format!("vdi/{name}{i}");
            if let Err(e) = d.kv_cas(&key, None, Some(b"v")) {
                failures.push(format!("{name}: kv_cas {key}: {}", chain(&e)));
            }
            if let Err(e) = d.kv_get(&key) {
                failures.push(format!("{name}: kv_get {key}: {}", chain(&e)));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 120 calls failed with 2 of 3 etcd members up:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let v3 = ok("c joins", c.join(&node(3, 1)));
    assert_eq!(v3.epoch, v2.epoch + 1, "{v3:?}");
    ok("c leaves", c.leave());
    // a's watch (moved off the dead member) sees both changes.
    let v4 = tick_until(&*a, "c's leave", Duration::from_secs(3), |v| {
        v.epoch > v3.epoch
    });
    assert_eq!(v4.epoch, v3.epoch + 1, "{v4:?}");
    assert_eq!(ids(&v4), vec![1, 2]);
    assert_eq!(ok("view_at", a.view_at(v3.epoch)), Some(v3));
    drop(ticker);
}

/// The raft leader of a 3-member etcd killed under live nodes with a short lease TTL: the
/// others elect a new one (about a second here), the nodes keep their leases and the view
/// (no epoch without them), and calls work again right after.
fn leader_loss(s: &mut Store) {
    let ttl = Duration::from_secs(2);
    let a = s.driver_with(DriverOptions { lease_ttl: ttl });
    let b = s.driver_with(DriverOptions { lease_ttl: ttl });
    ok("a joins", a.join(&node(1, 1)));
    let v2 = ok("b joins", b.join(&node(2, 1)));
    tick_until(&*a, "b's join", Duration::from_secs(2), |v| {
        v.epoch == v2.epoch
    });
    let ticker = Ticker::new(vec![a.clone(), b.clone()]);
    let leader = testkit::or_panic(s.etcd().try_wait_leader());
    s.etcd().kill(leader);
    let killed = Instant::now();
    let next = testkit::or_panic(s.etcd().try_wait_leader());
    assert_ne!(next, leader);
    eprintln!("a new etcd leader after {:?}", killed.elapsed());
    // Calls work again within a few seconds (some may fail during the election).
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = a.kv_cas("vdi/after", None, Some(b"x")) {
        assert!(
            Instant::now() < deadline,
            "kv_cas fails 5 s after the leader died: {}",
            chain(&e)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Well past the TTL: still both members, in the same epoch.
    std::thread::sleep(ttl * 2);
    for (name, d) in [("a", &a), ("b", &b)] {
        assert!(
            d.member_until().is_some_and(|u| u > Instant::now()),
            "{name} is no longer surely a member after the leader's death"
        );
        assert_eq!(
            ok("tick", d.tick()),
            v2,
            "{name}: the leader's death changed the view"
        );
    }
    drop(ticker);
}
