//! One round trip on the cache's control socket (see [`cache_control`]): connect, write one
//! JSON request line, read [`Response::Progress`] lines until the final `ok` or `error` line.
//!
//! Every failure is an [`Error`] whose `Display` is one line meant for the user.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cache_control::{CacheMode, CacheStats, Reply, Request, Response, Switched, SOCKET_NAME};
use objstore_proto::size::format_size;

/// How long a command that never pushes dirty data may take to answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the control socket is, and how the user named it (for messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub socket: PathBuf,
    /// The cache directory, when the socket was found through `--cache-dir`.
    pub dir: Option<PathBuf>,
}

impl Target {
    /// The socket `DIR/control.sock` of a cache directory.
    pub fn cache_dir(dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        Target {
            socket: dir.join(SOCKET_NAME),
            dir: Some(dir),
        }
    }

    /// A socket named directly.
    pub fn socket(path: impl Into<PathBuf>) -> Self {
        Target {
            socket: path.into(),
            dir: None,
        }
    }
}

/// Why a round trip failed.
#[derive(Debug)]
pub enum Error {
    /// The socket file does not exist.
    NoSocket(Target),
    /// The socket file exists but nobody listens on it (a sheepfs that died).
    Refused(Target),
    /// The path exists but is not a socket.
    NotASocket(Target),
    /// The socket is 0600 and we are not its owner.
    PermissionDenied(Target),
    /// Any other failure to connect, write or read.
    Io(Target, io::Error),
    /// No line within the read timeout.
    Timeout(Target, Duration),
    /// A flush given a time limit (`cachectl flush --timeout`) was not done within it;
    /// `progress` is the last progress line seen.
    FlushTimeout {
        limit: Duration,
        progress: Option<(u64, u64)>,
    },
    /// The connection ended before the final line; `progress` is the last progress line seen.
    Closed {
        target: Target,
        progress: Option<(u64, u64)>,
    },
    /// A line that is not a [`Response`].
    BadLine {
        target: Target,
        line: String,
        err: serde_json::Error,
    },
    /// The final line was `{"error": ...}`: sheepfs's own message.
    Server(String),
    /// The final line was `ok`, but not the reply this command expects (shown as JSON).
    Unexpected { cmd: &'static str, reply: String },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoSocket(Target {
                socket,
                dir: Some(dir),
            }) => write!(
                f,
                "no sheepfs is serving the cache at {}: {} does not exist",
                dir.display(),
                socket.display()
            ),
            Error::NoSocket(Target { socket, dir: None }) => write!(
                f,
                "no sheepfs is serving a cache on {}: it does not exist",
                socket.display()
            ),
            Error::Refused(t) => write!(
                f,
                "connection refused on {}: the socket exists but no sheepfs listens on it \
                 (the sheepfs that served this cache has died; mount it again)",
                t.socket.display()
            ),
            Error::NotASocket(t) => write!(
                f,
                "{} is not a socket: is this a sheepfs cache directory?",
                t.socket.display()
            ),
            Error::PermissionDenied(t) => write!(
                f,
                "permission denied on {}: the control socket is 0600; run cachectl as the user \
                 who mounted sheepfs",
                t.socket.display()
            ),
            Error::Io(t, e) => write!(f, "talking to sheepfs on {}: {e}", t.socket.display()),
            Error::Timeout(t, d) => write!(
                f,
                "no answer from sheepfs on {} within {}s",
                t.socket.display(),
                d.as_secs_f64()
            ),
            Error::FlushTimeout { limit, progress } => {
                let so_far = match progress {
                    Some((pushed, total)) => format!(
                        " (pushed {} of {} so far)",
                        format_size(*pushed),
                        format_size(*total)
                    ),
                    None => String::new(),
                };
                write!(
                    f,
                    "flush not done within {}{so_far}: the data not pushed yet stays dirty in \
                     the cache; sheepfs goes on with this flush, and the background flusher \
                     retries what fails",
                    objstore_proto::duration::format_duration(*limit)
                )
            }
            Error::Closed {
                target,
                progress: None,
            } => write!(
                f,
                "sheepfs closed the connection on {} before answering (did it crash?)",
                target.socket.display()
            ),
            Error::Closed {
                target,
                progress: Some((pushed, total)),
            } => write!(
                f,
                "sheepfs closed the connection on {} before the flush finished, after pushing \
                 {} of {} (did it crash?)",
                target.socket.display(),
                format_size(*pushed),
                format_size(*total)
            ),
            Error::BadLine { target, line, err } => {
                let mut shown: String = line.chars().take(200).collect();
                if shown.len() < line.len() {
                    shown.push_str("...");
                }
                write!(
                    f,
                    "unexpected line from sheepfs on {} ({err}): {shown}",
                    target.socket.display()
                )
            }
            Error::Server(msg) => f.write_str(msg),
            Error::Unexpected { cmd, reply } => {
                write!(
                    f,
                    "sheepfs answered '{cmd}' with an unexpected reply: {reply}"
                )
            }
        }
    }
}

impl std::error::Error for Error {}

/// Maps a failed `connect` to the error the user should see.
pub fn connect_error(target: &Target, err: io::Error) -> Error {
    match err.kind() {
        io::ErrorKind::NotFound => Error::NoSocket(target.clone()),
        io::ErrorKind::PermissionDenied => Error::PermissionDenied(target.clone()),
        io::ErrorKind::ConnectionRefused => match std::fs::metadata(&target.socket) {
            Ok(m) if !m.file_type().is_socket() => Error::NotASocket(target.clone()),
            _ => Error::Refused(target.clone()),
        },
        _ => Error::Io(target.clone(), err),
    }
}

/// Maps a failed read or write on a connected socket.
fn io_error(target: &Target, err: io::Error, timeout: Option<Duration>) -> Error {
    match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            Error::Timeout(target.clone(), timeout.unwrap_or_default())
        }
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => Error::Closed {
            target: target.clone(),
            progress: None,
        },
        _ => Error::Io(target.clone(), err),
    }
}

/// Whether a request may push dirty data to the cluster before answering, and so may
/// legitimately take long: those get no read timeout.
pub fn may_push(req: &Request) -> bool {
    match req {
        Request::Stats { .. } => false,
        Request::Evict { discard_dirty, .. } => !discard_dirty,
        // Leaving writeback flushes first; shrinking may have to push dirty data to make room.
        Request::Flush { .. } | Request::Mode { .. } | Request::Resize { .. } => true,
        // A snapshot flushes first; both wait for the VDI's requests in flight.
        Request::Snapshot { .. } | Request::Rollback { .. } => true,
    }
}

fn unexpected(cmd: &'static str, reply: &Reply) -> Error {
    Error::Unexpected {
        cmd,
        reply: serde_json::to_string(reply).unwrap_or_else(|_| format!("{reply:?}")),
    }
}

/// A client of one cache's control socket. Each call is one connection.
#[derive(Debug, Clone)]
pub struct Client {
    pub target: Target,
    /// Read timeout for requests that never push dirty data (see [`may_push`]).
    pub timeout: Duration,
}

impl Client {
    pub fn new(target: Target) -> Self {
        Client {
            target,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Sends `req` and returns the final reply; `progress(pushed, total)` is called for every
    /// progress line before it.
    pub fn call(&self, req: &Request, progress: &mut dyn FnMut(u64, u64)) -> Result<Reply, Error> {
        self.call_within(req, progress, None)
    }

    /// [`Client::call`], failing with [`Error::FlushTimeout`] unless the final reply comes
    /// within `limit`.
    pub fn call_within(
        &self,
        req: &Request,
        progress: &mut dyn FnMut(u64, u64),
        limit: Option<Duration>,
    ) -> Result<Reply, Error> {
        let deadline = limit.map(|l| (l, Instant::now() + l));
        let t = &self.target;
        let stream = UnixStream::connect(&t.socket).map_err(|e| connect_error(t, e))?;
        let timeout = (!may_push(req)).then_some(self.timeout);
        stream
            .set_read_timeout(timeout)
            .and_then(|()| stream.set_write_timeout(Some(self.timeout)))
            .map_err(|e| Error::Io(t.clone(), e))?;
        let mut line = serde_json::to_string(req).expect("requests serialize");
        line.push('\n');
        (&stream)
            .write_all(line.as_bytes())
            .map_err(|e| io_error(t, e, Some(self.timeout)))?;

        let mut reader = BufReader::new(&stream);
        let mut last = None;
        let mut buf = String::new();
        loop {
            buf.clear();
            if let Some((limit, at)) = deadline {
                let left = at.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::FlushTimeout {
                        limit,
                        progress: last,
                    });
                }
                let wait = timeout.map_or(left, |t| t.min(left));
                stream
                    .set_read_timeout(Some(wait))
                    .map_err(|e| Error::Io(t.clone(), e))?;
            }
            let n = reader
                .read_line(&mut buf)
                .map_err(|e| match io_error(t, e, timeout) {
                    Error::Timeout(..) if deadline.is_some_and(|(_, at)| Instant::now() >= at) => {
                        Error::FlushTimeout {
                            limit: deadline.unwrap().0,
                            progress: last,
                        }
                    }
                    Error::Closed { target, .. } => Error::Closed {
                        target,
                        progress: last,
                    },
                    other => other,
                })?;
            if n == 0 || !buf.ends_with('\n') {
                // EOF, or a last line cut off by it.
                return Err(Error::Closed {
                    target: t.clone(),
                    progress: last,
                });
            }
            let text = buf.trim();
            if text.is_empty() {
                continue;
            }
            match serde_json::from_str::<Response>(text) {
                Ok(Response::Progress { pushed, total }) => {
                    last = Some((pushed, total));
                    progress(pushed, total);
                }
                Ok(Response::Ok(reply)) => return Ok(reply),
                Ok(Response::Error(msg)) => return Err(Error::Server(msg)),
                Err(err) => {
                    return Err(Error::BadLine {
                        target: t.clone(),
                        line: text.to_string(),
                        err,
                    })
                }
            }
        }
    }

    pub fn stats(&self, vdi: Option<String>) -> Result<CacheStats, Error> {
        match self.call(&Request::Stats { vdi }, &mut |_, _| {})? {
            Reply::Stats(s) => Ok(s),
            reply => Err(unexpected("stats", &reply)),
        }
    }

    /// Returns the bytes flushed; fails with [`Error::FlushTimeout`] if that takes longer
    /// than `limit`.
    pub fn flush(
        &self,
        vdi: Option<String>,
        progress: &mut dyn FnMut(u64, u64),
        limit: Option<Duration>,
    ) -> Result<u64, Error> {
        match self.call_within(&Request::Flush { vdi }, progress, limit)? {
            Reply::Flushed { bytes } => Ok(bytes),
            reply => Err(unexpected("flush", &reply)),
        }
    }

    /// Returns (bytes evicted, dirty bytes discarded).
    pub fn evict(&self, vdi: Option<String>, discard_dirty: bool) -> Result<(u64, u64), Error> {
        let req = Request::Evict { vdi, discard_dirty };
        match self.call(&req, &mut |_, _| {})? {
            Reply::Evicted {
                bytes,
                discarded_dirty,
            } => Ok((bytes, discarded_dirty)),
            reply => Err(unexpected("evict", &reply)),
        }
    }

    /// Returns the new size.
    pub fn resize(&self, size: u64) -> Result<u64, Error> {
        match self.call(&Request::Resize { size }, &mut |_, _| {})? {
            Reply::Resized { size } => Ok(size),
            reply => Err(unexpected("resize", &reply)),
        }
    }

    /// Returns the VDI, its new mode, and whether it is attached to the cache (None: sheepfs
    /// did not say), as sheepfs reports them.
    pub fn mode(
        &self,
        vdi: String,
        mode: CacheMode,
    ) -> Result<(String, CacheMode, Option<bool>), Error> {
        match self.call(&Request::Mode { vdi, mode }, &mut |_, _| {})? {
            Reply::Mode {
                vdi,
                mode,
                attached,
            } => Ok((vdi, mode, attached)),
            reply => Err(unexpected("mode", &reply)),
        }
    }
}

impl Client {
    /// Takes snapshot `VDI@TAG` through the mount (see [`Request::Snapshot`]).
    pub fn snapshot(&self, vdi: String, tag: Option<String>) -> Result<Switched, Error> {
        match self.call(&Request::Snapshot { vdi, tag }, &mut |_, _| {})? {
            Reply::Snapshot(s) => Ok(s),
            reply => Err(unexpected("snapshot", &reply)),
        }
    }

    /// Rolls a VDI back to `NAME@TAG` through the mount (see [`Request::Rollback`]).
    pub fn rollback(&self, snapshot: String) -> Result<Switched, Error> {
        match self.call(&Request::Rollback { snapshot }, &mut |_, _| {})? {
            Reply::Rollback(s) => Ok(s),
            reply => Err(unexpected("rollback", &reply)),
        }
    }
}

/// The dirty bytes an evict of `vdi` (or of everything) would concern, from `stats`.
pub fn dirty_of(stats: &CacheStats, vdi: Option<&str>) -> u64 {
    match vdi {
        None => stats.dirty,
        Some(name) => stats
            .vdis
            .iter()
            .find(|v| v.name == name)
            .map(|v| v.dirty)
            .unwrap_or(stats.total.dirty),
    }
}

#[cfg(test)]
mod tests;
