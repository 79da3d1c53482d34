//! Every way to stop sheepfs with a writeback cache keeps every acknowledged write: SIGTERM,
//! SIGINT and SIGHUP with a file open and written, `umount` and `fusermount3 -u` (refused
//! while a file is open), `umount -l` (the mount goes, the open file keeps working). After
//! each, the cluster alone (`dog vdi read`) holds every write the writer was told was done.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use common::{block_pattern, open_rw, remount, rig_with_cache, stats, Rig};
use testkit::wait_until;

const BS: u64 = 4096;
const SIZE: u64 = 16 << 20;
const BLOCKS: u64 = SIZE / BS;

/// Write i puts pattern i + 1 at block `at(i)`, with an fsync every 256 writes.
fn at(i: u64) -> u64 {
    (i * 7919) % BLOCKS
}

/// A writer on one open file, until told to stop or a write fails: what it was told was
/// done, and the write under way when it stopped.
struct Writer {
    acked: Arc<Mutex<Vec<u64>>>,
    in_flight: Arc<Mutex<Option<u64>>>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Option<std::io::Error>>,
}

impl Writer {
    fn start(path: String) -> Writer {
        let acked = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (acked, in_flight, stop) = (acked.clone(), in_flight.clone(), stop.clone());
            std::thread::spawn(move || {
                let file = open_rw(&path);
                for i in 0.. {
                    if stop.load(SeqCst) {
                        return None;
                    }
                    *in_flight.lock().unwrap() = Some(i);
                    let r = file
                        .write_all_at(&block_pattern(i + 1), at(i) * BS)
                        .and_then(|_| {
                            if i % 256 == 255 {
                                file.sync_data()
                            } else {
                                Ok(())
                            }
                        });
                    if let Err(e) = r {
                        return Some(e);
                    }
                    acked.lock().unwrap().push(i);
                    *in_flight.lock().unwrap() = None;
                }
                None
            })
        };
        Writer {
            acked,
            in_flight,
            stop,
            thread,
        }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    fn wait_for(&self, n: usize) {
        wait_until(
            &format!("{n} acknowledged writes"),
            Duration::from_secs(60),
            || self.acked() >= n || self.thread.is_finished(),
        );
        assert!(!self.thread.is_finished(), "the writer stopped early");
    }

    /// Stops it (if a write did not already fail) and closes its file; returns the error
    /// that stopped it, if any.
    fn finish(self) -> (Option<std::io::Error>, Vec<u64>, Option<u64>) {
        self.stop.store(true, SeqCst);
        let err = self.thread.join().unwrap();
        let acked = self.acked.lock().unwrap().clone();
        let in_flight = *self.in_flight.lock().unwrap();
        (err, acked, in_flight)
    }
}

/// Every block of VDI `name` in the cluster (read with dog, past any cache) is its last
/// acknowledged write, or the write under way at the end (either is right for it).
fn check_cluster(rig: &Rig, name: &str, acked: &[u64], in_flight: Option<u64>, how: &str) {
    let mut want = vec![0u64; BLOCKS as usize];
    for &i in acked {
        want[at(i) as usize] = i + 1;
    }
    let pattern = block_pattern;
    let got = rig.cluster.read_vdi(name, 0, SIZE);
    for b in 0..BLOCKS {
        let blk = &got[(b * BS) as usize..((b + 1) * BS) as usize];
        let ok = blk == &pattern(want[b as usize])[..]
            || in_flight.is_some_and(|i| at(i) == b && blk == &pattern(i + 1)[..]);
        assert!(
            ok,
            "{how}: block {b} in the cluster is not its last acknowledged write ({} acknowledged)",
            acked.len()
        );
    }
}

fn log_of(rig: &Rig, log: &str) -> String {
    std::fs::read_to_string(rig.cluster.dir.path().join(log)).unwrap()
}

/// What a clean stop leaves: exit status 0, the log says so, no lock held, nothing dirty.
fn assert_clean_exit(rig: &Rig, status: std::process::ExitStatus, log: &str, how: &str) {
    let text = log_of(rig, log);
    assert!(status.success(), "{how}: sheepfs exited with {status}");
    assert!(
        text.contains("cache clean: every write is in the cluster"),
        "{how}: the log says the cache is clean"
    );
    let locks = rig.cluster.dog_json(&["vdi", "lock", "list"]);
    assert!(
        locks.as_array().unwrap().is_empty(),
        "{how}: locks left: {locks}"
    );
}

#[test]
fn every_way_to_stop_keeps_every_acknowledged_write() {
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    let mut log = "sheepfs.log".to_string();
    let mut round = 0;
    let mut next_mount = |rig: &mut Rig, cache: &Path, log: &mut String| {
        round += 1;
        *log = format!("sheepfs-{round}.log");
        remount(rig, cache, "64M", log);
    };

    // Signals with the file open and under writes: the mount is detached at once, the open
    // file's writes go to the cluster while the cache pushes, then fail; exit status 0.
    for (sig, how) in [
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGINT, "SIGINT"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let name = format!("sig{sig}");
        rig.cluster.dog_ok(&["vdi", "create", &name, "16M"]);
        let w = Writer::start(rig.path(&name));
        w.wait_for(1500);
        wait_until("dirty data in the cache", Duration::from_secs(10), || {
            stats(&cache)["dirty"].as_u64().unwrap() > 0
        });
        rig.mount.signal(sig);
        let status = rig.mount.wait_exit(Duration::from_secs(60));
        let (err, acked, in_flight) = w.finish();
        assert!(err.is_some(), "{how}: the writer saw the mount go");
        assert_clean_exit(&rig, status, &log, how);
        check_cluster(&rig, &name, &acked, in_flight, how);
        next_mount(&mut rig, &cache, &mut log);
    }

    // umount and fusermount3 -u are refused while the file is open (the writer goes on),
    // and work once it is closed.
    let umount = |dir: &Path| Command::new("umount").arg(dir).output().unwrap();
    let fusermount = |dir: &Path| {
        Command::new("fusermount3")
            .arg("-u")
            .arg(dir)
            .output()
            .unwrap()
    };
    type Unmount<'a> = &'a dyn Fn(&Path) -> std::process::Output;
    for (unmount, how, name) in [
        (&umount as Unmount, "umount", "plain"),
        (&fusermount as Unmount, "fusermount3 -u", "fuser"),
    ] {
        rig.cluster.dog_ok(&["vdi", "create", name, "16M"]);
        let w = Writer::start(rig.path(name));
        w.wait_for(1500);
        let out = unmount(&rig.mount.dir);
        assert!(
            !out.status.success(),
            "{how} with a file open is refused (EBUSY)"
        );
        let n = w.acked();
        w.wait_for(n + 500);
        let (err, acked, in_flight) = w.finish();
        assert!(err.is_none(), "{how}: the writer went on: {err:?}");
        let out = unmount(&rig.mount.dir);
        assert!(out.status.success(), "{how}: {out:?}");
        let status = rig.mount.wait_exit(Duration::from_secs(60));
        assert_clean_exit(&rig, status, &log, how);
        check_cluster(&rig, name, &acked, in_flight, how);
        next_mount(&mut rig, &cache, &mut log);
    }

    // umount -l: the mount goes at once, the open file keeps working through the cache, and
    // sheepfs pushes and exits when it is closed.
    rig.cluster.dog_ok(&["vdi", "create", "lazy", "16M"]);
    let w = Writer::start(rig.path("lazy"));
    w.wait_for(1500);
    let out = Command::new("umount")
        .arg("-l")
        .arg(&rig.mount.dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "umount -l: {out:?}");
    assert!(!testkit::mount::is_mounted(&rig.mount.dir));
    let n = w.acked();
    w.wait_for(n + 500);
    wait_until("dirty data in the cache", Duration::from_secs(10), || {
        stats(&cache)["dirty"].as_u64().unwrap() > 0
    });
    let (err, acked, in_flight) = w.finish();
    assert!(err.is_none(), "umount -l: the writer went on: {err:?}");
    let status = rig.mount.wait_exit(Duration::from_secs(60));
    assert_clean_exit(&rig, status, &log, "umount -l");
    check_cluster(&rig, "lazy", &acked, in_flight, "umount -l");
    next_mount(&mut rig, &cache, &mut log);
}
