//! A cluster in memory for the cache's tests: VDIs ([`MemVolume`]) and a lock table, with
//! seams on the writes that reach it ([`Hooks`]: hold them, delay them, check them) and a
//! copy of what its last flush made durable.

#![allow(dead_code)] // each test file uses its own part

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cache_control::CacheMode;
use objcache::{Backend, CacheConfig, Pause};
use objstore_client::lock::{LockError, LockInfo, Renewal};
use objstore_client::{ClientError, MemVolume, VdiError, Volume};
use objstore_proto::Vid;

/// A point where tasks can be held: while it is on, [`Gate::pass`] waits (counted in
/// `entered`) until it is off.
pub struct Gate {
    on: tokio::sync::watch::Sender<bool>,
    entered: tokio::sync::watch::Sender<u64>,
    /// While on, how many more tasks are held (the others pass); `u64::MAX`: all.
    budget: AtomicU64,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate {
            on: tokio::sync::watch::Sender::new(false),
            entered: tokio::sync::watch::Sender::new(0),
            budget: AtomicU64::new(u64::MAX),
        }
    }
}

impl Gate {
    /// Makes tasks wait here (true) or lets them all go (false).
    pub fn hold(&self, on: bool) {
        self.budget.store(u64::MAX, Ordering::SeqCst);
        self.on.send_replace(on);
    }

    /// Holds only the next `n` tasks that reach the gate (until [`Gate::hold`]`(false)`).
    pub fn hold_next(&self, n: u64) {
        self.budget.store(n, Ordering::SeqCst);
        self.on.send_replace(true);
    }

    /// Tasks that reached the gate while it held, so far.
    pub fn entered(&self) -> u64 {
        *self.entered.borrow()
    }

    /// Waits until `n` tasks in all have reached the gate while it held (or 10 s, then
    /// panics).
    pub async fn wait_entered(&self, n: u64) {
        let mut rx = self.entered.subscribe();
        tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|&e| e >= n))
            .await
            .expect("a task reached the gate")
            .unwrap();
    }

    async fn pass(&self) {
        let on = *self.on.borrow();
        let mine = on
            && (self.budget)
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| match b {
                    0 => None,
                    u64::MAX => Some(b),
                    b => Some(b - 1),
                })
                .is_ok();
        if mine {
            self.entered.send_modify(|e| *e += 1);
            let mut rx = self.on.subscribe();
            let _ = rx.wait_for(|&on| !on).await;
        }
    }
}

/// What the tests do to the cache's work with the cluster.
pub struct Hooks {
    /// Writes on their way into the cluster (pushes, write-throughs), before they land.
    pub writes: Gate,
    /// The cache's own pause points ([`Backend::pause`]).
    pub pauses: HashMap<Pause, Gate>,
    /// Writes sleep a pseudo-random time up to this many microseconds before they land.
    pub jitter_us: AtomicU64,
    /// Whether to check that 4 KiB blocks written are each one byte repeated (tests that
    /// write only such blocks): all of them, or with `edges_every` = n > 0, all but the
    /// first and last of every n (which such a test writes only in part); `torn` counts the
    /// blocks that were not.
    pub check_blocks: AtomicBool,
    pub edges_every: AtomicU64,
    pub torn: AtomicU64,
    rng: AtomicU64,
}

impl Default for Hooks {
    fn default() -> Hooks {
        Hooks {
            writes: Gate::default(),
            pauses: [Pause::PushCleaned, Pause::WriteStored]
                .into_iter()
                .map(|p| (p, Gate::default()))
                .collect(),
            jitter_us: AtomicU64::new(0),
            check_blocks: AtomicBool::new(false),
            edges_every: AtomicU64::new(0),
            torn: AtomicU64::new(0),
            rng: AtomicU64::new(0x9E37_79B9_7F4A_7C15),
        }
    }
}

impl Hooks {
    /// A pseudo-random number below `n` (xorshift; tests want spread, not quality).
    pub fn below(&self, n: u64) -> u64 {
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        if n == 0 {
            0
        } else {
            x % n
        }
    }

    /// The gate at the cache's pause point `at`.
    pub fn at(&self, at: Pause) -> &Gate {
        &self.pauses[&at]
    }

    async fn before_write(&self, offset: u64, data: &[u8]) {
        if self.check_blocks.load(Ordering::Relaxed) && offset.is_multiple_of(4096) {
            let every = self.edges_every.load(Ordering::Relaxed);
            for (i, b) in data.chunks(4096).enumerate() {
                let n = offset / 4096 + i as u64;
                let edge = every > 0 && (n.is_multiple_of(every) || n % every == every - 1);
                if !edge && b.iter().any(|&x| x != b[0]) {
                    self.torn.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
        let jitter = self.jitter_us.load(Ordering::Relaxed);
        if jitter > 0 {
            tokio::time::sleep(Duration::from_micros(self.below(jitter))).await;
        }
        self.writes.pass().await;
    }
}

/// One VDI in memory, shared by every open of it, with the cluster's write hooks.
pub struct Vol(pub Arc<MemVolume>, Arc<Hooks>);

impl Volume for Vol {
    fn name(&self) -> String {
        self.0.name()
    }
    fn vid(&self) -> Vid {
        self.0.vid()
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn object_size(&self) -> u32 {
        self.0.object_size()
    }
    fn is_allocated(&self, index: u64) -> bool {
        self.0.is_allocated(index)
    }
    async fn read_at(&self, offset: u64, len: u64) -> Result<Bytes, VdiError> {
        self.0.read_at(offset, len).await
    }
    async fn write_at(&self, offset: u64, data: Bytes) -> Result<(), VdiError> {
        self.1.before_write(offset, &data).await;
        self.0.write_at(offset, data).await
    }
    async fn discard(&self, offset: u64, len: u64) -> Result<(), VdiError> {
        self.0.discard(offset, len).await
    }
    async fn flush(&self) -> Result<(), VdiError> {
        self.0.flush().await
    }
    async fn refresh(&self) -> Result<(), VdiError> {
        self.0.refresh().await
    }
}

/// A cluster in memory: VDIs by name, and their locks (owner, generation).
#[derive(Default)]
pub struct Mem {
    vols: Mutex<HashMap<String, Arc<MemVolume>>>,
    locks: Mutex<HashMap<String, (Option<String>, u64)>>,
    pub flushes: AtomicU64,
    /// What [`Backend::cluster_id`] says (empty: nothing).
    pub cluster_id: Mutex<String>,
    /// Each VDI's bytes as the last cluster flush made them durable.
    durable: Mutex<HashMap<String, Vec<u8>>>,
    pub hooks: Arc<Hooks>,
}

#[derive(Clone, Default)]
pub struct MemCluster(pub Arc<Mem>);

impl MemCluster {
    pub fn add(&self, name: &str, vid: u32, size: u64, object_size: u32) -> Arc<MemVolume> {
        let v = Arc::new(MemVolume::new(name, Vid(vid), size, object_size));
        self.0.vols.lock().unwrap().insert(name.into(), v.clone());
        v
    }

    pub fn hooks(&self) -> &Hooks {
        &self.0.hooks
    }

    /// VDI `name`'s bytes as the last cluster flush left them durable (zeros before any).
    pub fn durable(&self, name: &str) -> Vec<u8> {
        let size = self.0.vols.lock().unwrap()[name].size() as usize;
        (self.0.durable.lock().unwrap().get(name).cloned()).unwrap_or_else(|| vec![0; size])
    }
}

impl Backend for MemCluster {
    type Volume = Vol;

    async fn open(&self, name: &str) -> Result<Vol, VdiError> {
        let vols = self.0.vols.lock().unwrap();
        let v = vols.get(name).ok_or(VdiError::NotFound(name.into()))?;
        Ok(Vol(v.clone(), self.0.hooks.clone()))
    }

    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        host: &str,
        _ttl: Option<Duration>,
        _resume: Option<u64>,
        control: Option<&str>,
    ) -> Result<LockInfo, LockError> {
        let mut locks = self.0.locks.lock().unwrap();
        let (held, gen) = locks.entry(name.into()).or_insert((None, 0));
        match held {
            Some(o) if o == owner => {}
            Some(o) => panic!("'{name}' is held by {o}: the tests attach from one cache"),
            None => {
                *held = Some(owner.into());
                *gen += 1;
            }
        }
        Ok(LockInfo {
            vdi: name.into(),
            owner: owner.into(),
            host: host.into(),
            since: 0,
            gen: *gen,
            lease: None,
            ttl_secs: None,
            control: control.map(str::to_string),
        })
    }

    async fn keepalive(&self, _held: &LockInfo) -> Result<Renewal, LockError> {
        Ok(Renewal::Alive)
    }

    async fn release(&self, name: &str, owner: &str) -> Result<(), LockError> {
        if let Some((held, _)) = self.0.locks.lock().unwrap().get_mut(name) {
            if held.as_deref() == Some(owner) {
                *held = None;
            }
        }
        Ok(())
    }

    fn under_lock(&self, _v: &Vol) {}

    async fn flush(&self) -> Result<(), ClientError> {
        // Every write acknowledged so far is durable from here on.
        let now: Vec<(String, Vec<u8>)> = (self.0.vols.lock().unwrap().iter())
            .map(|(n, v)| (n.clone(), v.contents()))
            .collect();
        self.0.durable.lock().unwrap().extend(now);
        self.0.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(5)
    }

    fn cluster_id(&self) -> String {
        self.0.cluster_id.lock().unwrap().clone()
    }

    async fn pause(&self, at: Pause) {
        self.0.hooks.at(at).pass().await;
    }
}

pub const MIB: u64 = 1 << 20;

pub fn config(dir: &Path, size: u64) -> CacheConfig {
    CacheConfig {
        dir: dir.to_path_buf(),
        size,
        mode: CacheMode::Writeback,
        max_dirty: size,
        max_dirty_age: Duration::from_secs(3600),
        sequential_cutoff: 0,
        lock_ttl: Duration::from_secs(15),
    }
}

/// Bytes that change from one offset to the next, different for each `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (((seed + i) * 2654435761) >> 13) as u8)
        .collect()
}

/// Polls `done` until it holds (or panics after 10 s): for work the cache does in the
/// background.
pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
