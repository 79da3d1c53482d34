//! The cluster key and the handshake's proofs.
//!
//! Every TCP connection opens with a mutual challenge–response over a shared cluster key (32
//! random bytes). Neither side ever sends the key: each sends a fresh 32-byte nonce and proves
//! it holds the key with a keyed blake3 hash over both nonces and its role:
//!
//! ```text
//!  proof(role) = blake3::keyed_hash(key, CONTEXT || role || nonce_initiator || nonce_acceptor)
//!  role = b"initiator" (the side that connected) | b"acceptor" (the node that accepted)
//! ```
//!
//! The role keeps one side's proof from being replayed as the other's (a reflection: an
//! attacker handing the node's own proof back to it), and the nonces make every proof good
//! for one connection only. The frames that carry them are in [`crate::frame`]
//! (`AuthHello`, `AuthProof`); docs/wire.md gives their bytes.
//!
//! A key file holds one or two keys, 64 hex digits a line (`#` comments and blank lines
//! allowed). A side proves itself with the first key and accepts a proof made with any: during
//! a rotation every node holds both keys, so old and new keys meet (docs/operations.md).
//! [`KeyFile::keys`] reads the file again whenever it changed (size, modification time or
//! inode), so a node started before its key existed, or whose key file was rotated, picks the
//! new keys up at its next connection.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use thiserror::Error;

/// Bytes of a key, of a nonce and of a proof.
pub const KEY_LEN: usize = 32;
/// Mixed into every proof: a proof for another protocol or version never matches.
pub const CONTEXT: &[u8] = b"sheepstore cluster auth v1";
/// How many keys a key file may hold (the current one, and one more during a rotation).
pub const MAX_KEYS: usize = 2;

/// One cluster key. Its `Debug` never prints it.
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; KEY_LEN]);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(..)")
    }
}

/// Which end of a connection a proof is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The side that opened the connection (a client, or a node talking to a peer).
    Initiator,
    /// The node that accepted it.
    Acceptor,
}

impl Role {
    fn label(self) -> &'static [u8] {
        match self {
            Role::Initiator => b"initiator",
            Role::Acceptor => b"acceptor",
        }
    }
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("cannot read key file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write key file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("key file {path}, line {line}: {reason}")]
    Bad {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("key file {path} holds no key")]
    Empty { path: PathBuf },
    #[error("key file {path} holds {n} keys; it may hold {MAX_KEYS} (the current key, then the one being rotated in or out)")]
    TooMany { path: PathBuf, n: usize },
    #[error("key file {path} is readable or writable by others (mode {mode:04o}): run 'chmod 600 {path}'")]
    Exposed { path: PathBuf, mode: u32 },
    #[error("key file {path} already exists: it is not overwritten")]
    Exists { path: PathBuf },
    #[error("no random bytes from the kernel: {0}")]
    Random(std::io::Error),
}

impl Key {
    /// A new random key.
    pub fn random() -> Result<Key, KeyError> {
        let mut k = [0u8; KEY_LEN];
        fill_random(&mut k)?;
        Ok(Key(k))
    }

    pub fn from_bytes(b: [u8; KEY_LEN]) -> Key {
        Key(b)
    }

    /// The key as 64 lowercase hex digits (what a key file holds).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses 64 hex digits.
    pub fn from_hex(s: &str) -> Result<Key, String> {
        let s = s.trim();
        if s.len() != KEY_LEN * 2 {
            return Err(format!(
                "a key is {} hex digits, this line has {} characters",
                KEY_LEN * 2,
                s.len()
            ));
        }
        let mut k = [0u8; KEY_LEN];
        for (i, byte) in k.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("'{}' is not hex", &s[2 * i..2 * i + 2]))?;
        }
        Ok(Key(k))
    }

    /// This key's proof for `role` on the connection with these nonces.
    pub fn proof(&self, role: Role, initiator: &Nonce, acceptor: &Nonce) -> [u8; KEY_LEN] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(CONTEXT);
        h.update(role.label());
        h.update(&initiator.0);
        h.update(&acceptor.0);
        *h.finalize().as_bytes()
    }
}

/// A connection's random challenge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nonce(pub [u8; KEY_LEN]);

impl Nonce {
    pub fn random() -> Result<Nonce, KeyError> {
        let mut n = [0u8; KEY_LEN];
        fill_random(&mut n)?;
        Ok(Nonce(n))
    }
}

fn fill_random(buf: &mut [u8]) -> Result<(), KeyError> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: the pointer and length describe the unfilled rest of `buf`.
        let n = unsafe {
            libc::getrandom(
                buf[got..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - got,
                0,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(KeyError::Random(e));
        }
        got += n as usize;
    }
    Ok(())
}

/// The keys a side holds: it proves itself with the first and accepts any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys(Vec<Key>);

impl Keys {
    pub fn new(first: Key) -> Keys {
        Keys(vec![first])
    }

    /// The key this side proves itself with.
    pub fn current(&self) -> &Key {
        &self.0[0]
    }

    pub fn all(&self) -> &[Key] {
        &self.0
    }

    /// This side's proof.
    pub fn prove(&self, role: Role, initiator: &Nonce, acceptor: &Nonce) -> [u8; KEY_LEN] {
        self.current().proof(role, initiator, acceptor)
    }

    /// Whether `proof` was made with any of these keys (compared in constant time).
    pub fn accepts(&self, proof: &[u8], role: Role, initiator: &Nonce, acceptor: &Nonce) -> bool {
        let Ok(proof) = <[u8; KEY_LEN]>::try_from(proof) else {
            return false;
        };
        let got = blake3::Hash::from(proof);
        // Every key is tried, so the time does not say which one matched.
        self.0.iter().fold(false, |ok, k| {
            ok | (blake3::Hash::from(k.proof(role, initiator, acceptor)) == got)
        })
    }

    /// Parses a key file's text.
    pub fn parse(path: &Path, text: &str) -> Result<Keys, KeyError> {
        let mut keys = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let k = Key::from_hex(line).map_err(|reason| KeyError::Bad {
                path: path.to_path_buf(),
                line: i + 1,
                reason,
            })?;
            keys.push(k);
        }
        match keys.len() {
            0 => Err(KeyError::Empty {
                path: path.to_path_buf(),
            }),
            n if n > MAX_KEYS => Err(KeyError::TooMany {
                path: path.to_path_buf(),
                n,
            }),
            _ => Ok(Keys(keys)),
        }
    }
}

/// What identifies one version of the file: a change of any of these reads it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    len: u64,
    mtime: i64,
    mtime_nsec: i64,
}

/// A key file, read when first needed and again whenever it changes.
pub struct KeyFile {
    path: PathBuf,
    cached: Mutex<Option<(Stamp, Arc<Keys>)>>,
}

impl fmt::Debug for KeyFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyFile({})", self.path.display())
    }
}

impl KeyFile {
    /// The key file at `path`; nothing is read yet (the file may not exist yet).
    pub fn new(path: impl Into<PathBuf>) -> KeyFile {
        KeyFile {
            path: path.into(),
            cached: Mutex::new(None),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The keys the file holds now. A stat per call; the file is read again only when it
    /// changed. A file that is missing, unreadable, malformed or open to others is an error
    /// (the caller refuses the connection and says why).
    pub fn keys(&self) -> Result<Arc<Keys>, KeyError> {
        let read_err = |source| KeyError::Read {
            path: self.path.clone(),
            source,
        };
        let md = std::fs::metadata(&self.path).map_err(read_err)?;
        let mode = md.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed {
                path: self.path.clone(),
                mode,
            });
        }
        let stamp = Stamp {
            ino: md.ino(),
            len: md.len(),
            mtime: md.mtime(),
            mtime_nsec: md.mtime_nsec(),
        };
        let mut cached = self.cached.lock().unwrap();
        if let Some((s, k)) = &*cached {
            if *s == stamp {
                return Ok(k.clone());
            }
        }
        let text = std::fs::read_to_string(&self.path).map_err(read_err)?;
        let keys = Arc::new(Keys::parse(&self.path, &text)?);
        *cached = Some((stamp, keys.clone()));
        Ok(keys)
    }

    /// Writes a new random key to `path` (mode 0600), refusing to overwrite a file.
    pub fn create(path: &Path) -> Result<Key, KeyError> {
        let key = Key::random()?;
        let write_err = |source: std::io::Error| {
            if source.kind() == std::io::ErrorKind::AlreadyExists {
                KeyError::Exists {
                    path: path.to_path_buf(),
                }
            } else {
                KeyError::Write {
                    path: path.to_path_buf(),
                    source,
                }
            }
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(write_err)?;
        writeln!(f, "{}", key.to_hex())
            .and_then(|_| f.sync_all())
            .map_err(write_err)?;
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(b: u8) -> Key {
        Key([b; KEY_LEN])
    }

    #[test]
    fn proofs_depend_on_key_role_and_both_nonces() {
        let (a, b) = (Nonce([1; 32]), Nonce([2; 32]));
        let p = k(7).proof(Role::Initiator, &a, &b);
        assert_eq!(p, k(7).proof(Role::Initiator, &a, &b));
        assert_ne!(p, k(8).proof(Role::Initiator, &a, &b));
        assert_ne!(p, k(7).proof(Role::Acceptor, &a, &b));
        assert_ne!(p, k(7).proof(Role::Initiator, &b, &a));
        assert_ne!(p, k(7).proof(Role::Initiator, &a, &a));
    }

    #[test]
    fn a_side_proves_with_its_first_key_and_accepts_either() {
        let (a, b) = (Nonce([1; 32]), Nonce([2; 32]));
        let old = Keys(vec![k(1)]);
        let both = Keys(vec![k(2), k(1)]);
        let new = Keys(vec![k(2)]);
        let r = Role::Acceptor;
        assert!(both.accepts(&old.prove(r, &a, &b), r, &a, &b));
        assert!(!old.accepts(&both.prove(r, &a, &b), r, &a, &b));
        assert!(new.accepts(&both.prove(r, &a, &b), r, &a, &b));
        assert!(!new.accepts(&old.prove(r, &a, &b), r, &a, &b));
        assert!(!both.accepts(&[0u8; 31], r, &a, &b));
    }

    #[test]
    fn key_files_parse_with_clear_errors() {
        let p = Path::new("/k");
        let one = format!("# cluster key\n{}\n\n", k(3).to_hex());
        assert_eq!(Keys::parse(p, &one).unwrap().all(), &[k(3)]);
        let two = format!("{}\n{}\n", k(3).to_hex(), k(4).to_hex());
        assert_eq!(Keys::parse(p, &two).unwrap().current(), &k(3));
        let e = Keys::parse(p, "abc\n").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("64 hex digits"), "{e}");
        let e = Keys::parse(p, &"zz".repeat(32)).unwrap_err().to_string();
        assert!(e.contains("not hex"), "{e}");
        assert!(matches!(
            Keys::parse(p, "# none\n"),
            Err(KeyError::Empty { .. })
        ));
        let three = format!("{0}\n{0}\n{0}\n", k(1).to_hex());
        assert!(matches!(
            Keys::parse(p, &three),
            Err(KeyError::TooMany { n: 3, .. })
        ));
        assert_eq!(Key::from_hex(&k(9).to_hex()).unwrap(), k(9));
    }

    #[test]
    fn a_key_file_is_created_owner_only_and_reread_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.key");
        let kf = KeyFile::new(&path);
        assert!(matches!(kf.keys(), Err(KeyError::Read { .. })));
        let key = KeyFile::create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(kf.keys().unwrap().all(), std::slice::from_ref(&key));
        assert!(matches!(
            KeyFile::create(&path),
            Err(KeyError::Exists { .. })
        ));
        // A rotation: a second key appended is seen at the next call.
        let other = Key::random().unwrap();
        let text = format!("{}\n{}\n", other.to_hex(), key.to_hex());
        std::fs::write(&path, text).unwrap();
        assert_eq!(kf.keys().unwrap().all(), &[other, key]);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = kf.keys().unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
    }
}
