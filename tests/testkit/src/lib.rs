//! Harness for end-to-end tests and the benchmark runner: spawns real binaries, polls for
//! readiness (never a fixed sleep), and always stops what it started, pass or fail.
//!
//! Every call that can fail has a `try_` form returning [`Result`] (what `bench run` uses)
//! and a panicking form of the old name (what tests use), so a test reads straight through.
//!
//! - [`Proc`]: a child process in its own process group, tied to its parent by a
//!   parent-death signal, stopped on drop; its output goes to a log file whose tail is
//!   printed if the test is panicking.
//! - [`wait_until`] / [`try_wait_until`]: polls a condition with a deadline.
//! - [`free_port`]: a loopback port nobody listens on.
//! - [`cluster::Cluster`]: a local cluster of real `sheep` processes driven through real `dog`,
//!   on the `local` membership driver or any `--cluster` spec (etcd).
//! - [`etcd::Etcd`]: real etcd servers (one member or a cluster) on loopback ports.
//! - [`netns::Netns`]: network namespaces on a bridge as separate hosts (root only), one cut
//!   off and healed at will; a cluster's node placed in one by [`cluster::NodeHost`].
//! - [`mount::Mount`]: a real FUSE mount (`sheepfs`, `bindfs`), unmounted and stopped on drop.
//! - [`auth::key_file`]: the cluster key every node, dog and mount testkit starts is given.
//! - [`build`]: the binaries under test, built fresh, or taken from a named directory.
//! - [`replicas::check`]: every copy of every object of a VDI read from disk and compared.
//! - [`pause::Paused`]: a node frozen with SIGSTOP (a hung node), continued on drop.
//! - [`faultfs::FaultMount`]: an error-injecting FUSE passthrough (a sick disk without
//!   device-mapper): reads, writes or fsyncs of chosen files answer EIO once armed.
//! - [`fsx::run`]: an fsx-style exerciser: seeded random reads, writes, mapped reads and
//!   writes, discards and fsyncs of a file, checked against a model.
//! - [`guest::Guest`]: a real VM (qemu, TCG) writing a counter pattern to its disk,
//!   live-migrated between qemu processes through QMP (`scripts/fetch-guest.sh` builds it).

pub mod auth;
pub mod build;
pub mod cluster;
mod error;
pub mod etcd;
pub mod faultfs;
pub mod fsx;
pub mod guest;
pub mod mount;
pub mod netns;
pub mod pause;
mod proc;
pub mod replicas;
mod wait;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::Path;

pub use error::{or_panic, Error, Result};
pub use proc::{die_with_parent, output, output_with_stdin, Proc, ProcOptions};
pub use wait::{check_interrupt, install_interrupt_handlers, try_wait_until, wait_until};

/// The last `bytes` of a file, lossily decoded.
pub fn log_tail(path: &Path, bytes: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(bytes)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The first panic message in a log (the line and the two after it), if any: a backtrace
/// after it can push it out of the tail.
pub fn first_panic(path: &Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let mut lines = text.lines().skip_while(|l| !l.contains("panicked at"));
    let first = lines.next()?;
    Some(
        std::iter::once(first)
            .chain(lines.take(2))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// The last `max` warning and error lines of a log that lie before its last `tail_bytes`
/// bytes (those a tail shows anyway), with how many there were: what a process found wrong
/// earlier in a failed test, when its whole log is too long to print.
pub fn earlier_warnings(path: &Path, tail_bytes: u64, max: usize) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let head = &text[..text.len().saturating_sub(tail_bytes as usize)];
    let head = String::from_utf8_lossy(head);
    let found: Vec<&str> = head
        .lines()
        .filter(|l| l.contains(" WARN") || l.contains("ERROR"))
        .collect();
    if found.is_empty() {
        return None;
    }
    let shown = &found[found.len().saturating_sub(max)..];
    Some(format!(
        "({} of {} warning/error line(s) before the tail)\n{}",
        shown.len(),
        found.len(),
        shown.join("\n")
    ))
}

/// A loopback port that was free a moment ago.
pub fn try_free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::io("binding a loopback port", e))
}

/// Like [`try_free_port`]; panics if no port can be bound.
#[track_caller]
pub fn free_port() -> u16 {
    or_panic(try_free_port())
}

/// Deterministic pseudo-random bytes (xorshift), so a failing test can be replayed.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[cfg(test)]
mod log_tests {
    #[test]
    fn earlier_warnings_skip_the_tail_and_keep_the_last_ones() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("log");
        let mut text = String::new();
        for i in 0..5 {
            text.push_str(&format!("2026 \x1b[33m WARN\x1b[0m early {i}\n"));
            text.push_str("2026  INFO fine\n");
        }
        text.push_str("2026 ERROR in the tail\n");
        std::fs::write(&p, &text).unwrap();
        let w = super::earlier_warnings(&p, 23, 3).unwrap();
        assert_eq!(
            w.lines().collect::<Vec<_>>(),
            vec![
                "(3 of 5 warning/error line(s) before the tail)",
                "2026 \x1b[33m WARN\x1b[0m early 2",
                "2026 \x1b[33m WARN\x1b[0m early 3",
                "2026 \x1b[33m WARN\x1b[0m early 4",
            ]
        );
        assert_eq!(super::earlier_warnings(&p, 1 << 20, 3), None);
    }
}
