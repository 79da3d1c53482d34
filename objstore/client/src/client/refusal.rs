//! Answers that are not worth retrying because the node refused this client itself: its key
//! (`Unauthenticated`) or one more connection or request (`LimitReached`).

use std::net::SocketAddr;

use objstore_proto::frame::{Frame, ResultCode};

use super::ClientError;
use crate::conn::ConnError;

/// The error for an answer that refuses the connection's key or names a limit reached.
pub(super) fn denied(addr: SocketAddr, f: &Frame) -> Option<ClientError> {
    let code = f.header.result_code();
    let message = match code {
        ResultCode::Unauthenticated => {
            format!("node {addr} refused the cluster key: {}", f.message())
        }
        ResultCode::LimitReached => format!("node {addr} refused the request: {}", f.message()),
        _ => return None,
    };
    Some(ClientError::Denied {
        addr,
        code,
        message,
    })
}

/// A connection the handshake refused, as the client's error; any other failure back.
pub(super) fn refused(e: ConnError) -> Result<ClientError, ConnError> {
    match e {
        ConnError::Refused {
            addr,
            code,
            message,
        } => Ok(ClientError::Denied {
            addr,
            code,
            message,
        }),
        e => Err(e),
    }
}
