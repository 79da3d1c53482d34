//! The cache directory's own state: its lock (one sheepfs at a time), how the last mount
//! ended (`state.json`), and one record per VDI (`vdis/<vid>.json`: name, lock generation,
//! mode), all written with the same crash-safe recipe.

use std::collections::HashMap;
use std::path::Path;
use std::sync::RwLock;
use std::time::{SystemTime, UNIX_EPOCH};

use cache_control::CacheMode;
use serde::{Deserialize, Serialize};

use crate::{Backend, Inner};

/// The directory held by this cache, and what it knows of each VDI.
pub(crate) struct CacheDir {
    /// flock'ed for the life of the cache.
    pub(crate) _lock: std::fs::File,
    pub(crate) records: RwLock<HashMap<u32, VdiRecord>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct VdiRecord {
    pub(crate) name: String,
    pub(crate) vid: u32,
    /// The lock generation the cached data belongs to.
    pub(crate) gen: u64,
    /// This cache released that lock cleanly (all pushed): if the next lock generation is
    /// ours again, nobody else attached in between.
    #[serde(default)]
    pub(crate) released: bool,
    pub(crate) mode: Option<CacheMode>,
    /// The cluster the data was cached from ([`crate::Backend::cluster_id`]; None in
    /// records older than this field, or when the cluster did not say).
    #[serde(default)]
    pub(crate) cluster: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub(crate) struct DirState {
    pub(crate) cache_id: String,
    pub(crate) boot_id: String,
    pub(crate) clean: bool,
    /// Written by a sheepfs that keeps `.sums` files ([`crate::sums`]). Missing: an older
    /// sheepfs used the directory since, whose writes left the sums stale.
    #[serde(default)]
    pub(crate) sums: bool,
}

pub(crate) fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn write_json_atomic<T: Serialize>(path: &Path, v: &T) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let f = std::fs::File::create(&tmp)?;
    serde_json::to_writer_pretty(&f, v).map_err(std::io::Error::other)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(d) = path.parent() {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}

pub(crate) fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u64::from_le_bytes(b) ^ now_ms()
}

pub(crate) fn hostname() -> String {
    objstore_client::lock::local_host()
}

impl<B: Backend> Inner<B> {
    pub(crate) fn save_record(&self, r: &VdiRecord) {
        let path = self
            .cfg
            .dir
            .join("vdis")
            .join(format!("{:06x}.json", r.vid));
        if let Err(e) = write_json_atomic(&path, r) {
            tracing::warn!("saving cache record of '{}': {e}", r.name);
        }
        self.dir.records.write().unwrap().insert(r.vid, r.clone());
        if let Some(cell) = self.stats.mode_cells.lock().unwrap().get(&r.vid) {
            cell.set(r.mode.unwrap_or(self.cfg.mode));
        }
    }

    /// Forgets VDI `vid` (deleted): its record, counters and mode.
    pub(crate) fn forget_record(&self, vid: u32) {
        self.dir.records.write().unwrap().remove(&vid);
        self.stats.counters.lock().unwrap().remove(&vid);
        self.stats.mode_cells.lock().unwrap().remove(&vid);
        let _ = std::fs::remove_file(self.cfg.dir.join("vdis").join(format!("{vid:06x}.json")));
    }

    pub(crate) fn vid_of(&self, name: &str) -> Option<u32> {
        self.dir
            .records
            .read()
            .unwrap()
            .values()
            .find(|r| r.name == name)
            .map(|r| r.vid)
    }
}
