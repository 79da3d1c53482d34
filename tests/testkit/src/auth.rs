//! The cluster key of this test process: one key file, made on first use (mode 0600, in a
//! private temporary directory, removed when the process exits), that every `sheep`, `dog`
//! and `sheepfs` testkit starts is given through `SHEEP_KEY_FILE`. A test that wants another
//! key gives its own `--key-file`, which wins over the environment.

use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The environment variable `sheep`, `dog` and `sheepfs` read their key file from.
pub const KEY_ENV: &str = "SHEEP_KEY_FILE";

static KEY_FILE: OnceLock<PathBuf> = OnceLock::new();
static KEY_DIR: OnceLock<PathBuf> = OnceLock::new();

/// This process's key file (made on first use).
pub fn key_file() -> &'static Path {
    KEY_FILE.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("testkit-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .expect("making the test process's key directory");
        let path = dir.join("cluster.key");
        write_new_key(&path).expect("writing the test process's cluster key");
        let _ = KEY_DIR.set(dir);
        // SAFETY: registering a plain function with no arguments.
        unsafe { libc::atexit(remove_key_dir) };
        path
    })
}

extern "C" fn remove_key_dir() {
    if let Some(dir) = KEY_DIR.get() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Writes a new random key (64 hex digits) to `path`, mode 0600; never overwrites.
pub fn write_new_key(path: &Path) -> std::io::Result<()> {
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut key)?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    writeln!(f, "{hex}")?;
    f.sync_all()
}

/// Gives `cmd` this process's key file.
pub fn with_key(cmd: &mut Command) -> &mut Command {
    cmd.env(KEY_ENV, key_file())
}

/// Client options for an in-process client of testkit's clusters: this process's key.
pub fn client_options() -> objstore_client::ClientOptions {
    objstore_client::ClientOptions {
        key: Some(std::sync::Arc::new(objstore_proto::auth::KeyFile::new(
            key_file(),
        ))),
        ..Default::default()
    }
}

/// A plain TCP connection to a node that has passed the handshake with the keys in `key`
/// (docs/wire.md), for tests that then send raw frames.
pub fn connect_with(addr: &str, key: &Path) -> std::io::Result<std::net::TcpStream> {
    use objstore_proto::auth::{KeyFile, Nonce, Role, KEY_LEN};
    use objstore_proto::frame::{Header, Opcode, ResultCode, HEADER_LEN};
    let bad = |what: String| std::io::Error::new(std::io::ErrorKind::PermissionDenied, what);
    let keys = KeyFile::new(key).keys().map_err(|e| bad(e.to_string()))?;
    let mine = Nonce::random().map_err(|e| bad(e.to_string()))?;
    let mut s = std::net::TcpStream::connect(addr)?;
    let mut hello = Header::request(Opcode::AuthHello, 0, 0);
    hello.payload_len = KEY_LEN as u32;
    s.write_all(&hello.encode())?;
    s.write_all(&mine.0)?;
    let mut answer = [0u8; HEADER_LEN + 2 * KEY_LEN];
    s.read_exact(&mut answer[..HEADER_LEN])?;
    let h =
        Header::decode(answer[..HEADER_LEN].try_into().unwrap()).map_err(|e| bad(e.to_string()))?;
    if h.result_code() != ResultCode::Ok || h.payload_len as usize != 2 * KEY_LEN {
        return Err(bad(format!("hello answered {:?}", h.result_code())));
    }
    s.read_exact(&mut answer[HEADER_LEN..])?;
    let theirs = Nonce(answer[HEADER_LEN..HEADER_LEN + KEY_LEN].try_into().unwrap());
    if !keys.accepts(
        &answer[HEADER_LEN + KEY_LEN..],
        Role::Acceptor,
        &mine,
        &theirs,
    ) {
        return Err(bad("the node's proof matches none of our keys".into()));
    }
    let mut proof = Header::request(Opcode::AuthProof, 1, 0);
    proof.payload_len = KEY_LEN as u32;
    s.write_all(&proof.encode())?;
    s.write_all(&keys.prove(Role::Initiator, &mine, &theirs))?;
    let mut done = [0u8; HEADER_LEN];
    s.read_exact(&mut done)?;
    let h = Header::decode(&done).map_err(|e| bad(e.to_string()))?;
    if h.result_code() != ResultCode::Ok {
        return Err(bad(format!("proof answered {:?}", h.result_code())));
    }
    Ok(s)
}

/// [`connect_with`] this process's key.
pub fn connect(addr: &str) -> std::io::Result<std::net::TcpStream> {
    connect_with(addr, key_file())
}
