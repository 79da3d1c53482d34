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

use cache_control::{CacheMode, CacheStats, Reply, Request, Response, SOCKET_NAME};
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
mod tests {
    use super::*;
    use cache_control::VdiStats;
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;
    use std::thread;

    /// What the fake server does after reading the request line.
    enum Act {
        /// Write these lines (a `\n` is added to each) and close.
        Lines(Vec<String>),
        /// Write these raw bytes and close.
        Raw(&'static [u8]),
        /// Say nothing for this long, then close.
        Stall(Duration),
        /// Write these lines, then say nothing for this long, then close.
        LinesThenStall(Vec<String>, Duration),
    }

    /// A fake sheepfs serving one connection per `acts` entry, in order; every request line
    /// it read is sent on the returned channel.
    fn serve(acts: Vec<Act>) -> (tempfile::TempDir, Target, mpsc::Receiver<String>) {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::cache_dir(dir.path());
        let listener = UnixListener::bind(&target.socket).unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for act in acts {
                let (stream, _) = listener.accept().unwrap();
                let mut reader = BufReader::new(&stream);
                let mut req = String::new();
                reader.read_line(&mut req).unwrap();
                tx.send(req).unwrap();
                let mut w = &stream;
                match act {
                    Act::Lines(lines) => {
                        for l in lines {
                            w.write_all(format!("{l}\n").as_bytes()).unwrap();
                        }
                    }
                    Act::Raw(b) => w.write_all(b).unwrap(),
                    Act::Stall(d) => thread::sleep(d),
                    Act::LinesThenStall(lines, d) => {
                        for l in lines {
                            w.write_all(format!("{l}\n").as_bytes()).unwrap();
                        }
                        thread::sleep(d)
                    }
                }
            }
        });
        (dir, target, rx)
    }

    fn line(r: &Response) -> String {
        serde_json::to_string(r).unwrap()
    }

    fn sample() -> CacheStats {
        CacheStats {
            dir: "/var/cache/sheepfs".into(),
            size: 1 << 30,
            used: 300 << 20,
            dirty: 64 << 20,
            vdis: vec![VdiStats {
                name: "disk0".into(),
                mode: Some(CacheMode::Writeback),
                used: 300 << 20,
                dirty: 48 << 20,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn stats_round_trip() {
        let s = sample();
        let (_d, target, reqs) = serve(vec![Act::Lines(vec![line(&Response::Ok(Reply::Stats(
            s.clone(),
        )))])]);
        let got = Client::new(target).stats(None).unwrap();
        assert_eq!(got, s);
        assert_eq!(reqs.recv().unwrap(), "{\"cmd\":\"stats\",\"vdi\":null}\n");
    }

    #[test]
    fn flush_reports_progress_then_result() {
        let (_d, target, reqs) = serve(vec![Act::Lines(vec![
            line(&Response::Progress {
                pushed: 1 << 20,
                total: 4 << 20,
            }),
            String::new(), // blank lines are ignored
            line(&Response::Progress {
                pushed: 4 << 20,
                total: 4 << 20,
            }),
            line(&Response::Ok(Reply::Flushed { bytes: 4 << 20 })),
        ])]);
        let mut seen = Vec::new();
        let n = Client::new(target)
            .flush(Some("disk0".into()), &mut |p, t| seen.push((p, t)), None)
            .unwrap();
        assert_eq!(n, 4 << 20);
        assert_eq!(seen, vec![(1 << 20, 4 << 20), (4 << 20, 4 << 20)]);
        assert_eq!(
            reqs.recv().unwrap(),
            "{\"cmd\":\"flush\",\"vdi\":\"disk0\"}\n"
        );
    }

    #[test]
    fn error_line_is_the_message() {
        let (_d, target, _r) = serve(vec![Act::Lines(vec![line(&Response::Error(
            "no VDI named 'x' in the cache".into(),
        ))])]);
        let e = Client::new(target)
            .evict(Some("x".into()), false)
            .unwrap_err();
        assert!(matches!(e, Error::Server(_)));
        assert_eq!(e.to_string(), "no VDI named 'x' in the cache");
    }

    #[test]
    fn closed_before_final_line() {
        let (_d, target, _r) = serve(vec![
            Act::Lines(vec![]),
            Act::Lines(vec![line(&Response::Progress {
                pushed: 1 << 20,
                total: 2 << 20,
            })]),
            Act::Raw(b"{\"ok\":{\"flushed\""), // cut mid-line
        ]);
        let c = Client::new(target.clone());
        let e = c.stats(None).unwrap_err();
        assert!(matches!(e, Error::Closed { progress: None, .. }), "{e:?}");
        assert!(e.to_string().contains("closed the connection"), "{e}");
        assert!(e.to_string().contains("control.sock"), "{e}");

        let e = c.flush(None, &mut |_, _| {}, None).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Closed {
                    progress: Some((1048576, 2097152)),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("after pushing 1.0 MiB of 2.0 MiB"));

        let e = c.flush(None, &mut |_, _| {}, None).unwrap_err();
        assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    }

    #[test]
    fn garbage_and_wrong_replies() {
        let (_d, target, _r) = serve(vec![
            Act::Lines(vec!["hello".into()]),
            Act::Lines(vec![line(&Response::Ok(Reply::Resized { size: 1 }))]),
        ]);
        let c = Client::new(target);
        let e = c.stats(None).unwrap_err();
        assert!(matches!(e, Error::BadLine { .. }), "{e:?}");
        assert!(e.to_string().ends_with(": hello"), "{e}");
        let e = c.stats(None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sheepfs answered 'stats' with an unexpected reply: {\"resized\":{\"size\":1}}"
        );
    }

    #[test]
    fn timeout_applies_to_stats_not_flush() {
        let (_d, target, _r) = serve(vec![Act::Stall(Duration::from_secs(2))]);
        let mut c = Client::new(target.clone());
        c.timeout = Duration::from_millis(200);
        let start = Instant::now();
        let e = c.stats(None).unwrap_err();
        assert!(matches!(e, Error::Timeout(..)), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(2));
        assert!(e.to_string().starts_with("no answer from sheepfs on "));

        // A flush slower than the timeout still completes.
        let (_d2, target2, _r2) = serve(vec![Act::Stall(Duration::from_millis(600))]);
        let mut c = Client::new(target2);
        c.timeout = Duration::from_millis(100);
        let e = c.flush(None, &mut |_, _| {}, None).unwrap_err();
        assert!(matches!(e, Error::Closed { .. }), "{e:?}");
    }

    #[test]
    fn a_flush_with_a_time_limit_fails_once_it_passes() {
        let progress = line(&Response::Progress {
            pushed: 1 << 20,
            total: 4 << 20,
        });
        let (_d, target, _r) = serve(vec![
            Act::LinesThenStall(vec![progress], Duration::from_secs(3)),
            Act::Stall(Duration::from_secs(3)),
        ]);
        let c = Client::new(target);
        let limit = Duration::from_millis(300);
        let start = Instant::now();
        let e = c.flush(None, &mut |_, _| {}, Some(limit)).unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "waited past the limit"
        );
        assert!(
            matches!(
                e,
                Error::FlushTimeout {
                    progress: Some((1048576, 4194304)),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("flush not done within 300ms (pushed 1.0 MiB of 4.0 MiB so far)"),
            "{e}"
        );
        // No progress line at all.
        let e = c.flush(None, &mut |_, _| {}, Some(limit)).unwrap_err();
        assert!(
            e.to_string().starts_with("flush not done within 300ms: "),
            "{e}"
        );
        // Done in time.
        let done = line(&Response::Ok(Reply::Flushed { bytes: 7 }));
        let (_d, target, _r) = serve(vec![Act::Lines(vec![done])]);
        let c = Client::new(target);
        assert_eq!(c.flush(None, &mut |_, _| {}, Some(limit)).unwrap(), 7);
    }

    #[test]
    fn mode_and_resize_requests() {
        let (_d, target, reqs) = serve(vec![
            Act::Lines(vec![line(&Response::Ok(Reply::Resized { size: 2 << 30 }))]),
            Act::Lines(vec![line(&Response::Ok(Reply::Mode {
                vdi: "disk0".into(),
                mode: CacheMode::Off,
                attached: Some(true),
            }))]),
        ]);
        let c = Client::new(target);
        assert_eq!(c.resize(2 << 30).unwrap(), 2 << 30);
        assert_eq!(
            c.mode("disk0".into(), CacheMode::Off).unwrap(),
            ("disk0".into(), CacheMode::Off, Some(true))
        );
        assert_eq!(
            reqs.recv().unwrap(),
            "{\"cmd\":\"resize\",\"size\":2147483648}\n"
        );
        assert_eq!(
            reqs.recv().unwrap(),
            "{\"cmd\":\"mode\",\"vdi\":\"disk0\",\"mode\":\"off\"}\n"
        );
    }

    #[test]
    fn no_socket() {
        let dir = tempfile::tempdir().unwrap();
        let e = Client::new(Target::cache_dir(dir.path()))
            .stats(None)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "no sheepfs is serving the cache at {0}: {0}/control.sock does not exist",
                dir.path().display()
            )
        );
        let e = Client::new(Target::socket(dir.path().join("s")))
            .stats(None)
            .unwrap_err();
        assert!(matches!(e, Error::NoSocket(_)));
        assert!(e.to_string().ends_with("/s: it does not exist"), "{e}");
    }

    #[test]
    fn stale_socket_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::cache_dir(dir.path());
        drop(UnixListener::bind(&target.socket).unwrap()); // the file stays, nobody listens
        assert!(std::fs::metadata(&target.socket)
            .unwrap()
            .file_type()
            .is_socket());
        let e = Client::new(target).stats(None).unwrap_err();
        assert!(matches!(e, Error::Refused(_)), "{e:?}");
        assert!(e.to_string().starts_with("connection refused on "), "{e}");
        assert!(e.to_string().contains("died"), "{e}");
    }

    #[test]
    fn regular_file_is_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let target = Target::cache_dir(dir.path());
        std::fs::write(&target.socket, b"").unwrap();
        let e = Client::new(target).stats(None).unwrap_err();
        assert!(matches!(e, Error::NotASocket(_)), "{e:?}");
    }

    #[test]
    fn permission_denied_message() {
        let target = Target::cache_dir("/var/cache/sheepfs");
        let e = connect_error(&target, io::Error::from(io::ErrorKind::PermissionDenied));
        assert_eq!(
            e.to_string(),
            "permission denied on /var/cache/sheepfs/control.sock: the control socket is 0600; \
             run cachectl as the user who mounted sheepfs"
        );
        // EACCES, as connect(2) returns it for a socket we may not write.
        let e = connect_error(&target, io::Error::from_raw_os_error(13));
        assert!(matches!(e, Error::PermissionDenied(_)));
    }

    #[test]
    fn dirty_of_vdi_or_all() {
        let s = sample();
        assert_eq!(dirty_of(&s, None), 64 << 20);
        assert_eq!(dirty_of(&s, Some("disk0")), 48 << 20);
    }

    #[test]
    fn evict_discarding() {
        let (_d, target, reqs) = serve(vec![Act::Lines(vec![line(&Response::Ok(
            Reply::Evicted {
                bytes: 10,
                discarded_dirty: 3,
            },
        ))])]);
        let got = Client::new(target).evict(None, true).unwrap();
        assert_eq!(got, (10, 3));
        let req: Request = serde_json::from_str(&reqs.recv().unwrap()).unwrap();
        assert!(matches!(
            req,
            Request::Evict {
                vdi: None,
                discard_dirty: true
            }
        ));
    }
}
