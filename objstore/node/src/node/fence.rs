//! The node's side of disk health ([`crate::health`]): copies a read found unreadable are
//! restored from another replica with the lost-copy mechanism ([`Node::restore_lost`]), and
//! once the store's errors reach the limit the node fences itself: it refuses object I/O at
//! once (`Fenced`), leaves the membership (a new epoch: recovery restores its copies on the
//! other nodes) and leaves a `fenced` mark in its data directory, so a restart on the same
//! directory refuses to start until the operator removes it. The process stays up and keeps
//! answering status (`NodeStatus`, `NodeStat`, `/metrics`) and peers' listings and reads, so
//! the others can still copy from it what it can read.

use std::path::Path;
use std::sync::Arc;

use super::server::Failure;
use super::{Node, NodeError};
use objstore_proto::frame::ResultCode;

/// The mark a fenced node leaves in its data directory.
const MARK: &str = "fenced";

/// Refuses to start on a data directory a fenced node left.
pub(super) fn check_mark(dir: &Path) -> Result<(), NodeError> {
    match std::fs::read_to_string(dir.join(MARK)) {
        Ok(reason) => Err(NodeError::Fenced {
            dir: dir.to_path_buf(),
            reason: reason.trim().to_string(),
        }),
        Err(_) => Ok(()),
    }
}

/// Restores each copy the store reports unreadable, one at a time (each is held meanwhile:
/// its I/O waits or goes to another replica).
pub(super) async fn restore_unreadable(node: Arc<Node>) {
    let Some(mut lost) = node.health.take_lost() else {
        return;
    };
    while let Some((oid, version)) = lost.recv().await {
        if node.health.is_fenced() {
            continue;
        }
        if !node.health.known_lost(oid) {
            // Replaced since the read failed (a check restored it while this task restored
            // others): restoring it again would mark a good copy lost until pulled again.
            tracing::info!(
                "object {oid}: the copy a read found unreadable was replaced since; nothing to restore"
            );
            continue;
        }
        tracing::warn!(
            "object {oid}: a read of its copy here failed; restoring it from another replica"
        );
        // On failure restore_lost logged it and planned the object again.
        if node.restore_lost(&[(oid, version)]).await.is_ok() {
            node.health.restored(oid);
            tracing::info!("object {oid} restored after a failed read");
        }
    }
}

/// Waits until the node must fence itself, then does.
pub(super) async fn fence_when_told(node: Arc<Node>) {
    node.health.wait_fenced().await;
    let why = node.health.fenced().unwrap_or_default();
    tracing::error!("FENCED: {why}");
    if node._dir_lock.is_some() {
        if let Err(e) = std::fs::write(node.dir.join(MARK), format!("{why}\n")) {
            tracing::warn!(
                "could not leave the mark {}: {e}",
                node.dir.join(MARK).display()
            );
        }
    }
    let d = node.driver.clone();
    match node.blocking(move || d.leave()).await {
        Ok(Ok(())) => tracing::error!(
            "fenced node {} left the cluster: recovery restores its copies on the other nodes",
            node.me.addr
        ),
        Ok(Err(e)) => tracing::error!("fenced, but leaving the cluster failed: {e}"),
        Err(e) => tracing::error!("fenced, but leaving the cluster failed: {e}"),
    }
}

impl Node {
    /// Refuses object I/O on a fenced node.
    pub(super) fn check_fenced(&self) -> Result<(), Failure> {
        match self.health.fenced() {
            None => Ok(()),
            Some(why) => Err(Failure::new(
                ResultCode::Fenced,
                format!("node {} is fenced: {why}", self.me.addr),
            )),
        }
    }

    /// A change that failed with an I/O error somewhere: worth the client's retry when that
    /// node fences itself after enough errors (the change then goes to other owners), final
    /// otherwise.
    pub(super) fn retry_io(&self, f: Failure) -> Failure {
        if f.code == ResultCode::Io && self.health.fences() {
            Failure::new(
                ResultCode::Busy,
                format!(
                    "{} (retried: a node whose disk keeps failing is fenced after {} errors)",
                    f.message,
                    self.health.options().limit
                ),
            )
        } else {
            f
        }
    }
}
