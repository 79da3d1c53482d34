//! The holder's side of a cooperative lock hand-over: every [`lock::REQUEST_POLL`] the mount
//! looks for requests for the locks it holds. Without a cache ([`crate::locks`]), for each it
//! closes the VDI's gate (requests in flight are answered first, new ones wait), makes every
//! acknowledged write durable (a flush: map entries and nodes), releases the lock and opens
//! the gate again; the writes that waited then ask for the lock back. With a cache, the cache
//! pushes and drops what it holds of the VDI first ([`crate::cachelocks`]).

use std::sync::Arc;
use std::time::Instant;

use objcache::chain;
use objstore_client::lock;

use objcache::Cache;
use objstore_client::Client;

use crate::cachelocks::CacheLocks;
use crate::handles::Shared;
use crate::locks::{Asked, LockMode, PlainLocks, WriteLocks};

/// Whose locks a mount hands over.
pub(crate) enum Holder {
    Plain(Arc<PlainLocks>),
    Cache(Arc<CacheLocks>),
}

/// The mount's lock keeping from its options: without a cache, its own locks (their leases
/// renewed from now on); with a cache in cooperative mode, the hand-over of the cache's; and
/// in cooperative mode whose requests [`Shared::answer_requests`] answers.
pub(crate) fn lock_sides(
    client: &Arc<Client>,
    cache: Option<&Cache>,
    locks: Option<WriteLocks>,
    rt: &tokio::runtime::Handle,
) -> (
    Option<Arc<PlainLocks>>,
    Option<Arc<CacheLocks>>,
    Option<Holder>,
) {
    let cooperative = locks.as_ref().map(|l| l.mode) == Some(LockMode::Cooperative);
    match (cache, locks) {
        (None, Some(l)) => {
            let locks = Arc::new(PlainLocks::new(client.clone(), &l));
            rt.spawn(locks.clone().keeper());
            let holder = cooperative.then(|| Holder::Plain(locks.clone()));
            (Some(locks), None, holder)
        }
        (Some(cache), Some(l)) if cooperative => {
            let cl = Arc::new(CacheLocks::new(
                cache.clone(),
                client.clone(),
                l.handover_timeout,
            ));
            (None, Some(cl.clone()), Some(Holder::Cache(cl)))
        }
        _ => (None, None, None),
    }
}

impl Shared {
    /// Answers hand-over requests for as long as the mount lives.
    pub(crate) async fn answer_requests(self: Arc<Self>, holder: Holder) {
        loop {
            tokio::time::sleep(lock::REQUEST_POLL).await;
            let asked = match &holder {
                Holder::Plain(locks) => locks.asked().await,
                Holder::Cache(cl) => cl.asked().await,
            };
            let asked = match asked {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!("looking for lock requests: {}", chain(&e));
                    continue;
                }
            };
            for a in asked {
                match &holder {
                    Holder::Plain(locks) => self.hand_over_lock(locks, &a).await,
                    Holder::Cache(cl) => self.give_cached_lock(cl, &a).await,
                }
            }
        }
    }

    /// Gives the lock of `a.vdi` to the mount that asked (see the module documentation). A
    /// flush that fails keeps the lock: the asker waits, and this is tried again at the next
    /// look.
    async fn hand_over_lock(&self, locks: &PlainLocks, a: &Asked) {
        let start = Instant::now();
        let ino = self.ino(&a.vdi);
        let gate = {
            let open = self.open.lock().unwrap();
            open.get(&ino).map(|o| (o.gate.clone(), o.disk.clone()))
        };
        let Some((gate, disk)) = gate else {
            // Not open here (closed meanwhile: its release task frees the lock).
            return;
        };
        let _quiet = gate.write().await;
        if let Err(e) = disk.flush().await {
            tracing::warn!(
                "VDI '{}': {} asks for its lock; flushing it first failed: {} (the lock stays here; tried again)",
                a.vdi,
                a.to,
                chain(&e)
            );
            return;
        }
        match locks.give(a).await {
            Ok(true) => tracing::info!(
                "VDI '{}': handed the lock (generation {}) over to {}, who asked for it; its writes here were flushed first ({:?})",
                a.vdi,
                a.gen,
                a.to,
                start.elapsed()
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!(
                "VDI '{}': releasing its lock for {}: {}",
                a.vdi,
                a.to,
                chain(&e)
            ),
        }
    }
}
