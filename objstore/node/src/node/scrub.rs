//! The background scrub: each node walks its copies at a bounded rate, reads each back
//! ([`crate::store::ObjectBackend::verify`]) and repairs what it finds bad, so a copy that rots
//! on disk is found and restored without any client reading it.
//!
//! - A pass lists the copies here and verifies each one it owns (tombstones, copies being
//!   recovered and copies awaiting collection are skipped). The pass reads at most `rate`
//!   bytes per second on average: after each copy it sleeps until the bytes read so far are
//!   due; the bytes the other owners read to answer its comparisons count too.
//! - A copy that fails verification here is bad: it is restored from another owner
//!   ([`Node::repair_copy`], issue 22's lost-copy mechanism).
//! - For an object this node is the primary of, the pass also asks the other owners for their
//!   copies' digests (`CheckObj`) and judges them all ([`objstore_proto::check::judge`]):
//!   an owner behind, missing, failing or in a digest minority gets `RepairObj` from a good
//!   copy. So without block checksums a flipped byte is still found, once per pass, by the
//!   object's primary.
//! - A strip of an erasure-coded object (a key `oid.strip(k)`) is scrubbed by [`ec`]: as the
//!   stripe's primary (strip 0 here) the node checks every strip against the others and their
//!   parity and rebuilds the bad ones; any other holder verifies its strip and, if it is bad,
//!   asks the primary to rebuild it.
//! - A pass starts when the node has recovered its epoch, and the next one `interval` after
//!   the last one started (at once if the pass took longer). Every pass is recorded in
//!   [`ScrubStatus`] (`dog node scrub`, `dog node list`), and the last one in `DIR/scrub.json`,
//!   so a node that restarts waits out the interval from it instead of scrubbing again at once
//!   (a node never scrubbed starts at once).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use objstore_proto::api::{ScrubPass, ScrubStatus};
use objstore_proto::check::judge;
use objstore_proto::oid::ObjectId;

use super::Node;

mod ec;

/// The scrub's settings (`sheep --scrub-rate`, `--scrub-interval`).
#[derive(Debug, Clone, Copy)]
pub struct ScrubOptions {
    /// Bytes per second a pass reads at most; 0 turns the scrub off.
    pub rate: u64,
    /// Time from the start of one pass to the start of the next.
    pub interval: Duration,
}

/// `sheep`'s default interval between passes.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(24 * 3600);

impl Default for ScrubOptions {
    /// Off: a node started from the library scrubs only when asked to.
    fn default() -> Self {
        ScrubOptions {
            rate: 0,
            interval: DEFAULT_INTERVAL,
        }
    }
}

/// The scrub's state, as [`ScrubStatus`] shows it.
#[derive(Default)]
pub(super) struct Scrub {
    status: Mutex<ScrubStatus>,
}

impl Scrub {
    pub(super) fn status(&self) -> ScrubStatus {
        self.status.lock().unwrap().clone()
    }

    fn update(&self, f: impl FnOnce(&mut ScrubStatus)) {
        f(&mut self.status.lock().unwrap());
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The file in the data directory that keeps the last pass across restarts.
const LAST_PASS_FILE: &str = "scrub.json";

/// The last pass recorded in `dir`, if any (a file that does not parse is ignored).
fn load_last(dir: &Path) -> Option<ScrubPass> {
    let raw = std::fs::read(dir.join(LAST_PASS_FILE)).ok()?;
    serde_json::from_slice(&raw).ok()
}

/// Records `pass` in `dir` (tmp file, sync, rename): a restart then waits for the interval
/// from it instead of scrubbing again at once.
fn save_last(dir: &Path, pass: &ScrubPass) -> std::io::Result<()> {
    let tmp = dir.join(format!("{LAST_PASS_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(pass).expect("serializable"))?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(LAST_PASS_FILE))
}

/// The scrub task: passes at `opts.rate`, one every `opts.interval` (counted from the last
/// pass recorded in `dir`, even before a restart; at once when none is), until the node stops.
pub(super) async fn run(node: Arc<Node>, opts: ScrubOptions, dir: PathBuf) {
    let last = load_last(&dir);
    node.scrub.update(|s| {
        s.rate = opts.rate;
        s.last = last.clone();
    });
    let mut next = match last {
        Some(p) => {
            let due = std::time::UNIX_EPOCH + Duration::from_secs(p.started) + opts.interval;
            let wait = due
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            tokio::time::Instant::now() + wait
        }
        None => tokio::time::Instant::now(),
    };
    loop {
        tokio::time::sleep_until(next).await;
        // Not while the node recovers: copies are still moving.
        while node.recovery.recovered_epoch() < node.epoch().view.epoch || node.config().is_none() {
            if node.stop.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        next = tokio::time::Instant::now() + opts.interval;
        let Some(pass) = node.scrub_pass(opts.rate).await else {
            return;
        };
        if let Err(e) = save_last(&dir, &pass) {
            tracing::warn!("scrub: cannot record the pass in {}: {e}", dir.display());
        }
    }
}

impl Node {
    /// One pass now at no rate limit, as the scrub task makes them (for tests:
    /// `MemCluster::scrub`); None when the node stopped meanwhile.
    pub(crate) async fn scrub_now(self: &Arc<Self>) -> Option<ScrubPass> {
        self.scrub_pass(u64::MAX).await
    }

    /// One pass over the copies here (see the module documentation); None when the node
    /// stopped meanwhile.
    async fn scrub_pass(self: &Arc<Self>, rate: u64) -> Option<ScrubPass> {
        let list = self.store.list();
        let mut pass = ScrubPass {
            started: now_secs(),
            ..Default::default()
        };
        self.scrub.update(|s| s.current = Some(pass.clone()));
        tracing::info!("scrub: pass over {} cop(ies) at {rate} B/s", list.len());
        let t0 = tokio::time::Instant::now();
        let mut read = 0u64;
        for (oid, st) in list {
            if self.stop.load(Ordering::SeqCst) {
                return None;
            }
            if st.deleted {
                continue;
            }
            let (bad, repaired) = (pass.bad, pass.repaired);
            read += self.scrub_one(oid, &mut pass).await;
            self.scrub.update(|s| {
                s.bad_total += pass.bad - bad;
                s.repaired_total += pass.repaired - repaired;
                s.current = Some(pass.clone());
            });
            let due = t0 + Duration::from_secs_f64(read as f64 / rate as f64);
            tokio::time::sleep_until(due).await;
        }
        pass.ended = Some(now_secs());
        pass.took_ms = Some(t0.elapsed().as_millis() as u64);
        tracing::info!(
            "scrub: pass done: {} cop(ies), {} bytes, {} bad, {} repaired, {} unrecoverable",
            pass.objects,
            pass.bytes,
            pass.bad,
            pass.repaired,
            pass.unrecoverable
        );
        self.scrub.update(|s| {
            s.current = None;
            s.last = Some(pass.clone());
            s.passes += 1;
        });
        Some(pass)
    }

    /// Verifies one copy and repairs what is bad; returns the bytes read for it (here and on
    /// the other owners).
    async fn scrub_one(self: &Arc<Self>, oid: ObjectId, pass: &mut ScrubPass) -> u64 {
        if let Some(k) = oid.strip_index() {
            return self.scrub_strip(oid, k, pass).await;
        }
        let Some(cfg) = self.config() else { return 0 };
        let ep = self.epoch();
        let owners = ep.ring.replicas(oid, cfg.copies as usize);
        if !owners.iter().any(|n| n.id == self.me.id) {
            return 0; // awaiting collection
        }
        let primary = owners.first().map(|n| n.id) == Some(self.me.id);
        // As primary, with the object's lock: no change of it is half applied meanwhile, so
        // an owner found behind is really behind. (Released before repairing: a repair here
        // takes it.)
        let ordered = if primary {
            Some(self.obj_lock(oid).lock().await)
        } else {
            None
        };
        let local = self.check_copy(oid, false).await;
        if local.recovering || local.state.is_none_or(|s| s.deleted) {
            return 0;
        }
        pass.objects += 1;
        pass.bytes += local.bytes;
        let mut read = local.bytes;
        if local.error.is_none() && !primary {
            return read;
        }
        let mut answers = Vec::new();
        for n in &owners {
            if n.id == self.me.id {
                answers.push((n.addr, Ok(local.clone())));
            } else {
                let a = self.check_peer(n.addr, oid).await;
                if let Ok(c) = &a {
                    read += c.bytes;
                }
                answers.push((n.addr, a));
            }
        }
        let j = judge(&answers);
        drop(ordered);
        // A replica judges only its own copy; the primary every owner's.
        let bad: Vec<_> = j
            .bad
            .iter()
            .filter(|(a, _)| primary || *a == self.me.addr)
            .collect();
        pass.bad += bad.len() as u64;
        if let Some(why) = &j.unrecoverable {
            if primary || local.error.is_some() {
                tracing::error!("scrub: object {oid}: no good copy to restore from: {why}");
                pass.unrecoverable += 1;
                pass.bad += u64::from(local.error.is_some() && bad.is_empty());
            }
            return read;
        }
        let (Some(newest), Some(&source)) = (j.newest, j.good.first()) else {
            return read;
        };
        for (addr, why) in bad {
            tracing::warn!("scrub: object {oid}: the copy on {addr} is bad ({why}): restoring it from {source}");
            match self
                .repair_peer(*addr, oid, newest.version, Some(source))
                .await
            {
                Ok(_) => pass.repaired += 1,
                Err(e) => tracing::warn!("scrub: object {oid}: repair on {addr} failed: {e}"),
            }
        }
        read
    }
}
