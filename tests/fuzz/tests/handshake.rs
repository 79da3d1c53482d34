//! Fuzz target `handshake`: what a node reads from a connection before it has proved the
//! cluster key (issue 25): each input is read as the first frames of a connection
//! (`read_small_frame`, which never reads past a small payload) and checked as a proof, and,
//! when it is text, parsed as a key file. See the crate documentation.

use std::path::Path;

use fuzz_targets::frames::frame_bytes;
use fuzz_targets::{config, inputs};
use objstore_client::transport::handshake::{read_small_frame, MAX_HANDSHAKE_PAYLOAD};
use objstore_proto::auth::{Key, Keys, Nonce, Role, KEY_LEN};
use objstore_proto::frame::{FrameError, Header, Opcode, ResultCode, HEADER_LEN};
use proptest::prelude::*;

const TARGET: &str = "handshake";

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut r = bytes;
    let mut used = 0;
    loop {
        match rt.block_on(read_small_frame(&mut r)) {
            Ok(f) => {
                prop_assert!(f.header.payload_len <= MAX_HANDSHAKE_PAYLOAD);
                prop_assert_eq!(f.payload.len(), f.header.payload_len as usize);
                prop_assert_eq!(&f.header.encode()[..], &bytes[used..used + HEADER_LEN]);
                used += HEADER_LEN + f.payload.len();
                prop_assert_eq!(r.len(), bytes.len() - used, "read no byte past the frame");
            }
            Err(FrameError::TooLong(n)) => {
                prop_assert!(n > MAX_HANDSHAKE_PAYLOAD);
                // Refused on the header alone: the payload is never read.
                prop_assert_eq!(r.len(), bytes.len() - used - HEADER_LEN);
                break;
            }
            Err(_) => break,
        }
    }
    // A proof of any length and content is refused unless it is the one the key makes.
    let keys = Keys::new(Key::from_bytes([7; KEY_LEN]));
    let (ni, na) = (Nonce([1; KEY_LEN]), Nonce([2; KEY_LEN]));
    let good = keys.prove(Role::Initiator, &ni, &na);
    prop_assert_eq!(
        keys.accepts(bytes, Role::Initiator, &ni, &na),
        bytes == good
    );
    if let Ok(text) = std::str::from_utf8(bytes) {
        if let Ok(k) = Keys::parse(Path::new("fuzz.key"), text) {
            prop_assert!(!k.all().is_empty() && k.all().len() <= 2);
            for key in k.all() {
                prop_assert_eq!(&Key::from_hex(&key.to_hex()).unwrap(), key);
            }
        }
    }
    Ok(())
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let hello = |nonce: &[u8]| {
        let mut h = Header::request(Opcode::AuthHello, 1, 0);
        h.oid = 0;
        frame_bytes(h, nonce)
    };
    let answer = frame_bytes(
        Header::request(Opcode::AuthHello, 1, 0).response(ResultCode::Ok, 5),
        &[0x42; 2 * KEY_LEN],
    );
    let proof = frame_bytes(Header::request(Opcode::AuthProof, 2, 0), &[0x17; KEY_LEN]);
    let refused = frame_bytes(
        Header::request(Opcode::ReadObj, 1, 0).response(ResultCode::Unauthenticated, 5),
        b"the connection has not proved it holds the cluster key",
    );
    let list: [(&str, Vec<u8>); 6] = [
        ("hello.bin", hello(&[0x11; KEY_LEN])),
        (
            "hello+proof.bin",
            [hello(&[0x22; KEY_LEN]), proof.clone()].concat(),
        ),
        ("answer.bin", answer),
        ("refused.bin", refused),
        (
            "one-key.txt",
            format!("{}\n", "ab".repeat(KEY_LEN)).into_bytes(),
        ),
        (
            "rotation.txt",
            format!(
                "# new key first, old key until every node has the new one\n{}\n\n{}\n",
                "0f".repeat(KEY_LEN),
                "e1".repeat(KEY_LEN)
            )
            .into_bytes(),
        ),
    ];
    list.into_iter().map(|(n, b)| (n.to_string(), b)).collect()
}

#[test]
fn seeds_are_in_the_corpus() {
    fuzz_targets::check_seeds_pass(TARGET, &seeds(), |b| {
        if b.starts_with(b"#") || b.first().is_some_and(u8::is_ascii_hexdigit) {
            let text = std::str::from_utf8(b).unwrap();
            prop_assert!(
                Keys::parse(Path::new("seed.key"), text).is_ok(),
                "a key file seed parses"
            );
        }
        check(b)
    });
}

proptest! {
    #![proptest_config(config())]
    #[test]
    fn handshake(bytes in inputs(TARGET)) {
        check(&bytes)?;
    }
}
