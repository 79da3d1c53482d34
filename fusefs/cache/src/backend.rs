//! What the cache needs of the cluster, as a trait: VDIs to open ([`Volume`]s), their
//! attachment locks, and a flush. The cluster's [`Client`] is the real one; tests run the
//! cache over VDIs in memory (`objstore_client::volume::MemVolume`) and a lock table in
//! memory, without processes, sockets or root.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use objstore_client::lock::{self, LockError, LockInfo, Renewal};
use objstore_client::volume::Volume;
use objstore_client::{Client, ClientError, Vdi, VdiError};

/// The cluster as the cache sees it.
pub trait Backend: Send + Sync + 'static {
    /// An open VDI.
    type Volume: Volume;

    /// Opens VDI `name` (its inode read afresh).
    fn open(&self, name: &str) -> impl Future<Output = Result<Self::Volume, VdiError>> + Send;

    /// Takes (or takes again: the same owner may) the attachment lock of VDI `name` for
    /// `owner`, running on `host`, bound to a lease of `ttl` if given (persistent otherwise);
    /// `resume`: the generation this owner held it with before, taken back if nobody attached
    /// since. The lock's generation changes whenever another owner took the lock in between.
    /// `control`: the mount's control socket, recorded in the lock so that `dog vdi snapshot`
    /// can ask the holder ([`LockInfo::control`]).
    fn acquire(
        &self,
        name: &str,
        owner: &str,
        host: &str,
        ttl: Option<Duration>,
        resume: Option<u64>,
        control: Option<&str>,
    ) -> impl Future<Output = Result<LockInfo, LockError>> + Send;

    /// Renews the lease of a lock [`Backend::acquire`] returned (see [`lock::keepalive`]).
    fn keepalive(&self, held: &LockInfo)
        -> impl Future<Output = Result<Renewal, LockError>> + Send;

    /// Releases the lock of VDI `name` if `owner` holds it.
    fn release(
        &self,
        name: &str,
        owner: &str,
    ) -> impl Future<Output = Result<(), LockError>> + Send;

    /// Called once the cache holds `v`'s lock: `v`'s own writes (pushes, and mode `off`'s
    /// writes, which invalidate what they overwrite) keep the cache coherent, so they leave
    /// the lock's generation alone.
    fn under_lock(&self, v: &Self::Volume);

    /// Makes every write acknowledged so far durable on every replica.
    fn flush(&self) -> impl Future<Output = Result<(), ClientError>> + Send;

    /// How long an operation may wait for the cluster (making room waits no longer).
    fn timeout(&self) -> Duration;

    /// Who the cluster is: an identity that changes when a cluster is created anew (its id
    /// and the time it was formatted), so that cached data of another cluster's VDI of the
    /// same name and id is never pushed into this one. Empty: unknown (nothing is checked).
    fn cluster_id(&self) -> String {
        String::new()
    }

    /// A seam for tests, called at the points of [`Pause`]: a test's backend can hold the
    /// cache there to make a race likely that real timing makes rare. The real one returns at
    /// once.
    fn pause(&self, _at: Pause) -> impl Future<Output = ()> + Send {
        std::future::ready(())
    }
}

/// Points in the cache's work where it calls [`Backend::pause`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pause {
    /// A push wrote its blocks to the cluster and marked them clean; it has not returned yet.
    PushCleaned,
    /// A write put one object's piece into the cache (its bytes and bits, writeback or
    /// writethrough); it has not returned yet.
    WriteStored,
}

impl Backend for Arc<Client> {
    type Volume = Vdi;

    async fn open(&self, name: &str) -> Result<Vdi, VdiError> {
        Vdi::open(self.clone(), name).await
    }

    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        host: &str,
        ttl: Option<Duration>,
        resume: Option<u64>,
        control: Option<&str>,
    ) -> Result<LockInfo, LockError> {
        lock::acquire_again(self, name, owner, host, ttl, resume, control).await
    }

    async fn keepalive(&self, held: &LockInfo) -> Result<Renewal, LockError> {
        lock::keepalive(self, held).await
    }

    async fn release(&self, name: &str, owner: &str) -> Result<(), LockError> {
        lock::release(self, name, owner).await
    }

    fn under_lock(&self, v: &Vdi) {
        v.set_under_lock();
    }

    async fn flush(&self) -> Result<(), ClientError> {
        Client::flush(self).await
    }

    fn timeout(&self) -> Duration {
        self.options().timeout
    }

    fn cluster_id(&self) -> String {
        let view = self.view();
        match (&view.info.cluster_id, view.info.config) {
            (id, _) if id.is_empty() => String::new(),
            (id, Some(c)) => format!("{id}/{}", c.formatted_at),
            (id, None) => id.clone(),
        }
    }
}
