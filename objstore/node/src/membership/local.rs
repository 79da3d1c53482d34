//! The `local` driver: nodes on one host share a state directory.
//!
//! ```text
//! STATE_DIR/lock                    flock(2) taken for every change
//! STATE_DIR/cluster_id              created on first use
//! STATE_DIR/nodes/<id>.json         {info, pid, heartbeat_ms}: rewritten at every tick
//! STATE_DIR/epochs/<epoch>.json     one View per epoch, written once (tmp, fsync, rename)
//! STATE_DIR/kv/<blake3(key)>        the key-value store: [u32 BE key length][key][value], or
//!                                   for a key bound to a lease [u32 BE key length | 1 << 31]
//!                                   [u64 BE lease id][key][value]
//! STATE_DIR/leases/<id:016x>.json   {ttl_ms, deadline_ms}: one lease, rewritten at every renewal
//! ```
//! A node is alive while its process exists (checked with `kill(pid, 0)`, so SIGKILL is seen at
//! the next tick of any node) and its heartbeat is younger than [`super::DEAD_AFTER`]. A node
//! that was itself held up between two ticks (a stalled host or file system stops every node
//! on it alike) adds how late its tick is to that age limit before it judges others by their
//! heartbeats: their silence may be the same stall it just came out of.
//!
//! Leases: every node of the store runs on this host, so one clock (unix milliseconds) decides
//! for all. A lease is alive while its file exists and its deadline is in the future. A key
//! bound to a lease that ended is absent to every read and is removed by the first one that
//! sees it (under the lock), and every tick removes leases past their deadline with their
//! keys, so nothing needs reading for a dead host's lock to vanish. Lease files are written
//! without fsync (as heartbeats): after a crash of the host, leases and the keys bound to them
//! are gone, as their holders are.
//!
//! Record format: a record of an unbound key is byte for byte what earlier versions wrote, and
//! every record they wrote reads back unbound. A bound record (bit 31 of the key length set)
//! is new: an earlier binary refuses it as unreadable.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{Driver, DriverError, DEAD_AFTER, TICK};
use objstore_proto::view::{NodeInfo, View};

#[derive(Serialize, Deserialize)]
struct NodeRecord {
    info: NodeInfo,
    pid: u32,
    heartbeat_ms: u64,
}

pub struct LocalDriver {
    dir: PathBuf,
    me: Mutex<Option<NodeInfo>>,
    /// When this driver's previous refresh started: how late the current one is.
    last_refresh: Mutex<Option<Instant>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Bit 31 of a record's key length: a lease id follows the length.
const BOUND: u32 = 1 << 31;

/// A key's file holds the key itself (any length, any bytes) followed by the value; the
/// file is named by the key's hash so names stay short whatever the key. A key bound to a
/// lease carries the lease's id between the length and the key.
fn kv_encode(key: &str, value: &[u8], lease: Option<u64>) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + key.len() + value.len());
    match lease {
        Some(id) => {
            b.extend_from_slice(&(key.len() as u32 | BOUND).to_be_bytes());
            b.extend_from_slice(&id.to_be_bytes());
        }
        None => b.extend_from_slice(&(key.len() as u32).to_be_bytes()),
    }
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(value);
    b
}

/// One key-value record: key, value, and the lease it is bound to.
struct Record {
    key: String,
    value: Vec<u8>,
    lease: Option<u64>,
}

fn kv_decode(raw: &[u8]) -> Option<Record> {
    let word = u32::from_be_bytes(raw.get(..4)?.try_into().ok()?);
    let (lease, start) = if word & BOUND != 0 {
        let id = u64::from_be_bytes(raw.get(4..12)?.try_into().ok()?);
        (Some(id), 12)
    } else {
        (None, 4)
    };
    let len = (word & !BOUND) as usize;
    let key = std::str::from_utf8(raw.get(start..start + len)?)
        .ok()?
        .to_string();
    Some(Record {
        key,
        value: raw[start + len..].to_vec(),
        lease,
    })
}

/// One lease's file.
#[derive(Serialize, Deserialize)]
struct LeaseRecord {
    ttl_ms: u64,
    deadline_ms: u64,
}

/// A lease's TTL as the contract has it: whole seconds, at least one.
fn whole_secs(ttl: Duration) -> Duration {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

impl LocalDriver {
    pub fn open(dir: &Path) -> Result<LocalDriver, DriverError> {
        let d = LocalDriver {
            dir: dir.to_path_buf(),
            me: Mutex::new(None),
            last_refresh: Mutex::new(None),
        };
        for sub in ["nodes", "epochs", "kv", "leases"] {
            fs::create_dir_all(dir.join(sub)).map_err(|e| d.io("create directory", e))?;
        }
        // The VDI table and the membership: whoever can write here can change the cluster.
        let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o700);
        fs::set_permissions(dir, owner_only).map_err(|e| d.io("chmod 700", e))?;
        Ok(d)
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> DriverError {
        DriverError::Io {
            path: self.dir.display().to_string(),
            op,
            source,
        }
    }

    fn corrupt(&self, what: &Path, reason: impl ToString) -> DriverError {
        DriverError::Corrupt {
            path: self.dir.display().to_string(),
            what: what.display().to_string(),
            reason: reason.to_string(),
        }
    }

    /// Runs `f` holding the store's exclusive lock.
    fn locked<T>(&self, f: impl FnOnce() -> Result<T, DriverError>) -> Result<T, DriverError> {
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(self.dir.join("lock"))
            .map_err(|e| self.io("open lock", e))?;
        // SAFETY: flock on a valid descriptor; released when `lock` is closed.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(self.io("lock", std::io::Error::last_os_error()));
        }
        f()
    }

    /// Writes a file atomically; `durable` adds fsync of the file and directory.
    fn write_atomic(&self, path: &Path, data: &[u8], durable: bool) -> Result<(), DriverError> {
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let res = (|| {
            let mut f = File::create(&tmp)?;
            f.write_all(data)?;
            if durable {
                f.sync_all()?;
            }
            fs::rename(&tmp, path)?;
            if durable {
                File::open(path.parent().unwrap())?.sync_all()?;
            }
            Ok(())
        })();
        res.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            self.io("write", e)
        })
    }

    fn node_path(&self, id: u64) -> PathBuf {
        self.dir.join("nodes").join(format!("{id:016x}.json"))
    }

    fn heartbeat(&self) -> Result<(), DriverError> {
        let me = self.me.lock().unwrap().clone();
        if let Some(info) = me {
            let rec = NodeRecord {
                pid: std::process::id(),
                heartbeat_ms: now_ms(),
                info: info.clone(),
            };
            let data = serde_json::to_vec(&rec).expect("serializable");
            self.write_atomic(&self.node_path(info.id), &data, false)?;
        }
        Ok(())
    }

    /// Live nodes, sorted by id; records of dead nodes are removed. A heartbeat counts as
    /// fresh for [`DEAD_AFTER`] plus `late` (how much later than one tick this refresh came).
    fn live_nodes(&self, late: Duration) -> Result<Vec<NodeInfo>, DriverError> {
        let max_age = (DEAD_AFTER + late).as_millis() as u64;
        let mut live = Vec::new();
        let dir = self.dir.join("nodes");
        for e in fs::read_dir(&dir).map_err(|e| self.io("list nodes", e))? {
            let path = e.map_err(|e| self.io("list nodes", e))?.path();
            if path.extension().and_then(|x| x.to_str()) != Some("json") {
                continue;
            }
            let rec: Option<NodeRecord> = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let alive = rec.as_ref().is_some_and(|r| {
                pid_alive(r.pid) && now_ms().saturating_sub(r.heartbeat_ms) < max_age
            });
            match rec {
                Some(r) if alive => live.push(r.info),
                _ => {
                    tracing::info!("membership: dropping dead node record {}", path.display());
                    let _ = fs::remove_file(&path);
                }
            }
        }
        live.sort_by_key(|n| n.id);
        Ok(live)
    }

    fn epoch_path(&self, epoch: u32) -> PathBuf {
        self.dir.join("epochs").join(format!("{epoch:010}.json"))
    }

    fn latest_epoch(&self) -> Result<u32, DriverError> {
        let mut max = 0;
        for e in fs::read_dir(self.dir.join("epochs")).map_err(|e| self.io("list epochs", e))? {
            let name = e.map_err(|e| self.io("list epochs", e))?.file_name();
            if let Some(n) = name
                .to_str()
                .and_then(|s| s.strip_suffix(".json"))
                .and_then(|s| s.parse::<u32>().ok())
            {
                max = max.max(n);
            }
        }
        Ok(max)
    }

    fn read_view(&self, epoch: u32) -> Result<Option<View>, DriverError> {
        if epoch == 0 {
            return Ok(Some(View::default()));
        }
        let path = self.epoch_path(epoch);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| self.corrupt(&path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read epoch", e)),
        }
    }

    /// Heartbeat, then a new epoch if the live set changed. Caller holds the lock.
    fn refresh(&self) -> Result<View, DriverError> {
        let started = Instant::now();
        let previous = self.last_refresh.lock().unwrap().replace(started);
        let late = previous.map_or(Duration::ZERO, |p| {
            started.saturating_duration_since(p).saturating_sub(TICK)
        });
        self.heartbeat()?;
        self.expire_leases()?;
        let live = self.live_nodes(late + started.elapsed())?;
        let latest = self.latest_epoch()?;
        let view = self.read_view(latest)?.unwrap_or_default();
        if view.nodes == live {
            return Ok(view);
        }
        let next = View {
            epoch: latest + 1,
            nodes: live,
        };
        let data = serde_json::to_vec_pretty(&next).expect("serializable");
        self.write_atomic(&self.epoch_path(next.epoch), &data, true)?;
        tracing::info!(
            "membership: epoch {} with {} node(s)",
            next.epoch,
            next.nodes.len()
        );
        Ok(next)
    }

    fn kv_path(&self, key: &str) -> PathBuf {
        self.dir
            .join("kv")
            .join(blake3::hash(key.as_bytes()).to_hex().as_str())
    }

    fn lease_path(&self, id: u64) -> PathBuf {
        self.dir.join("leases").join(format!("{id:016x}.json"))
    }

    /// The lease's record, None if it does not exist (never made, revoked, or removed).
    fn read_lease(&self, id: u64) -> Result<Option<LeaseRecord>, DriverError> {
        let path = self.lease_path(id);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| self.corrupt(&path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read lease", e)),
        }
    }

    fn lease_alive(&self, id: u64) -> Result<bool, DriverError> {
        Ok(self
            .read_lease(id)?
            .is_some_and(|l| l.deadline_ms > now_ms()))
    }

    /// The record of `key` as stored, bound or not, alive or not.
    fn read_record(&self, key: &str) -> Result<Option<Record>, DriverError> {
        let path = self.kv_path(key);
        match fs::read(&path) {
            Ok(b) => match kv_decode(&b) {
                Some(r) if r.key == key => Ok(Some(r)),
                _ => Err(self.corrupt(&path, format!("does not hold key {key:?}"))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read key", e)),
        }
    }

    /// The record of `key` if it is live; a record bound to a lease that ended is removed.
    /// Caller holds the lock.
    fn read_live(&self, key: &str) -> Result<Option<Record>, DriverError> {
        match self.read_record(key)? {
            Some(Record {
                lease: Some(id), ..
            }) if !self.lease_alive(id)? => {
                self.end_lease(id)?;
                Ok(None)
            }
            r => Ok(r),
        }
    }

    /// Removes lease `id` and every key bound to it. Caller holds the lock.
    fn end_lease(&self, id: u64) -> Result<(), DriverError> {
        for e in fs::read_dir(self.dir.join("kv")).map_err(|e| self.io("list keys", e))? {
            let path = e.map_err(|e| self.io("list keys", e))?.path();
            if !is_record_name(&path) {
                continue;
            }
            let bound = fs::read(&path)
                .ok()
                .and_then(|b| kv_decode(&b))
                .is_some_and(|r| r.lease == Some(id));
            if bound {
                tracing::debug!(
                    "membership: lease {id:016x} ended: removing {}",
                    path.display()
                );
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(self.io("delete key", e)),
                }
            }
        }
        match fs::remove_file(self.lease_path(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.io("delete lease", e)),
        }
    }

    /// Ends every lease past its deadline. Caller holds the lock.
    fn expire_leases(&self) -> Result<(), DriverError> {
        let now = now_ms();
        let mut ended = Vec::new();
        for e in fs::read_dir(self.dir.join("leases")).map_err(|e| self.io("list leases", e))? {
            let name = e.map_err(|e| self.io("list leases", e))?.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|s| s.strip_suffix(".json"))
                .and_then(|s| u64::from_str_radix(s, 16).ok())
            else {
                continue; // a temporary file
            };
            // An unreadable lease file (a torn write after a crash) ends the lease.
            let deadline = self.read_lease(id).ok().flatten().map(|l| l.deadline_ms);
            if deadline.is_none_or(|d| d <= now) {
                ended.push(id);
            }
        }
        for id in ended {
            tracing::info!("membership: lease {id:016x} expired");
            self.end_lease(id)?;
        }
        Ok(())
    }

    fn write_lease(&self, id: u64, ttl_ms: u64) -> Result<(), DriverError> {
        let rec = LeaseRecord {
            ttl_ms,
            deadline_ms: now_ms() + ttl_ms,
        };
        let data = serde_json::to_vec(&rec).expect("serializable");
        self.write_atomic(&self.lease_path(id), &data, false)
    }
}

/// A key-value record's file name: 64 hex digits (not a temporary file).
fn is_record_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl Driver for LocalDriver {
    fn describe(&self) -> String {
        format!("local:{}", self.dir.display())
    }

    fn cluster_id(&self) -> Result<String, DriverError> {
        self.locked(|| {
            let path = self.dir.join("cluster_id");
            match fs::read_to_string(&path) {
                Ok(s) => Ok(s.trim().to_string()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let id = format!("{:016x}", rand::random::<u64>());
                    self.write_atomic(&path, id.as_bytes(), true)?;
                    Ok(id)
                }
                Err(e) => Err(self.io("read cluster id", e)),
            }
        })
    }

    fn join(&self, me: &NodeInfo) -> Result<View, DriverError> {
        *self.me.lock().unwrap() = Some(me.clone());
        self.locked(|| self.refresh())
    }

    fn tick(&self) -> Result<View, DriverError> {
        self.locked(|| self.refresh())
    }

    fn leave(&self) -> Result<(), DriverError> {
        let me = self.me.lock().unwrap().take();
        if let Some(me) = me {
            self.locked(|| {
                let _ = fs::remove_file(self.node_path(me.id));
                self.refresh().map(|_| ())
            })?;
        }
        Ok(())
    }

    fn view_at(&self, epoch: u32) -> Result<Option<View>, DriverError> {
        self.read_view(epoch)
    }

    fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, DriverError> {
        match self.read_record(key)? {
            Some(Record {
                lease: Some(id), ..
            }) if !self.lease_alive(id)? => {
                // Its lease ended: remove it under the lock (a renewal or a new value may have
                // come in between: read again there).
                self.locked(|| Ok(self.read_live(key)?.map(|r| r.value)))
            }
            r => Ok(r.map(|r| r.value)),
        }
    }

    fn kv_cas(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, DriverError> {
        self.locked(|| {
            let cur = self.read_live(key)?;
            if cur.as_ref().map(|r| r.value.as_slice()) != expected {
                return Ok(false);
            }
            let path = self.kv_path(key);
            match new {
                // An unbound record: a plain write unbinds the key from its lease.
                Some(v) => self.write_atomic(&path, &kv_encode(key, v, None), true)?,
                None => {
                    if cur.is_some() {
                        fs::remove_file(&path).map_err(|e| self.io("delete key", e))?;
                    }
                }
            }
            Ok(true)
        })
    }

    fn kv_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, DriverError> {
        let mut out = Vec::new();
        let mut ended = Vec::new();
        for e in fs::read_dir(self.dir.join("kv")).map_err(|e| self.io("list keys", e))? {
            let path = e.map_err(|e| self.io("list keys", e))?.path();
            if !is_record_name(&path) {
                continue; // a temporary file, or something that is not ours
            }
            let raw = match fs::read(&path) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.io("read key", e)),
            };
            match kv_decode(&raw) {
                Some(r) if r.key.starts_with(prefix) => match r.lease {
                    Some(id) if !self.lease_alive(id)? => ended.push(r.key),
                    _ => out.push((r.key, r.value)),
                },
                Some(_) => {}
                None => return Err(self.corrupt(&path, "unreadable key-value record")),
            }
        }
        if !ended.is_empty() {
            // Remove them under the lock; one renewed or rewritten in between stays listed.
            self.locked(|| {
                for key in ended {
                    if let Some(r) = self.read_live(&key)? {
                        out.push((r.key, r.value));
                    }
                }
                Ok(())
            })?;
        }
        out.sort();
        Ok(out)
    }

    fn kv_cas_leased(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
        lease: u64,
    ) -> Result<bool, DriverError> {
        self.locked(|| {
            if !self.lease_alive(lease)? {
                return Ok(false);
            }
            let cur = self.read_live(key)?;
            if cur.as_ref().map(|r| r.value.as_slice()) != expected {
                return Ok(false);
            }
            self.write_atomic(&self.kv_path(key), &kv_encode(key, new, Some(lease)), true)?;
            Ok(true)
        })
    }

    fn lease_grant(&self, ttl: Duration) -> Result<u64, DriverError> {
        let ttl_ms = whole_secs(ttl).as_millis() as u64;
        self.locked(|| loop {
            let id = rand::random::<u64>();
            if id == 0 || self.read_lease(id)?.is_some() {
                continue;
            }
            self.write_lease(id, ttl_ms)?;
            return Ok(id);
        })
    }

    fn lease_keepalive(&self, lease: u64) -> Result<bool, DriverError> {
        self.locked(|| match self.read_lease(lease)? {
            Some(l) if l.deadline_ms > now_ms() => {
                self.write_lease(lease, l.ttl_ms)?;
                Ok(true)
            }
            Some(_) => {
                self.end_lease(lease)?;
                Ok(false)
            }
            None => Ok(false),
        })
    }

    fn lease_revoke(&self, lease: u64) -> Result<(), DriverError> {
        self.locked(|| self.end_lease(lease))
    }
}

#[cfg(test)]
mod tests;
