//! The initiator's side of the cluster-key handshake that opens every TCP connection (the
//! proofs are in [`objstore_proto::auth`], the bytes in docs/wire.md):
//!
//! ```text
//!  initiator                                      acceptor (node)
//!  AuthHello  payload: nonce_i (32)          ──►
//!                                            ◄──  Ok, payload: nonce_a (32) ‖ proof(acceptor)
//!  checks the node's proof against its keys
//!  AuthProof  payload: proof(initiator) (32) ──►
//!                                            ◄──  Ok (or Unauthenticated + why, then close)
//! ```
//!
//! Frames are read here without a buffer in front, so no byte of what follows the handshake is
//! consumed by it.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use objstore_proto::auth::{KeyFile, Nonce, Role, KEY_LEN};
use objstore_proto::frame::{
    write_frame, Frame, FrameError, Header, Opcode, ResultCode, HEADER_LEN,
};

/// Largest payload a handshake frame may carry (a refusal's message included).
pub const MAX_HANDSHAKE_PAYLOAD: u32 = 4096;

/// Why a handshake failed, carried inside the `io::Error` a transport returns (the
/// connection code turns it back into [`crate::conn::ConnError::Refused`]).
#[derive(Debug, Clone)]
pub struct Refused {
    pub code: ResultCode,
    pub message: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

fn refused(code: ResultCode, message: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, Refused { code, message })
}

/// Reads one frame whose payload is at most [`MAX_HANDSHAKE_PAYLOAD`] bytes, reading no byte
/// past it. A longer frame is refused before its payload is read.
pub async fn read_small_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r
            .read(&mut hb[got..])
            .await
            .map_err(|e| FrameError::Io(e.to_string()))?;
        if n == 0 {
            return Err(FrameError::Truncated(got));
        }
        got += n;
    }
    let header = Header::decode(&hb)?;
    if header.payload_len > MAX_HANDSHAKE_PAYLOAD {
        return Err(FrameError::TooLong(header.payload_len));
    }
    let mut payload = vec![0u8; header.payload_len as usize];
    r.read_exact(&mut payload)
        .await
        .map_err(|_| FrameError::Truncated(HEADER_LEN))?;
    Ok(Frame {
        header,
        payload: payload.into(),
    })
}

/// Runs the initiator's side on a fresh connection to `addr`. A refusal (by the node, or of the
/// node by us) is an `io::Error` of kind `PermissionDenied` carrying [`Refused`]; a node that
/// cannot take more connections answers `LimitReached`, carried the same way.
pub async fn initiate<R, W>(
    rd: &mut R,
    wr: &mut W,
    key: &KeyFile,
    addr: SocketAddr,
) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let keys = key.keys().map_err(|e| {
        refused(
            ResultCode::Unauthenticated,
            format!("cannot connect to node {addr}: {e}"),
        )
    })?;
    let mine = Nonce::random().map_err(io::Error::other)?;
    let hello = Header::request(Opcode::AuthHello, 0, 0);
    write_frame(wr, &hello, &mine.0).await?;
    wr.flush().await?;
    let bad = |e: FrameError| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("handshake with node {addr}: {e}"),
        )
    };
    let answer = read_small_frame(rd).await.map_err(bad)?;
    check_answer(&answer, Opcode::AuthHello, addr)?;
    if answer.payload.len() != 2 * KEY_LEN {
        return Err(bad(FrameError::Io(format!(
            "its AuthHello answer has {} bytes, expected {}",
            answer.payload.len(),
            2 * KEY_LEN
        ))));
    }
    let theirs = Nonce(answer.payload[..KEY_LEN].try_into().unwrap());
    if !keys.accepts(&answer.payload[KEY_LEN..], Role::Acceptor, &mine, &theirs) {
        return Err(refused(
            ResultCode::Unauthenticated,
            format!(
                "node {addr} did not prove it holds the cluster key (its proof matches none of the keys in {}): the keys differ, or it is not a node of this cluster",
                key.path().display()
            ),
        ));
    }
    let proof = keys.prove(Role::Initiator, &mine, &theirs);
    write_frame(wr, &Header::request(Opcode::AuthProof, 1, 0), &proof).await?;
    wr.flush().await?;
    let answer = read_small_frame(rd).await.map_err(bad)?;
    check_answer(&answer, Opcode::AuthProof, addr)
}

/// An answer to `op`: Ok, or the node's refusal.
fn check_answer(f: &Frame, op: Opcode, addr: SocketAddr) -> io::Result<()> {
    if !f.header.is_response() || f.header.opcode != op {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "handshake with node {addr}: expected the answer to {op:?}, got {:?}",
                f.header.opcode
            ),
        ));
    }
    match f.header.result_code() {
        ResultCode::Ok => Ok(()),
        ResultCode::LimitReached => Err(refused(
            ResultCode::LimitReached,
            format!("node {addr} refused the connection: {}", f.message()),
        )),
        code => Err(refused(
            code,
            format!("node {addr} refused the cluster key: {}", f.message()),
        )),
    }
}
