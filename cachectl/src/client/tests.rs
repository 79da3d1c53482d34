//! Tests of the control client.

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
