//! The wire protocol: a fixed 48-byte header, then `payload_len` raw bytes.
//!
//! Two protocols share the framing but are versioned apart: client↔node operations
//! (opcodes `0x01..=0x3f`, [`CLIENT_VERSION`]) and node↔node operations (opcodes
//! `0x80..=0xbf`, [`PEER_VERSION`]). All integers are big-endian. `docs/wire.md` gives
//! the layout byte by byte; the golden tests below pin it.
//!
//! ```text
//!  0      2    3     4      6       8      12           16      24   32      40      44   48
//! [magic][ver][op ][flags][result][epoch][payload_len][req_id][oid][offset][length][aux]
//! ```
//!
//! A frame that does not decode (bad magic, wrong version for its opcode, unknown opcode,
//! payload over [`MAX_PAYLOAD`], a truncated frame) is a [`FrameError`]: the receiver logs it
//! and closes that connection.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::pagebuf::{PageBuf, PAGE};

pub const MAGIC: u16 = 0x5348; // "SH"
pub const CLIENT_VERSION: u8 = 2;
pub const PEER_VERSION: u8 = 2;
pub const HEADER_LEN: usize = 48;
/// Largest payload a frame may carry: a 64 MiB object plus an inode of 16M map entries.
pub const MAX_PAYLOAD: u32 = 68 << 20;

/// Set in every response header.
pub const FLAG_RESPONSE: u16 = 0x8000;

/// Which of the two protocols an opcode belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Client,
    Peer,
}

macro_rules! opcodes {
    ($($name:ident = $val:literal, $proto:ident;)*) => {
        /// Every operation, with its wire value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum Opcode { $($name = $val,)* }

        impl Opcode {
            pub fn from_u8(v: u8) -> Option<Opcode> {
                match v { $($val => Some(Opcode::$name),)* _ => None }
            }
            pub fn protocol(self) -> Protocol {
                match self { $(Opcode::$name => Protocol::$proto,)* }
            }
        }
    };
}

opcodes! {
    // client <-> node
    ReadObj = 0x01, Client;
    WriteObj = 0x02, Client;
    RemoveObj = 0x03, Client;
    Flush = 0x04, Client;
    StatObj = 0x05, Client;
    CowWrite = 0x06, Client;
    FlattenObj = 0x07, Client;
    EcRead = 0x08, Client;
    EcWrite = 0x09, Client;
    EcRemove = 0x0a, Client;
    EcCheck = 0x0b, Client;
    EcStripRead = 0x0c, Client;
    ClusterInfo = 0x10, Client;
    Format = 0x11, Client;
    KvGet = 0x12, Client;
    KvCas = 0x13, Client;
    KvList = 0x14, Client;
    NodeStatus = 0x15, Client;
    LeaseGrant = 0x16, Client;
    LeaseKeepalive = 0x17, Client;
    LeaseRevoke = 0x18, Client;
    KvCasLeased = 0x19, Client;
    NodeStat = 0x1a, Client;
    CheckObj = 0x1b, Client;
    RepairObj = 0x1c, Client;
    // the handshake that opens every TCP connection (crate::auth)
    AuthHello = 0x20, Client;
    AuthProof = 0x21, Client;
    // node <-> node
    PeerList = 0x81, Peer;
    PeerRead = 0x82, Peer;
    PeerStatus = 0x83, Peer;
    PeerWrite = 0x84, Peer;
    PeerPut = 0x85, Peer;
    PeerCow = 0x86, Peer;
    PeerDigest = 0x87, Peer;
    PeerArcs = 0x88, Peer;
    PeerStrip = 0x89, Peer;
    PeerStripRead = 0x8a, Peer;
}

impl Opcode {
    /// The protocol version a header carrying this opcode must have.
    pub fn version(self) -> u8 {
        match self.protocol() {
            Protocol::Client => CLIENT_VERSION,
            Protocol::Peer => PEER_VERSION,
        }
    }
}

/// Result codes carried in response headers. Error responses carry a UTF-8 message as payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
#[non_exhaustive]
pub enum ResultCode {
    Ok = 0,
    /// The sender's epoch is older than the node's: refresh membership and retry. `aux` = node epoch.
    StaleEpoch = 1,
    /// The sender's epoch is newer than the node's: the node has not seen it yet; retry shortly.
    NodeBehind = 2,
    NotFound = 3,
    NotFormatted = 4,
    InvalidRequest = 5,
    NoSpace = 6,
    Io = 7,
    /// A compare-and-swap found another value.
    Conflict = 8,
    ShuttingDown = 9,
    AlreadyFormatted = 10,
    /// The node cannot serve this object yet (recovery still planning or pulling it, a
    /// replica not answering, fewer live owners than `min-copies`); retry shortly.
    Busy = 11,
    /// `PeerWrite`: the replica's copy is not at the write's base version; the primary sends
    /// the whole object instead (`PeerPut`).
    Diverged = 12,
    /// The copy on this node failed its checksum: nothing of it is served, and the node
    /// restores it from another replica; read another replica.
    Corrupt = 13,
    /// The node's disk failed past its error limit (`sheep --io-error-limit`): it left the
    /// cluster and serves no object I/O. Refresh the view and use the other replicas.
    Fenced = 16,
    /// The connection has not proved it holds the cluster key (no handshake, a wrong key, or
    /// the node has no key yet); the node closes it after this answer.
    Unauthenticated = 14,
    /// A limit of the node was reached (connections, requests or bytes in flight); the
    /// message names it.
    LimitReached = 15,
}

impl ResultCode {
    pub fn from_u16(v: u16) -> Option<ResultCode> {
        use ResultCode::*;
        Some(match v {
            0 => Ok,
            1 => StaleEpoch,
            2 => NodeBehind,
            3 => NotFound,
            4 => NotFormatted,
            5 => InvalidRequest,
            6 => NoSpace,
            7 => Io,
            8 => Conflict,
            9 => ShuttingDown,
            10 => AlreadyFormatted,
            11 => Busy,
            12 => Diverged,
            13 => Corrupt,
            16 => Fenced,
            14 => Unauthenticated,
            15 => LimitReached,
            _ => return None,
        })
    }
}

/// The fixed frame header (see the module doc for its layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub opcode: Opcode,
    pub flags: u16,
    /// Raw result code; see [`Header::result_code`].
    pub result: u16,
    pub epoch: u32,
    pub payload_len: u32,
    pub req_id: u64,
    pub oid: u64,
    pub offset: u64,
    /// Bytes to read or write within the object.
    pub length: u32,
    /// Opcode-specific (see docs/wire.md).
    pub aux: u32,
}

/// Why a frame was refused. The connection it came on is closed.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    #[error("bad magic {0:#06x} (expected {MAGIC:#06x})")]
    BadMagic(u16),
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    #[error("protocol version {got} for opcode {opcode:?}, expected {want}")]
    BadVersion { opcode: Opcode, got: u8, want: u8 },
    #[error("payload of {0} bytes is over the limit of {MAX_PAYLOAD}")]
    TooLong(u32),
    #[error("frame truncated: connection closed after {0} bytes of it")]
    Truncated(usize),
    #[error("i/o error on the connection: {0}")]
    Io(String),
}

impl Header {
    /// A request header for `opcode` with the version of its protocol.
    pub fn request(opcode: Opcode, req_id: u64, epoch: u32) -> Header {
        Header {
            version: opcode.version(),
            opcode,
            flags: 0,
            result: 0,
            epoch,
            payload_len: 0,
            req_id,
            oid: 0,
            offset: 0,
            length: 0,
            aux: 0,
        }
    }

    /// The response header to this request.
    pub fn response(&self, result: ResultCode, epoch: u32) -> Header {
        Header {
            flags: self.flags | FLAG_RESPONSE,
            result: result as u16,
            epoch,
            payload_len: 0,
            aux: 0,
            ..*self
        }
    }

    pub fn is_response(&self) -> bool {
        self.flags & FLAG_RESPONSE != 0
    }

    /// The result code; an unknown code from a newer peer reads as [`ResultCode::Io`].
    pub fn result_code(&self) -> ResultCode {
        ResultCode::from_u16(self.result).unwrap_or(ResultCode::Io)
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&MAGIC.to_be_bytes());
        b[2] = self.version;
        b[3] = self.opcode as u8;
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.result.to_be_bytes());
        b[8..12].copy_from_slice(&self.epoch.to_be_bytes());
        b[12..16].copy_from_slice(&self.payload_len.to_be_bytes());
        b[16..24].copy_from_slice(&self.req_id.to_be_bytes());
        b[24..32].copy_from_slice(&self.oid.to_be_bytes());
        b[32..40].copy_from_slice(&self.offset.to_be_bytes());
        b[40..44].copy_from_slice(&self.length.to_be_bytes());
        b[44..48].copy_from_slice(&self.aux.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let u16_at = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        let magic = u16_at(0);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let opcode = Opcode::from_u8(b[3]).ok_or(FrameError::UnknownOpcode(b[3]))?;
        let version = b[2];
        if version != opcode.version() {
            return Err(FrameError::BadVersion {
                opcode,
                got: version,
                want: opcode.version(),
            });
        }
        let payload_len = u32_at(12);
        if payload_len > MAX_PAYLOAD {
            return Err(FrameError::TooLong(payload_len));
        }
        Ok(Header {
            version,
            opcode,
            flags: u16_at(4),
            result: u16_at(6),
            epoch: u32_at(8),
            payload_len,
            req_id: u64_at(16),
            oid: u64_at(24),
            offset: u64_at(32),
            length: u32_at(40),
            aux: u32_at(44),
        })
    }
}

/// A header and its payload.
#[derive(Debug, Clone)]
pub struct Frame {
    pub header: Header,
    pub payload: Bytes,
}

impl Frame {
    /// The payload as an error message (for error responses).
    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.payload).into_owned()
    }
}

fn io_err(e: std::io::Error) -> FrameError {
    FrameError::Io(e.to_string())
}

/// Reads one frame. `Ok(None)` is a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, FrameError> {
    read_frame_into(r, false).await
}

/// [`read_frame`], with payloads of a page or more (object data) received into pooled,
/// page-aligned buffers ([`crate::pagebuf`]). For the client's connections, which receive
/// object data for its cache; a node's receive path keeps plain buffers (aligned ones made
/// `cachectl flush`, 4 MiB writes, about a quarter slower there).
pub async fn read_frame_aligned<R: AsyncRead + Unpin>(
    r: &mut R,
) -> Result<Option<Frame>, FrameError> {
    read_frame_into(r, true).await
}

async fn read_frame_into<R: AsyncRead + Unpin>(
    r: &mut R,
    aligned: bool,
) -> Result<Option<Frame>, FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut hb[got..]).await.map_err(io_err)?;
        if n == 0 {
            return if got == 0 {
                Ok(None)
            } else {
                Err(FrameError::Truncated(got))
            };
        }
        got += n;
    }
    let header = Header::decode(&hb)?;
    // Read into uninitialised capacity: no zeroing of up to 64 MiB per frame.
    let want = header.payload_len as usize;
    let payload = if aligned && want >= PAGE {
        let mut buf = PageBuf::with_capacity(want);
        read_payload(r, &mut buf, want).await?;
        buf.freeze()
    } else {
        let mut buf = BytesMut::with_capacity(want);
        read_payload(r, &mut buf, want).await?;
        buf.freeze()
    };
    Ok(Some(Frame { header, payload }))
}

async fn read_payload<R: AsyncRead + Unpin, B: BufMut>(
    r: &mut R,
    buf: &mut B,
    want: usize,
) -> Result<(), FrameError> {
    let mut got = 0;
    while got < want {
        let mut limited = (&mut *r).take((want - got) as u64);
        let n = limited.read_buf(buf).await.map_err(io_err)?;
        if n == 0 {
            return Err(FrameError::Truncated(HEADER_LEN + got));
        }
        got += n;
    }
    Ok(())
}

/// Writes one frame; `payload_len` is set from the payload. Does not flush.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &Header,
    payload: &[u8],
) -> std::io::Result<()> {
    write_frame_parts(w, header, &[payload]).await
}

/// [`write_frame`] with the payload given in pieces, written one after the other.
pub async fn write_frame_parts<W: AsyncWrite + Unpin>(
    w: &mut W,
    header: &Header,
    parts: &[&[u8]],
) -> std::io::Result<()> {
    let mut h = *header;
    h.payload_len = parts.iter().map(|p| p.len()).sum::<usize>() as u32;
    w.write_all(&h.encode()).await?;
    for p in parts.iter().filter(|p| !p.is_empty()) {
        w.write_all(p).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
