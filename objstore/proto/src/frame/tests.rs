//! Golden bytes of every frame, field by field, and decoder properties.

use std::pin::Pin;
use std::task::{Context, Poll};

use proptest::prelude::*;
use tokio::io::ReadBuf;

use super::*;

/// A `WriteObj` request: 512 bytes at offset 4096 of data object 7 of VDI 0xabcdef.
fn golden_request() -> Header {
    Header {
        version: CLIENT_VERSION,
        opcode: Opcode::WriteObj,
        flags: 0,
        result: 0,
        epoch: 3,
        payload_len: 512,
        req_id: 7,
        oid: 0x00ab_cdef_0000_0007,
        offset: 4096,
        length: 512,
        aux: 0,
    }
}

#[rustfmt::skip]
const GOLDEN_REQUEST: [u8; HEADER_LEN] = [
    0x53, 0x48,                                     //  0 magic "SH"
    0x02,                                           //  2 version (client protocol 2)
    0x02,                                           //  3 opcode WriteObj
    0x00, 0x00,                                     //  4 flags: none (a request)
    0x00, 0x00,                                     //  6 result: 0 in requests
    0x00, 0x00, 0x00, 0x03,                         //  8 epoch 3
    0x00, 0x00, 0x02, 0x00,                         // 12 payload_len 512
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, // 16 req_id 7
    0x00, 0xab, 0xcd, 0xef, 0x00, 0x00, 0x00, 0x07, // 24 oid: VDI 0xabcdef, index 7
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // 32 offset 4096
    0x00, 0x00, 0x02, 0x00,                         // 40 length 512
    0x00, 0x00, 0x00, 0x00,                         // 44 aux 0
];

/// The request a `StaleEpoch` answer is given to: read 4 KiB at 8 KiB of VDI 0xabcdef's
/// inode, sent at epoch 8.
fn golden_read() -> Header {
    let mut h = Header::request(Opcode::ReadObj, 0x0123_4567_89ab_cdef, 8);
    h.oid = 0x80ab_cdef_0000_0000;
    h.offset = 0x2000;
    h.length = 0x1000;
    h
}

const STALE_MESSAGE: &str = "request epoch 8 is older than the node's 9";

#[rustfmt::skip]
const GOLDEN_RESPONSE: [u8; HEADER_LEN] = [
    0x53, 0x48,                                     //  0 magic "SH"
    0x02,                                           //  2 version (echoed: client protocol 2)
    0x01,                                           //  3 opcode ReadObj (echoed)
    0x80, 0x00,                                     //  4 flags: FLAG_RESPONSE
    0x00, 0x01,                                     //  6 result 1 = StaleEpoch
    0x00, 0x00, 0x00, 0x09,                         //  8 epoch 9 (the node's)
    0x00, 0x00, 0x00, 0x2a,                         // 12 payload_len 42 (the message)
    0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, // 16 req_id (echoed)
    0x80, 0xab, 0xcd, 0xef, 0x00, 0x00, 0x00, 0x00, // 24 oid: inode of VDI 0xabcdef (echoed)
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, // 32 offset 8192 (echoed)
    0x00, 0x00, 0x10, 0x00,                         // 40 length 4096 (echoed)
    0x00, 0x00, 0x00, 0x09,                         // 44 aux 9 (the node's epoch)
];

fn golden_response() -> Header {
    let mut h = golden_read().response(ResultCode::StaleEpoch, 9);
    h.aux = 9;
    h.payload_len = STALE_MESSAGE.len() as u32;
    h
}

fn all_opcodes() -> Vec<Opcode> {
    (0..=u8::MAX).filter_map(Opcode::from_u8).collect()
}

/// Runs a future that never waits (in-memory readers and writers).
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

async fn read_one(mut bytes: &[u8]) -> Result<Option<Frame>, FrameError> {
    read_frame(&mut bytes).await
}

/// Hands out at most `step` bytes per read, to exercise the partial-read loops.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl AsyncRead for Trickle<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let data = self.data;
        let n = self.step.min(data.len()).min(buf.remaining());
        buf.put_slice(&data[..n]);
        self.data = &data[n..];
        Poll::Ready(Ok(()))
    }
}

/// Fails every read.
struct Broken;

impl AsyncRead for Broken {
    fn poll_read(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
        _: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Poll::Ready(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionReset,
            "reset by peer",
        )))
    }
}

/// Every frame read until end of stream or a refusal, and the refusal.
type Outcome = (Vec<(Header, Vec<u8>)>, Option<FrameError>);

async fn read_all<R: AsyncRead + Unpin>(r: &mut R) -> Outcome {
    read_all_with(r, false).await
}

/// Like [`read_all`]; with `aligned`, through [`read_frame_aligned`], whose large payloads
/// must also start on a page.
async fn read_all_with<R: AsyncRead + Unpin>(r: &mut R, aligned: bool) -> Outcome {
    let mut frames = Vec::new();
    loop {
        let next = if aligned {
            read_frame_aligned(r).await
        } else {
            read_frame(r).await
        };
        match next {
            Ok(Some(f)) => {
                if aligned && f.payload.len() >= PAGE {
                    assert_eq!(f.payload.as_ptr() as usize % PAGE, 0);
                }
                frames.push((f.header, f.payload.to_vec()))
            }
            Ok(None) => return (frames, None),
            Err(e) => return (frames, Some(e)),
        }
    }
}

// ---- golden bytes ----

#[test]
fn golden_request_bytes() {
    assert_eq!(golden_request().encode(), GOLDEN_REQUEST);
    assert_eq!(Header::decode(&GOLDEN_REQUEST), Ok(golden_request()));
    let mut h = Header::request(Opcode::WriteObj, 7, 3);
    h.oid = 0x00ab_cdef_0000_0007;
    h.offset = 4096;
    h.length = 512;
    h.payload_len = 512;
    assert_eq!(h, golden_request());
    assert!(!h.is_response());
}

#[test]
fn golden_response_bytes() {
    assert_eq!(STALE_MESSAGE.len(), 0x2a);
    let h = golden_response();
    assert_eq!(h.encode(), GOLDEN_RESPONSE);
    let back = Header::decode(&GOLDEN_RESPONSE).unwrap();
    assert_eq!(back, h);
    assert!(back.is_response());
    assert_eq!(back.result_code(), ResultCode::StaleEpoch);
}

#[tokio::test]
async fn golden_frame_through_write_and_read() {
    let mut h = golden_read().response(ResultCode::StaleEpoch, 9);
    h.aux = 9;
    // write_frame sets payload_len from the payload.
    let mut wire = Vec::new();
    write_frame(&mut wire, &h, STALE_MESSAGE.as_bytes())
        .await
        .unwrap();
    assert_eq!(wire[..HEADER_LEN], GOLDEN_RESPONSE);
    assert_eq!(&wire[HEADER_LEN..], STALE_MESSAGE.as_bytes());

    let mut r = &wire[..];
    let f = read_frame(&mut r).await.unwrap().unwrap();
    assert_eq!(f.header, golden_response());
    assert_eq!(f.message(), STALE_MESSAGE);
    assert!(read_frame(&mut r).await.unwrap().is_none());
}

#[test]
fn response_echoes_the_request() {
    let mut req = golden_request();
    req.flags = 0x0001;
    req.aux = 77;
    let r = req.response(ResultCode::Ok, 12);
    assert_eq!(r.version, req.version);
    assert_eq!(r.opcode, req.opcode);
    assert_eq!(r.flags, 0x8001);
    assert_eq!(r.result, 0);
    assert_eq!(r.epoch, 12);
    assert_eq!(r.payload_len, 0);
    assert_eq!(
        (r.req_id, r.oid, r.offset, r.length, r.aux),
        (req.req_id, req.oid, req.offset, req.length, 0)
    );
}

#[test]
fn opcode_table() {
    use Protocol::*;
    let want = [
        (0x01, Opcode::ReadObj, Client),
        (0x02, Opcode::WriteObj, Client),
        (0x03, Opcode::RemoveObj, Client),
        (0x04, Opcode::Flush, Client),
        (0x05, Opcode::StatObj, Client),
        (0x06, Opcode::CowWrite, Client),
        (0x07, Opcode::FlattenObj, Client),
        (0x10, Opcode::ClusterInfo, Client),
        (0x11, Opcode::Format, Client),
        (0x12, Opcode::KvGet, Client),
        (0x13, Opcode::KvCas, Client),
        (0x14, Opcode::KvList, Client),
        (0x15, Opcode::NodeStatus, Client),
        (0x16, Opcode::LeaseGrant, Client),
        (0x17, Opcode::LeaseKeepalive, Client),
        (0x18, Opcode::LeaseRevoke, Client),
        (0x19, Opcode::KvCasLeased, Client),
        (0x08, Opcode::EcRead, Client),
        (0x09, Opcode::EcWrite, Client),
        (0x0a, Opcode::EcRemove, Client),
        (0x0b, Opcode::EcCheck, Client),
        (0x0c, Opcode::EcStripRead, Client),
        (0x1a, Opcode::NodeStat, Client),
        (0x1b, Opcode::CheckObj, Client),
        (0x1c, Opcode::RepairObj, Client),
        (0x20, Opcode::AuthHello, Client),
        (0x21, Opcode::AuthProof, Client),
        (0x81, Opcode::PeerList, Peer),
        (0x82, Opcode::PeerRead, Peer),
        (0x83, Opcode::PeerStatus, Peer),
        (0x84, Opcode::PeerWrite, Peer),
        (0x85, Opcode::PeerPut, Peer),
        (0x86, Opcode::PeerCow, Peer),
        (0x87, Opcode::PeerDigest, Peer),
        (0x88, Opcode::PeerArcs, Peer),
        (0x89, Opcode::PeerStrip, Peer),
        (0x8a, Opcode::PeerStripRead, Peer),
    ];
    assert_eq!(all_opcodes().len(), want.len());
    for (v, op, proto) in want {
        assert_eq!(Opcode::from_u8(v), Some(op));
        assert_eq!(op as u8, v);
        assert_eq!(op.protocol(), proto);
        let (range, version) = match proto {
            Client => (0x01..=0x3f, CLIENT_VERSION),
            Peer => (0x80..=0xbf, PEER_VERSION),
        };
        assert!(range.contains(&v), "{op:?} outside its protocol's range");
        assert_eq!(op.version(), version);
    }
}

#[test]
fn result_codes() {
    for v in 0..=13u16 {
        assert_eq!(ResultCode::from_u16(v).unwrap() as u16, v);
    }
    assert_eq!(ResultCode::from_u16(13), Some(ResultCode::Corrupt));
    assert_eq!(ResultCode::Corrupt as u16, 13);
    assert_eq!(ResultCode::from_u16(17), None);
    assert_eq!(ResultCode::from_u16(16), Some(ResultCode::Fenced));
    assert_eq!(ResultCode::Fenced as u16, 16);
    for v in [14u16, 15] {
        assert_eq!(ResultCode::from_u16(v).unwrap() as u16, v);
    }
    assert_eq!(ResultCode::from_u16(14), Some(ResultCode::Unauthenticated));
    assert_eq!(ResultCode::from_u16(15), Some(ResultCode::LimitReached));
    let mut h = golden_request().response(ResultCode::Ok, 1);
    h.result = 0xffff;
    assert_eq!(h.result_code(), ResultCode::Io);
}

// ---- refusals ----

/// Object-sized payloads (the property test's are too small to take the aligned path):
/// both readers return the same frames, the aligned one page-aligned; a cut payload is
/// a truncation error either way.
#[tokio::test]
async fn large_payloads_read_alike_and_aligned_through_read_frame_aligned() {
    let mut wire = Vec::new();
    let payloads: Vec<Vec<u8>> = [PAGE, 3 * PAGE + 5, 100]
        .iter()
        .map(|&n| (0..n).map(|i| (i % 251) as u8).collect())
        .collect();
    for p in &payloads {
        let h = golden_read().response(ResultCode::Ok, 0);
        write_frame(&mut wire, &h, p).await.unwrap();
    }
    let plain = read_all(&mut Trickle {
        data: &wire,
        step: 1000,
    })
    .await;
    // read_all_with asserts the alignment of every payload of a page or more.
    let aligned = read_all_with(
        &mut Trickle {
            data: &wire,
            step: 1000,
        },
        true,
    )
    .await;
    assert_eq!(plain, aligned);
    let (frames, err) = aligned;
    assert!(err.is_none());
    let got: Vec<&Vec<u8>> = frames.iter().map(|(_, p)| p).collect();
    assert_eq!(got, payloads.iter().collect::<Vec<_>>());

    let cut = &wire[..HEADER_LEN + PAGE / 2];
    assert_eq!(
        read_frame_aligned(&mut &cut[..]).await.unwrap_err(),
        FrameError::Truncated(cut.len())
    );
}

#[tokio::test]
async fn clean_eof_at_a_frame_boundary() {
    assert!(read_one(&[]).await.unwrap().is_none());
    let mut wire = Vec::new();
    write_frame(&mut wire, &golden_request(), &[0xaa; 512])
        .await
        .unwrap();
    write_frame(&mut wire, &Header::request(Opcode::Flush, 8, 3), &[])
        .await
        .unwrap();
    let mut r = &wire[..];
    let a = read_frame(&mut r).await.unwrap().unwrap();
    assert_eq!(a.header, golden_request());
    assert_eq!(a.payload, vec![0xaa; 512]);
    let b = read_frame(&mut r).await.unwrap().unwrap();
    assert_eq!(b.header.opcode, Opcode::Flush);
    assert!(b.payload.is_empty());
    assert!(read_frame(&mut r).await.unwrap().is_none());
}

#[tokio::test]
async fn refuses_bad_magic() {
    let mut b = GOLDEN_REQUEST;
    b[0] = 0x48;
    b[1] = 0x53;
    assert_eq!(Header::decode(&b), Err(FrameError::BadMagic(0x4853)));
    assert_eq!(
        read_one(&b).await.unwrap_err(),
        FrameError::BadMagic(0x4853)
    );
    // Magic is checked first: an unknown opcode behind it does not change the reason.
    b[3] = 0x00;
    assert_eq!(Header::decode(&b), Err(FrameError::BadMagic(0x4853)));
}

#[tokio::test]
async fn refuses_unknown_opcode() {
    for op in [0x00, 0x0d, 0x3f, 0x40, 0x80, 0x8b, 0xff] {
        let mut b = GOLDEN_REQUEST;
        b[3] = op;
        assert_eq!(
            read_one(&b).await.unwrap_err(),
            FrameError::UnknownOpcode(op)
        );
        // The opcode is checked before the version, which depends on it.
        b[2] = 0x7f;
        assert_eq!(Header::decode(&b), Err(FrameError::UnknownOpcode(op)));
    }
}

#[tokio::test]
async fn refuses_wrong_version_for_a_client_opcode() {
    let mut b = GOLDEN_REQUEST;
    b[2] = CLIENT_VERSION + 1;
    assert_eq!(
        read_one(&b).await.unwrap_err(),
        FrameError::BadVersion {
            opcode: Opcode::WriteObj,
            got: CLIENT_VERSION + 1,
            want: CLIENT_VERSION,
        }
    );
}

#[tokio::test]
async fn refuses_wrong_version_for_a_peer_opcode() {
    let mut b = Header::request(Opcode::PeerList, 1, 4).encode();
    assert_eq!(b[2], PEER_VERSION);
    b[2] = 0;
    assert_eq!(
        read_one(&b).await.unwrap_err(),
        FrameError::BadVersion {
            opcode: Opcode::PeerList,
            got: 0,
            want: PEER_VERSION,
        }
    );
}

#[tokio::test]
async fn refuses_payload_over_the_limit() {
    let mut h = golden_request();
    h.payload_len = MAX_PAYLOAD;
    assert_eq!(Header::decode(&h.encode()), Ok(h));
    for len in [MAX_PAYLOAD + 1, u32::MAX] {
        h.payload_len = len;
        // Refused from the header alone, before any payload is read.
        assert_eq!(
            read_one(&h.encode()).await.unwrap_err(),
            FrameError::TooLong(len)
        );
    }
}

#[tokio::test]
async fn refuses_truncated_header() {
    for n in [1, 2, 20, HEADER_LEN - 1] {
        assert_eq!(
            read_one(&GOLDEN_REQUEST[..n]).await.unwrap_err(),
            FrameError::Truncated(n)
        );
    }
}

#[tokio::test]
async fn refuses_truncated_payload() {
    let mut wire = GOLDEN_REQUEST.to_vec();
    assert_eq!(
        read_one(&wire).await.unwrap_err(),
        FrameError::Truncated(HEADER_LEN)
    );
    wire.extend_from_slice(&[0x55; 511]);
    assert_eq!(
        read_one(&wire).await.unwrap_err(),
        FrameError::Truncated(HEADER_LEN + 511)
    );
    wire.push(0x55);
    assert_eq!(read_one(&wire).await.unwrap().unwrap().payload.len(), 512);
}

#[tokio::test]
async fn reports_io_errors() {
    assert!(matches!(
        read_frame(&mut Broken).await,
        Err(FrameError::Io(m)) if m.contains("reset by peer")
    ));
}

#[tokio::test]
async fn reads_a_frame_in_pieces() {
    let mut wire = GOLDEN_REQUEST.to_vec();
    wire.extend((0..512).map(|i| i as u8));
    let mut r = Trickle {
        data: &wire,
        step: 5,
    };
    let f = read_frame(&mut r).await.unwrap().unwrap();
    assert_eq!(f.header, golden_request());
    assert_eq!(f.payload[..], wire[HEADER_LEN..]);
    assert!(read_frame(&mut r).await.unwrap().is_none());
}

// ---- properties ----

fn any_header() -> impl Strategy<Value = Header> {
    (
        prop::sample::select(all_opcodes()),
        any::<u16>(),
        any::<u16>(),
        any::<u32>(),
        0..=MAX_PAYLOAD,
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            |(opcode, flags, result, epoch, payload_len, req_id, oid, offset, length, aux)| {
                Header {
                    version: opcode.version(),
                    opcode,
                    flags,
                    result,
                    epoch,
                    payload_len,
                    req_id,
                    oid,
                    offset,
                    length,
                    aux,
                }
            },
        )
}

/// 48 bytes: fully random, or with magic, version and opcode made valid and the payload
/// length mostly under the limit, so that decoding also succeeds often.
fn header_bytes() -> impl Strategy<Value = [u8; HEADER_LEN]> {
    (
        prop::collection::vec(any::<u8>(), HEADER_LEN),
        any::<bool>(),
        prop::sample::select(all_opcodes()),
        0u8..=4,
    )
        .prop_map(|(v, fix, op, len_hi)| {
            let mut b: [u8; HEADER_LEN] = v.try_into().unwrap();
            if fix {
                b[0..2].copy_from_slice(&MAGIC.to_be_bytes());
                b[2] = op.version();
                b[3] = op as u8;
                b[12] = len_hi;
            }
            b
        })
}

/// The refusal `decode` must give for `b`, if any, in the order the checks are documented.
fn expected_refusal(b: &[u8; HEADER_LEN]) -> Option<FrameError> {
    let magic = u16::from_be_bytes([b[0], b[1]]);
    if magic != MAGIC {
        return Some(FrameError::BadMagic(magic));
    }
    let Some(opcode) = Opcode::from_u8(b[3]) else {
        return Some(FrameError::UnknownOpcode(b[3]));
    };
    if b[2] != opcode.version() {
        return Some(FrameError::BadVersion {
            opcode,
            got: b[2],
            want: opcode.version(),
        });
    }
    let len = u32::from_be_bytes(b[12..16].try_into().unwrap());
    (len > MAX_PAYLOAD).then_some(FrameError::TooLong(len))
}

/// One well-formed frame with a small payload.
fn frame_bytes() -> impl Strategy<Value = Vec<u8>> {
    (any_header(), prop::collection::vec(any::<u8>(), 0..32)).prop_map(|(mut h, p)| {
        h.payload_len = p.len() as u32;
        let mut v = h.encode().to_vec();
        v.extend(p);
        v
    })
}

/// Random bytes, or well-formed frames followed by junk or cut anywhere.
fn stream_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        (
            prop::collection::vec(frame_bytes(), 0..4),
            prop::collection::vec(any::<u8>(), 0..64),
            any::<prop::sample::Index>(),
            0u8..3,
        )
            .prop_map(|(frames, junk, cut, mode)| {
                let mut v = frames.concat();
                match mode {
                    0 => {}
                    1 => v.extend(junk),
                    _ => v.truncate(cut.index(v.len() + 1)),
                }
                v
            }),
    ]
}

proptest! {
    #[test]
    fn header_round_trips(h in any_header()) {
        let b = h.encode();
        prop_assert_eq!(&b[0..2], &MAGIC.to_be_bytes()[..]);
        prop_assert_eq!(Header::decode(&b), Ok(h));
    }

    #[test]
    fn decode_of_any_bytes(b in header_bytes()) {
        match Header::decode(&b) {
            Ok(h) => {
                prop_assert_eq!(expected_refusal(&b), None);
                prop_assert_eq!(h.encode(), b);
            }
            Err(e) => prop_assert_eq!(Some(e), expected_refusal(&b)),
        }
    }

    #[test]
    fn read_frame_over_any_stream(bytes in stream_bytes(), step in 1usize..64) {
        let (whole, pieces, aligned) = block_on(async {
            let whole = read_all(&mut &bytes[..]).await;
            let pieces = read_all(&mut Trickle { data: &bytes, step }).await;
            let aligned = read_all_with(&mut Trickle { data: &bytes, step }, true).await;
            (whole, pieces, aligned)
        });
        // How the bytes arrive, and into which buffers, does not change what is read.
        prop_assert_eq!(&whole, &pieces);
        prop_assert_eq!(&whole, &aligned);
        let (frames, err) = whole;
        let mut used = 0;
        for (h, p) in &frames {
            prop_assert_eq!(p.len(), h.payload_len as usize);
            prop_assert_eq!(&h.encode()[..], &bytes[used..used + HEADER_LEN]);
            prop_assert_eq!(&p[..], &bytes[used + HEADER_LEN..used + HEADER_LEN + p.len()]);
            used += HEADER_LEN + p.len();
        }
        match err {
            // A clean end is only at a frame boundary after the last byte.
            None => prop_assert_eq!(used, bytes.len()),
            // A truncated frame is the rest of the stream.
            Some(FrameError::Truncated(n)) => {
                prop_assert!(n > 0);
                prop_assert_eq!(used + n, bytes.len());
            }
            Some(FrameError::Io(m)) => prop_assert!(false, "i/o error from a slice: {}", m),
            // Any other refusal comes from a whole header that fails to decode.
            Some(e) => {
                let hb: [u8; HEADER_LEN] = bytes[used..used + HEADER_LEN].try_into().unwrap();
                prop_assert_eq!(Some(e), expected_refusal(&hb));
            }
        }
    }
}
