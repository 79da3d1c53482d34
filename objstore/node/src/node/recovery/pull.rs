//! Step 2 of [`super`]: copying pending objects whole from a holder of their newest version
//! ([`Node::pull`]), and a round's pass over every pending object with retries
//! ([`Node::pull_all`]).

use bytes::Bytes;

use super::{Pull, PullFailed, PEER_TIMEOUT, RETRY_FIRST, RETRY_MAX};
use crate::node::Node;
use crate::store::{ObjState, StoreError};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;

/// Pulls of one round at a time.
const PULL_PARALLEL: usize = 4;

/// How many times a round tries its failed pulls from the same sources before it plans
/// again (a source may have lost or dropped its copy since the plan).
const PULL_PASSES: u32 = 3;

/// How [`Node::pull_all`] ended.
pub(super) enum Pulled {
    All,
    /// The epoch changed: the round ends.
    Changed,
    /// This many objects are still pending after [`PULL_PASSES`] tries.
    Failed(usize),
}

impl Node {
    /// Copies `oid` whole from the first of `pull`'s sources that has it, installed only if
    /// still newer than the local copy.
    pub(super) async fn pull(&self, oid: ObjectId, pull: &Pull) -> Result<(), PullFailed> {
        let mut no_space = false;
        // Why each source gave nothing, for the warning if none does.
        let mut why = Vec::new();
        if !self.pull_delay.is_zero() {
            tokio::time::sleep(self.pull_delay).await;
        }
        let started = std::time::Instant::now();
        tracing::debug!("pulling {oid} at {:?} from {:?}", pull.want, pull.sources);
        for &src in &pull.sources {
            let mut h = Header::request(Opcode::PeerRead, 0, self.epoch().view.epoch);
            h.oid = oid.0;
            let res = match self.peers.get(src, PEER_TIMEOUT).await {
                Ok(c) => c.call(h, Bytes::new(), PEER_TIMEOUT).await,
                Err(e) => Err(e),
            };
            let frame = match res {
                Ok(f) if f.header.result_code() == ResultCode::Ok => f,
                Ok(f) => {
                    why.push(format!(
                        "{src}: {:?} {}",
                        f.header.result_code(),
                        f.message()
                    ));
                    continue;
                }
                Err(e) => {
                    self.peers.drop_conn(src).await;
                    why.push(format!("{src}: {e}"));
                    continue;
                }
            };
            // The copy pulled is the reference this node takes, even when its holder's is
            // suspect (every copy of the newest version was): installed, it is not suspect.
            let state = ObjState {
                suspect: false,
                lost: false,
                ..ObjState::from_wire(frame.header.offset, frame.header.aux)
            };
            let Some((data, note)) =
                crate::node::ec::split_pulled(oid, &frame.payload, state.version)
            else {
                why.push(format!("{src}: a malformed strip"));
                continue;
            };
            let store = self.store.clone();
            // A replica's write to this object waits while a pull installs it.
            let _ordered = self.replica_lock(oid).lock().await;
            let note = self.pulled_note(oid, note, state.version);
            let put = self
                .blocking(move || {
                    let installed = store.put_if_newer(oid, &data, state)?;
                    if let (true, Some(note)) = (installed, note) {
                        store.set_note(oid, &note)?;
                        store.sync_object(oid)?;
                    }
                    Ok::<_, StoreError>(installed)
                })
                .await
                .expect("store task");
            match put {
                Ok(installed) => {
                    // Not installed: the copy here is at least as new (a write came first).
                    // A copy lost here counts as restored only by an install: a lost copy
                    // never outranks the copy that restores it.
                    if installed {
                        self.recovery.restored(oid, state.version);
                    }
                    self.recovery.update(|s| s.done += 1);
                    return Ok(());
                }
                Err(e) => {
                    no_space |= matches!(e, StoreError::NoSpace);
                    tracing::warn!("recovering {oid}: {e}");
                    why.push(format!("{src}: storing it here: {e}"));
                }
            }
        }
        tracing::warn!(
            "could not recover object {oid} ({:?}) from any of {:?} (after {:?}: {}); it stays pending",
            pull.want,
            pull.sources,
            started.elapsed(),
            if why.is_empty() {
                "no source".to_string()
            } else {
                why.join("; ")
            }
        );
        Err(if no_space {
            PullFailed::NoSpace
        } else {
            PullFailed::Unavailable
        })
    }

    /// Pulls `oids`; what failed is retried with backoff from the same sources
    /// [`PULL_PASSES`] times in all, then left pending for the next plan.
    pub(super) async fn pull_all(&self, e: u32, mut oids: Vec<ObjectId>) -> Pulled {
        use futures::StreamExt;
        let changed = || self.epoch().view.epoch != e;
        let mut backoff = RETRY_FIRST;
        let mut pass = 0;
        loop {
            pass += 1;
            let mut failed = Vec::new();
            let mut work = futures::stream::iter(oids)
                .map(|oid| async move { (oid, self.ensure_recovered(oid).await.is_ok()) })
                .buffered(PULL_PARALLEL);
            while let Some((oid, ok)) = work.next().await {
                if changed() {
                    return Pulled::Changed;
                }
                if !ok {
                    failed.push(oid);
                }
            }
            drop(work);
            self.recovery.update(|s| s.failed = failed.len() as u64);
            if failed.is_empty() {
                return Pulled::All;
            }
            if pass >= PULL_PASSES {
                // Left failed (requests get that at once) until the next plan replaces every
                // pending pull with one from the holders it finds.
                return Pulled::Failed(failed.len());
            }
            tracing::warn!(
                "epoch {e}: {} object(s) could not be recovered; retrying in {backoff:?}",
                failed.len()
            );
            tokio::time::sleep(backoff).await;
            if changed() {
                return Pulled::Changed;
            }
            backoff = (backoff * 2).min(RETRY_MAX);
            oids = self.recovery.retry(failed);
        }
    }
}
