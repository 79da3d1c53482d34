//! The cache control protocol: JSON lines over a unix socket `DIR/control.sock` (mode 0600)
//! inside the cache directory. One request line, then zero or more [`Response::Progress`]
//! lines (flush only), then one final line: [`Response::Ok`] or [`Response::Error`].
//!
//! ```text
//! -> {"cmd":"stats","vdi":null}
//! <- {"ok":{"stats":{...}}}
//! -> {"cmd":"flush","vdi":"disk0"}
//! <- {"progress":{"pushed":1048576,"total":4194304}}
//! <- {"ok":{"flushed":{"bytes":4194304}}}
//! -> {"cmd":"evict","vdi":null,"discard_dirty":false}
//! <- {"error":"no VDI named 'x' in the cache"}
//! -> {"cmd":"snapshot","vdi":"disk0","tag":"before"}
//! <- {"ok":{"snapshot":{"vdi":"disk0","snapshot":"disk0@before","vid":...,"new_vid":...,"flushed":4096,"attached":true,"open":true}}}
//! -> {"cmd":"rollback","snapshot":"disk0@before"}
//! <- {"ok":{"rollback":{"vdi":"disk0","snapshot":"disk0@before","new_vid":...,"dropped":...,"discarded_dirty":4096,"attached":true,"open":true}}}
//! ```

use serde::{Deserialize, Serialize};

/// The socket's file name inside the cache directory.
pub const SOCKET_NAME: &str = "control.sock";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// Writes are acknowledged once in the cache; fsync pushes them to the cluster.
    Writeback,
    /// Writes are acknowledged once the cluster has them; the cache keeps a copy for reads.
    Writethrough,
    /// Straight to the cluster; nothing cached.
    Off,
}

impl std::str::FromStr for CacheMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "writeback" => Ok(CacheMode::Writeback),
            "writethrough" => Ok(CacheMode::Writethrough),
            "off" => Ok(CacheMode::Off),
            _ => Err(format!(
                "unknown cache mode '{s}': expected writeback, writethrough or off"
            )),
        }
    }
}

impl std::fmt::Display for CacheMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CacheMode::Writeback => "writeback",
            CacheMode::Writethrough => "writethrough",
            CacheMode::Off => "off",
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase")]
pub enum Request {
    /// Counters for the whole cache, or one VDI's line only.
    Stats { vdi: Option<String> },
    /// Push dirty data (of one VDI, or all) to the cluster and flush it there.
    Flush { vdi: Option<String> },
    /// Drop clean cached data; dirty data is flushed first unless `discard_dirty`.
    Evict {
        vdi: Option<String>,
        #[serde(default)]
        discard_dirty: bool,
    },
    /// Change the cache's size bound (bytes).
    Resize { size: u64 },
    /// Change one VDI's mode (leaving writeback flushes first).
    Mode { vdi: String, mode: CacheMode },
    /// Take snapshot `VDI@TAG` (a tag made from the time if None) of a VDI this mount may
    /// have attached: its writes wait, its dirty data is pushed and flushed, the snapshot is
    /// taken under this mount's lock, and the mount goes on with the VDI's new inode.
    Snapshot {
        vdi: String,
        #[serde(default)]
        tag: Option<String>,
    },
    /// Roll the VDI back to snapshot `NAME@TAG`: what this mount cached of it is dropped,
    /// unpushed writes included, and the mount goes on with the rolled-back VDI.
    Rollback { snapshot: String },
}

/// Counters for one VDI (or, in [`CacheStats::total`], for all).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VdiStats {
    pub name: String,
    pub mode: Option<CacheMode>,
    /// Bytes of cached blocks (clean and dirty).
    pub used: u64,
    pub dirty: u64,
    /// Read requests served wholly from the cache, and their bytes.
    pub hits: u64,
    pub hit_bytes: u64,
    /// Read requests that went to the cluster (wholly or partly), and the bytes fetched.
    pub misses: u64,
    pub miss_bytes: u64,
    /// Bytes written into the cache from the cluster (fills) and by writes.
    pub fills: u64,
    pub fill_bytes: u64,
    pub evictions: u64,
    pub evicted_bytes: u64,
    /// Fetched ranges not written into the cache: it was full and the range had not missed
    /// recently (admission), or the fill worker was too far behind.
    #[serde(default)]
    pub skipped_fills: u64,
    /// Small misses (random reads) fetched for their reader alone and not cached because the
    /// host's CPUs were busy (`docs/cache.md`).
    #[serde(default)]
    pub busy_skipped_fills: u64,
    /// Misses of long sequential streams fetched past the cache: the stream's first pass
    /// through their object (see `sheepfs --cache-sequential-cutoff`).
    #[serde(default)]
    pub stream_bypasses: u64,
    /// Bytes pushed to the cluster by flushes.
    pub pushed_bytes: u64,
    /// Writeback writes (per object they touch) sent straight to the cluster because the
    /// cache could not take them (its size reached with nothing to evict, or its disk full),
    /// and their bytes.
    #[serde(default)]
    pub full_writethroughs: u64,
    #[serde(default)]
    pub full_writethrough_bytes: u64,
    /// Cached blocks whose checksum did not match when first read after a restart: clean
    /// ones were dropped and fetched again, dirty ones quarantined (reads of them get EIO,
    /// they are never pushed; `docs/cache.md`).
    #[serde(default)]
    pub corrupt_blocks: u64,
    /// Times this mount handed the VDI's lock over to another mount that asked for it
    /// (`sheepfs --lock-mode cooperative`: its dirty data pushed, its cached blocks dropped).
    #[serde(default)]
    pub handovers_given: u64,
    /// Times this mount took the VDI's lock over from another mount, for a write.
    #[serde(default)]
    pub handovers_taken: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CacheStats {
    pub dir: String,
    pub size: u64,
    pub used: u64,
    pub dirty: u64,
    /// Dirty bytes waiting for the background flusher.
    pub flush_backlog: u64,
    /// Bytes fetched from the cluster and queued to be written into the cache (fills in
    /// flight); 0 once every fill has landed.
    #[serde(default)]
    pub fill_backlog: u64,
    pub max_dirty: u64,
    pub max_dirty_age_secs: u64,
    /// Sequential runs longer than this are cached on their second pass (0: first).
    #[serde(default)]
    pub sequential_cutoff: u64,
    /// The host's CPUs were busy when last measured: small misses are not filled now
    /// (`docs/cache.md`).
    #[serde(default)]
    pub fills_limited: bool,
    pub default_mode: Option<CacheMode>,
    /// Failed pushes since start, and the last failure (data stays dirty and is retried).
    pub push_errors: u64,
    pub last_push_error: Option<String>,
    /// Pushes started again after a failed one (retries of data that stayed dirty), since
    /// start.
    #[serde(default)]
    pub push_retries: u64,
    /// How long the oldest dirty data has waited to be pushed, in milliseconds (0: nothing
    /// dirty; data an earlier mount left counts from this mount's start).
    #[serde(default)]
    pub oldest_dirty_ms: u64,
    pub total: VdiStats,
    pub vdis: Vec<VdiStats>,
}

// Messages built once per request and serialized at once: their size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reply {
    Stats(CacheStats),
    Flushed {
        bytes: u64,
    },
    Evicted {
        bytes: u64,
        discarded_dirty: u64,
    },
    Resized {
        size: u64,
    },
    Mode {
        vdi: String,
        mode: CacheMode,
        /// Whether the VDI is attached to this cache (None: an older sheepfs did not say).
        /// A mode that caches attaches a VDI open read-write on the mount (taking its open
        /// file over); one not open read-write there is attached at its next read-write open.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attached: Option<bool>,
    },
    Snapshot(Switched),
    Rollback(Switched),
}

/// What the mount did for a snapshot or a rollback.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Switched {
    pub vdi: String,
    /// `NAME@TAG`: the snapshot taken, or rolled back to.
    pub snapshot: String,
    /// The snapshot's id (its inode).
    pub vid: u32,
    /// The VDI's new id: the mount reads and writes it from now on.
    pub new_vid: u32,
    /// Whether the VDI was attached to this mount's cache (else the cache had nothing of it
    /// in use: the operation ran as `dog` runs it).
    pub attached: bool,
    /// Whether files of the VDI were open on the mount (they go on with the new inode).
    pub open: bool,
    /// Dirty bytes pushed to the cluster before the snapshot.
    pub flushed: u64,
    /// Bytes the cache held of the VDI's old inode, dropped.
    pub dropped: u64,
    /// Of them, writes never pushed to the cluster, thrown away by a rollback.
    pub discarded_dirty: u64,
}

#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Response {
    Progress { pushed: u64, total: u64 },
    Ok(Reply),
    Error(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shapes() {
        let r: Request = serde_json::from_str(r#"{"cmd":"stats","vdi":null}"#).unwrap();
        assert!(matches!(r, Request::Stats { vdi: None }));
        let r: Request =
            serde_json::from_str(r#"{"cmd":"evict","vdi":"a","discard_dirty":true}"#).unwrap();
        assert!(matches!(
            r,
            Request::Evict {
                discard_dirty: true,
                ..
            }
        ));
        let r: Request =
            serde_json::from_str(r#"{"cmd":"mode","vdi":"a","mode":"writethrough"}"#).unwrap();
        assert!(matches!(
            r,
            Request::Mode {
                mode: CacheMode::Writethrough,
                ..
            }
        ));
        let s = serde_json::to_string(&Response::Progress {
            pushed: 1,
            total: 2,
        })
        .unwrap();
        assert_eq!(s, r#"{"progress":{"pushed":1,"total":2}}"#);
        let s = serde_json::to_string(&Response::Ok(Reply::Flushed { bytes: 5 })).unwrap();
        assert_eq!(s, r#"{"ok":{"flushed":{"bytes":5}}}"#);
        let s = serde_json::to_string(&Response::Error("x".into())).unwrap();
        assert_eq!(s, r#"{"error":"x"}"#);
        let r: Request = serde_json::from_str(r#"{"cmd":"snapshot","vdi":"a"}"#).unwrap();
        assert!(matches!(r, Request::Snapshot { tag: None, .. }));
        let r: Request = serde_json::from_str(r#"{"cmd":"rollback","snapshot":"a@t"}"#).unwrap();
        assert!(matches!(r, Request::Rollback { snapshot } if snapshot == "a@t"));
    }
}

/// Golden lines: the wire format of the replies cachectl parses, field by field and in order.
#[cfg(test)]
mod golden {
    use super::*;

    #[test]
    fn stats_line() {
        const GOLD: &str = concat!(
            r#"{"ok":{"stats":{"dir":"/c","size":0,"used":0,"dirty":0,"flush_backlog":0,"fill_backlog":0,"max_dirty":0,"max_dirty_age_secs":0,"sequential_cutoff":0,"fills_limited":false,"default_mode":"writeback","push_errors":0,"last_push_error":null,"push_retries":0,"oldest_dirty_ms":0,"#,
            r#""total":{"name":"total","mode":null,"used":0,"dirty":0,"hits":0,"hit_bytes":0,"misses":0,"miss_bytes":0,"fills":0,"fill_bytes":0,"evictions":0,"evicted_bytes":0,"skipped_fills":0,"busy_skipped_fills":0,"stream_bypasses":0,"pushed_bytes":0,"full_writethroughs":0,"full_writethrough_bytes":0,"corrupt_blocks":0,"handovers_given":0,"handovers_taken":0},"vdis":[]}}}"#
        );
        let st = CacheStats {
            dir: "/c".into(),
            default_mode: Some(CacheMode::Writeback),
            total: VdiStats {
                name: "total".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let s = serde_json::to_string(&Response::Ok(Reply::Stats(st))).unwrap();
        assert_eq!(s, GOLD);
    }

    #[test]
    fn snapshot_line() {
        const GOLD: &str = r#"{"ok":{"snapshot":{"vdi":"a","snapshot":"a@t","vid":1,"new_vid":2,"attached":true,"open":false,"flushed":4096,"dropped":8192,"discarded_dirty":0}}}"#;
        let r = Reply::Snapshot(Switched {
            vdi: "a".into(),
            snapshot: "a@t".into(),
            vid: 1,
            new_vid: 2,
            attached: true,
            open: false,
            flushed: 4096,
            dropped: 8192,
            discarded_dirty: 0,
        });
        let s = serde_json::to_string(&Response::Ok(r)).unwrap();
        assert_eq!(s, GOLD);
    }

    #[test]
    fn mode_line() {
        // `attached: None` (an older sheepfs) is left out.
        const GOLD: &str = r#"{"ok":{"mode":{"vdi":"a","mode":"off"}}}"#;
        let r = Reply::Mode {
            vdi: "a".into(),
            mode: CacheMode::Off,
            attached: None,
        };
        let s = serde_json::to_string(&Response::Ok(r)).unwrap();
        assert_eq!(s, GOLD);
    }
}
