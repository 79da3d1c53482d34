//! A copy that fails its checksum here (the store's [`StoreError::Corrupt`]) is handled as a
//! lost copy (issue 22's mechanism, [`Node::restore_lost`]): from the moment it is found, no
//! request is served from it (the store keeps it unreadable, and recovery holds it pending),
//! other nodes' listings see it lost so nobody copies it, and it is restored from another
//! replica in the background. The request that found it gets `Corrupt`, and the client reads
//! another replica.
//!
//! [`StoreError::Corrupt`]: crate::store::StoreError::Corrupt

use std::sync::Arc;

use objstore_proto::oid::ObjectId;

use super::Node;

impl Node {
    /// The copy of `oid` here failed its checksum: marks it lost and restores it from
    /// another replica in the background (once: a copy already lost is being restored).
    pub(super) fn copy_corrupt(self: &Arc<Self>, oid: ObjectId) {
        if oid.strip_index().is_some() {
            // A strip has no other replica to pull: the store keeps it unreadable, reads
            // decode around it, and the stripe's primary rebuilds it from the others (its
            // resolution takes the strip as missing; the check and the scrub repair it). A
            // restore by pull only held the strip as lost and raced the rebuild.
            tracing::error!(
                "strip {oid}: the copy here failed its checksum; the stripe's primary rebuilds it"
            );
            return;
        }
        if self.recovery.lost(oid).is_some() {
            return;
        }
        let Some(st) = self.store.meta(oid).filter(|st| !st.deleted) else {
            return;
        };
        tracing::error!(
            "object {oid}: the copy here at {:?} failed its checksum; restoring it from another replica",
            st.version
        );
        self.recovery.lose(oid, st.version);
        let node = self.clone();
        tokio::spawn(async move {
            if node.restore_lost(&[(oid, st.version)]).await.is_ok() {
                tracing::info!("object {oid}: the corrupt copy here was restored");
            }
        });
    }
}
