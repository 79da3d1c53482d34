//! A request that failed, as the node answers it, and how store errors and tasks that did not
//! finish become one.

use objstore_proto::frame::ResultCode;
use objstore_proto::oid::ObjectId;

use super::recovery::PullFailed;
use super::Node;
use crate::store::{StoreError, Version};

/// A failed request: result code, message for the payload, `aux`, and a version for the
/// response's `offset` field.
pub(super) struct Failure {
    pub code: ResultCode,
    pub message: String,
    pub(super) aux: u32,
    /// Sent in the response's `offset` field.
    pub(super) version: Option<Version>,
}

impl Failure {
    pub(super) fn new(code: ResultCode, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            aux: 0,
            version: None,
        }
    }

    pub(super) fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(ResultCode::InvalidRequest, message)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        let code = match e {
            StoreError::NotFound(_) => ResultCode::NotFound,
            StoreError::NoSpace => ResultCode::NoSpace,
            StoreError::Corrupt { .. } => ResultCode::Corrupt,
            // Being restored: the client retries (a read tries the other owners).
            StoreError::Lost(_) => ResultCode::Busy,
            _ => ResultCode::Io,
        };
        let mut message = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            message.push_str(": ");
            message.push_str(&s.to_string());
            src = s.source();
        }
        Failure::new(code, message)
    }
}

pub(super) async fn blocking<T: Send + 'static>(
    node: &Node,
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Failure> {
    match node.blocking(f).await {
        Ok(r) => r.map_err(Failure::from),
        Err(e) => Err(task_failure(e)),
    }
}

/// A store task that did not finish. Cancelled means it never ran: the node is shutting down
/// (its runtime drops blocking tasks not yet started), so the client tries again elsewhere
/// (`ShuttingDown`) instead of failing the I/O; a panic is an I/O error.
pub(super) fn task_failure(e: tokio::task::JoinError) -> Failure {
    let code = if e.is_cancelled() {
        ResultCode::ShuttingDown
    } else {
        ResultCode::Io
    };
    Failure::new(code, format!("store task failed: {e}"))
}

/// A request for an object whose pull failed or which must wait for nodes that are down: its
/// local copy may be stale or missing, so neither served nor written into. The client retries
/// (another replica, or later) unless this node's disk has no room for the object.
pub(super) fn not_recovered(oid: ObjectId, why: PullFailed) -> Failure {
    match why {
        PullFailed::Waiting { nodes, epoch } => Failure::new(
            ResultCode::Busy,
            format!(
                "object {oid} may have a newer copy only on nodes that are down: waiting for {} (they may hold objects written at epoch {epoch}; 'dog cluster recover --force' accepts the loss)",
                nodes
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ),
        PullFailed::NoSpace => Failure::new(
            ResultCode::NoSpace,
            format!("object {oid} is not recovered here: no space left on the node's disk"),
        ),
        PullFailed::Unavailable => Failure::new(
            ResultCode::Busy,
            format!("object {oid} is not recovered here yet (its pull failed; retrying)"),
        ),
    }
}
