//! The `local` driver: nodes on one host share a state directory.
//!
//! ```text
//! STATE_DIR/lock                    flock(2) taken for every change
//! STATE_DIR/cluster_id              created on first use
//! STATE_DIR/nodes/<id>.json         {info, pid, heartbeat_ms}: rewritten at every tick
//! STATE_DIR/epochs/<epoch>.json     one View per epoch, written once (tmp, fsync, rename)
//! STATE_DIR/kv/<blake3(key)>        the key-value store: [u32 BE key length][key][value]
//! ```
//! A node is alive while its process exists (checked with `kill(pid, 0)`, so SIGKILL is seen at
//! the next tick of any node) and its heartbeat is younger than [`super::DEAD_AFTER`].

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::{Driver, DriverError, DEAD_AFTER};
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

/// A key's file holds the key itself (any length, any bytes) followed by the value; the
/// file is named by the key's hash so names stay short whatever the key.
fn kv_encode(key: &str, value: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + key.len() + value.len());
    b.extend_from_slice(&(key.len() as u32).to_be_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(value);
    b
}

fn kv_decode(raw: &[u8]) -> Option<(String, Vec<u8>)> {
    let len = u32::from_be_bytes(raw.get(..4)?.try_into().ok()?) as usize;
    let key = std::str::from_utf8(raw.get(4..4 + len)?).ok()?.to_string();
    Some((key, raw[4 + len..].to_vec()))
}

impl LocalDriver {
    pub fn open(dir: &Path) -> Result<LocalDriver, DriverError> {
        let d = LocalDriver {
            dir: dir.to_path_buf(),
            me: Mutex::new(None),
        };
        for sub in ["nodes", "epochs", "kv"] {
            fs::create_dir_all(dir.join(sub)).map_err(|e| d.io("create directory", e))?;
        }
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

    /// Live nodes, sorted by id; records of dead nodes are removed.
    fn live_nodes(&self) -> Result<Vec<NodeInfo>, DriverError> {
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
                pid_alive(r.pid)
                    && now_ms().saturating_sub(r.heartbeat_ms) < DEAD_AFTER.as_millis() as u64
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
        self.heartbeat()?;
        let live = self.live_nodes()?;
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
}

impl Driver for LocalDriver {
    fn describe(&self) -> String {
        format!("local:{}", self.dir.display())
    }

    // Leases: being built (helper branch "leases"); refused until then.
    fn kv_cas_leased(
        &self,
        _k: &str,
        _e: Option<&[u8]>,
        _n: &[u8],
        _l: u64,
    ) -> Result<bool, DriverError> {
        Err(DriverError::UnknownDriver("leases (not built yet)".into()))
    }
    fn lease_grant(&self, _ttl: std::time::Duration) -> Result<u64, DriverError> {
        Err(DriverError::UnknownDriver("leases (not built yet)".into()))
    }
    fn lease_keepalive(&self, _lease: u64) -> Result<bool, DriverError> {
        Err(DriverError::UnknownDriver("leases (not built yet)".into()))
    }
    fn lease_revoke(&self, _lease: u64) -> Result<(), DriverError> {
        Err(DriverError::UnknownDriver("leases (not built yet)".into()))
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
        let path = self.kv_path(key);
        match fs::read(&path) {
            Ok(b) => match kv_decode(&b) {
                Some((k, v)) if k == key => Ok(Some(v)),
                _ => Err(self.corrupt(&path, format!("does not hold key {key:?}"))),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(self.io("read key", e)),
        }
    }

    fn kv_cas(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, DriverError> {
        self.locked(|| {
            let cur = self.kv_get(key)?;
            if cur.as_deref() != expected {
                return Ok(false);
            }
            let path = self.kv_path(key);
            match new {
                Some(v) => self.write_atomic(&path, &kv_encode(key, v), true)?,
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
        for e in fs::read_dir(self.dir.join("kv")).map_err(|e| self.io("list keys", e))? {
            let path = e.map_err(|e| self.io("list keys", e))?.path();
            let is_record = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()));
            if !is_record {
                continue; // a temporary file, or something that is not ours
            }
            let raw = match fs::read(&path) {
                Ok(r) => r,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(self.io("read key", e)),
            };
            match kv_decode(&raw) {
                Some((k, v)) if k.starts_with(prefix) => out.push((k, v)),
                Some(_) => {}
                None => return Err(self.corrupt(&path, "unreadable key-value record")),
            }
        }
        out.sort();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, port: u16) -> NodeInfo {
        NodeInfo {
            id,
            addr: format!("127.0.0.1:{port}").parse().unwrap(),
            zone: id as u32,
            vnodes: 8,
            incarnation: 1,
        }
    }

    #[test]
    fn join_leave_make_epochs() {
        let d = tempfile::tempdir().unwrap();
        let a = LocalDriver::open(d.path()).unwrap();
        let b = LocalDriver::open(d.path()).unwrap();
        assert_eq!(a.cluster_id().unwrap(), b.cluster_id().unwrap());
        let v1 = a.join(&node(1, 7000)).unwrap();
        assert_eq!((v1.epoch, v1.nodes.len()), (1, 1));
        let v2 = b.join(&node(2, 7001)).unwrap();
        assert_eq!((v2.epoch, v2.nodes.len()), (2, 2));
        assert_eq!(a.tick().unwrap(), v2, "no change, no new epoch");
        b.leave().unwrap();
        let v3 = a.tick().unwrap();
        assert_eq!((v3.epoch, v3.nodes), (3, vec![node(1, 7000)]));
        assert_eq!(a.view_at(2).unwrap(), Some(v2));
    }

    #[test]
    fn dead_pid_is_dropped() {
        let d = tempfile::tempdir().unwrap();
        let a = LocalDriver::open(d.path()).unwrap();
        a.join(&node(1, 7000)).unwrap();
        let rec = NodeRecord {
            info: node(2, 7001),
            pid: u32::MAX / 2, // no such process
            heartbeat_ms: now_ms(),
        };
        fs::write(a.node_path(2), serde_json::to_vec(&rec).unwrap()).unwrap();
        let v = a.tick().unwrap();
        assert_eq!(v.nodes, vec![node(1, 7000)]);
    }

    #[test]
    fn kv_cas_and_list() {
        let d = tempfile::tempdir().unwrap();
        let a = LocalDriver::open(d.path()).unwrap();
        assert!(a.kv_cas("vdi/x", None, Some(b"1")).unwrap());
        assert!(!a.kv_cas("vdi/x", None, Some(b"2")).unwrap());
        assert!(a.kv_cas("vdi/x", Some(b"1"), Some(b"2")).unwrap());
        assert!(a.kv_cas("vdi/y/z", None, Some(b"3")).unwrap());
        assert!(a.kv_cas("other", None, Some(b"4")).unwrap());
        let l = a.kv_list("vdi/").unwrap();
        assert_eq!(
            l,
            vec![
                ("vdi/x".into(), b"2".to_vec()),
                ("vdi/y/z".into(), b"3".to_vec())
            ]
        );
        assert!(a.kv_cas("vdi/x", Some(b"2"), None).unwrap());
        assert_eq!(a.kv_get("vdi/x").unwrap(), None);
        // Keys of any length (a 255-byte VDI name and more).
        let long = format!("lock/{}", "n".repeat(300));
        assert!(a.kv_cas(&long, None, Some(b"v")).unwrap());
        assert_eq!(a.kv_get(&long).unwrap(), Some(b"v".to_vec()));
        assert_eq!(a.kv_list("lock/").unwrap(), vec![(long, b"v".to_vec())]);
    }
}
