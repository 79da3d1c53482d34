//! The `cachectl` binary end to end against a fake sheepfs control socket.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::thread;

use cache_control::{CacheMode, CacheStats, Reply, Response, VdiStats};

/// A fake sheepfs in a fresh cache directory: it answers one connection per entry of
/// `answers` with those lines, in order, and reports every request line it read.
fn serve(answers: Vec<Vec<Response>>) -> (tempfile::TempDir, mpsc::Receiver<String>) {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join("control.sock")).unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for lines in answers {
            let (stream, _) = listener.accept().unwrap();
            let mut req = String::new();
            BufReader::new(&stream).read_line(&mut req).unwrap();
            tx.send(req.trim_end().to_string()).unwrap();
            let mut w = &stream;
            for l in lines {
                let text = serde_json::to_string(&l).unwrap() + "\n";
                w.write_all(text.as_bytes()).unwrap();
            }
        }
    });
    (dir, rx)
}

fn cachectl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachectl"))
        .arg("--cache-dir")
        .arg(dir)
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

fn stats() -> CacheStats {
    CacheStats {
        dir: "/var/cache/sheepfs".into(),
        size: 1 << 30,
        used: 300 << 20,
        dirty: 64 << 20,
        flush_backlog: 16 << 20,
        max_dirty: 256 << 20,
        max_dirty_age_secs: 30,
        default_mode: Some(CacheMode::Writeback),
        total: VdiStats {
            hits: 3,
            misses: 1,
            ..Default::default()
        },
        vdis: vec![
            VdiStats {
                name: "disk0".into(),
                mode: Some(CacheMode::Writeback),
                used: 200 << 20,
                dirty: 48 << 20,
                hits: 3,
                misses: 1,
                ..Default::default()
            },
            VdiStats {
                name: "disk1".into(),
                mode: Some(CacheMode::Writethrough),
                used: 100 << 20,
                dirty: 16 << 20,
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

#[test]
fn stats_json() {
    let (dir, reqs) = serve(vec![vec![Response::Ok(Reply::Stats(stats()))]]);
    let o = cachectl(dir.path(), &["stats", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got: CacheStats = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(got, stats());
    assert_eq!(reqs.recv().unwrap(), r#"{"cmd":"stats","vdi":null}"#);
}

#[test]
fn stats_human_and_prometheus() {
    let (dir, reqs) = serve(vec![
        vec![Response::Ok(Reply::Stats(stats()))],
        vec![Response::Ok(Reply::Stats(stats()))],
    ]);
    let o = cachectl(dir.path(), &["stats", "disk0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("Hit ratio:       75.0% of requests"), "{out}");
    assert!(out.contains("\ndisk0  "), "{out}");
    assert_eq!(reqs.recv().unwrap(), r#"{"cmd":"stats","vdi":"disk0"}"#);

    let o = cachectl(dir.path(), &["stats", "--prometheus"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("\nsheepfs_cache_dirty_bytes 67108864\n"),
        "{out}"
    );
    assert!(out.contains("\nsheepfs_cache_vdi_used_bytes{vdi=\"disk1\"} 104857600\n"));
}

#[test]
fn flush() {
    let (dir, reqs) = serve(vec![
        vec![
            Response::Progress {
                pushed: 1 << 20,
                total: 4 << 20,
            },
            Response::Progress {
                pushed: 4 << 20,
                total: 4 << 20,
            },
            Response::Ok(Reply::Flushed { bytes: 4 << 20 }),
        ],
        vec![Response::Ok(Reply::Flushed { bytes: 0 })],
    ]);
    let o = cachectl(dir.path(), &["flush"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "flushed 4.0 MiB\n");
    // stderr is not a terminal: no progress bar.
    assert_eq!(stderr(&o), "");
    assert_eq!(reqs.recv().unwrap(), r#"{"cmd":"flush","vdi":null}"#);

    let o = cachectl(dir.path(), &["flush", "disk0", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v, serde_json::json!({"vdi": "disk0", "flushed": 0}));
}

#[test]
fn flush_cut_short() {
    let (dir, _reqs) = serve(vec![vec![Response::Progress {
        pushed: 1 << 20,
        total: 4 << 20,
    }]]);
    let o = cachectl(dir.path(), &["flush"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.starts_with("cachectl: sheepfs closed the connection on "),
        "{err}"
    );
    assert!(err.contains("after pushing 1.0 MiB of 4.0 MiB"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn evict_discard_dirty_needs_yes() {
    let (dir, reqs) = serve(vec![
        vec![Response::Ok(Reply::Stats(stats()))],
        vec![Response::Ok(Reply::Stats(stats()))],
        vec![Response::Ok(Reply::Evicted {
            bytes: 200 << 20,
            discarded_dirty: 48 << 20,
        })],
    ]);
    let o = cachectl(dir.path(), &["evict", "--discard-dirty"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("this would discard 64.0 MiB of dirty data; add --yes"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(stdout(&o), "");
    // Only stats was asked: nothing was evicted.
    assert_eq!(reqs.recv().unwrap(), r#"{"cmd":"stats","vdi":null}"#);

    let o = cachectl(dir.path(), &["evict", "disk0", "--discard-dirty"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("this would discard 48.0 MiB of dirty data of VDI 'disk0'; add --yes"),
        "{}",
        stderr(&o)
    );
    assert_eq!(reqs.recv().unwrap(), r#"{"cmd":"stats","vdi":"disk0"}"#);

    let o = cachectl(dir.path(), &["evict", "disk0", "--discard-dirty", "--yes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "evicted 200.0 MiB of VDI 'disk0'; discarded 48.0 MiB of dirty data (never pushed to the cluster)\n"
    );
    assert_eq!(
        reqs.recv().unwrap(),
        r#"{"cmd":"evict","vdi":"disk0","discard_dirty":true}"#
    );
}

#[test]
fn evict_resize_mode() {
    let (dir, reqs) = serve(vec![
        vec![Response::Ok(Reply::Evicted {
            bytes: 1 << 20,
            discarded_dirty: 0,
        })],
        vec![Response::Ok(Reply::Resized { size: 20 << 30 })],
        vec![Response::Ok(Reply::Mode {
            vdi: "disk0".into(),
            mode: CacheMode::Writethrough,
            attached: Some(false),
        })],
        vec![Response::Ok(Reply::Resized { size: 20 << 30 })],
    ]);
    let o = cachectl(dir.path(), &["evict"]);
    assert_eq!(stdout(&o), "evicted 1.0 MiB\n", "{}", stderr(&o));
    assert_eq!(
        reqs.recv().unwrap(),
        r#"{"cmd":"evict","vdi":null,"discard_dirty":false}"#
    );
    let o = cachectl(dir.path(), &["resize", "20G"]);
    assert_eq!(stdout(&o), "cache size is now 20.0 GiB\n", "{}", stderr(&o));
    assert_eq!(
        reqs.recv().unwrap(),
        r#"{"cmd":"resize","size":21474836480}"#
    );
    let o = cachectl(dir.path(), &["mode", "disk0", "writethrough"]);
    assert_eq!(
        stdout(&o),
        "VDI 'disk0' is now writethrough\nnote: 'disk0' is not attached to this cache (no file \
         of it is open read-write here): files of it open read-only go straight to the \
         cluster; the cache takes it at its next read-write open\n",
        "{}",
        stderr(&o)
    );
    assert_eq!(
        reqs.recv().unwrap(),
        r#"{"cmd":"mode","vdi":"disk0","mode":"writethrough"}"#
    );
    let o = cachectl(dir.path(), &["--json", "resize", "20G"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v, serde_json::json!({"size": 20u64 << 30}));
}

#[test]
fn server_error_line() {
    let (dir, _reqs) = serve(vec![vec![Response::Error(
        "no VDI named 'x' in the cache".into(),
    )]]);
    let o = cachectl(dir.path(), &["flush", "x"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stderr(&o), "cachectl: no VDI named 'x' in the cache\n");
    assert_eq!(stdout(&o), "");
}

#[test]
fn missing_socket() {
    let dir = tempfile::tempdir().unwrap();
    let o = cachectl(dir.path(), &["stats"]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        format!(
            "cachectl: no sheepfs is serving the cache at {0}: {0}/control.sock does not exist\n",
            dir.path().display()
        )
    );
}

#[test]
fn stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    drop(UnixListener::bind(dir.path().join("control.sock")).unwrap());
    let o = cachectl(dir.path(), &["stats"]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.starts_with("cachectl: connection refused on "), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn no_cache_given() {
    let o = Command::new(env!("CARGO_BIN_EXE_cachectl"))
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        stderr(&o),
        "cachectl: which cache? pass --cache-dir DIR (the sheepfs cache directory) or --socket PATH\n"
    );
}

#[test]
fn socket_flag() {
    let (dir, _reqs) = serve(vec![vec![Response::Ok(Reply::Flushed { bytes: 512 })]]);
    let o = Command::new(env!("CARGO_BIN_EXE_cachectl"))
        .arg("--socket")
        .arg(dir.path().join("control.sock"))
        .arg("flush")
        .output()
        .unwrap();
    assert_eq!(stdout(&o), "flushed 512 B\n", "{}", stderr(&o));
}
