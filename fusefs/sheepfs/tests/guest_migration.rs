//! A real VM live-migrated between two sheepfs mounts of one cluster, standing for two hosts
//! that share storage (issue 42): a guest writes its counter pattern (testkit's
//! [`guest`](testkit::guest) harness) to VDI `vm` under qemu on mount A, is migrated to a
//! qemu on mount B while it writes, then back to A, and stops. After each move the VDI's
//! lock must be with the mount the guest now writes through, at a newer generation.
//!
//! How the lock moves (seen with strace on qemu 7.2, `-drive` with `cache=none`): a
//! destination opens the image read-only while it waits (auto-read-only); at the
//! switch-over the source flushes, opens it again read-only and closes its read-write
//! descriptor, and a few milliseconds later the destination opens it read-write. So on
//! mounts without a cache the source's close usually releases the lock before the
//! destination's open takes it (no hand-over logged); a hand-over
//! (`sheepfs --lock-mode cooperative`) serves the cases where the open comes first, and
//! mounts with a cache, which keep the lock after the last close.
//!
//! Then the guest's own checksum of its disk must equal the cluster's (`dog vdi read vm`),
//! mount B's (read afresh, after the lock went back to A) and mount A's, and each must hold
//! every write the guest acknowledged and nothing else ([`check_pattern`]). Once on plain
//! mounts, once on mounts with a writeback cache each.
//!
//! It needs the guest that `scripts/fetch-guest.sh` builds into `target/guest` (Debian
//! packages through apt, about 40 MB, once): `make test` runs the script first, and the
//! tests run it too (it does nothing once the guest is built). Some 20 s each under TCG.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Rig, SHEEPFS};
use testkit::cluster::Cluster;
use testkit::guest::{
    check_pattern, sha256_file, Guest, GuestConfig, GuestImage, Migration, Transport,
};
use testkit::mount::Mount;

const TTL: &str = "3s";
/// The guest's 4096 slots of 4 KiB fill its first 16 MiB; the rest must stay zero.
const VDI_SIZE: &str = "32M";
/// Writes the guest acknowledges on each host before moving on: proves its disk works there.
const WRITES_PER_HOST: u64 = 100;
const WAIT: Duration = Duration::from_secs(180);
/// qemu's measure of the guest's pause at a switch-over (it aims for 300 ms; tens of ms here,
/// with or without a cache): the source's flush is in it, and with a cache, its push.
const DOWNTIME_BOUND: Duration = Duration::from_secs(5);
/// What the mounts log as the lock moves (locks.rs, cachelocks.rs, handover.rs): printed, not
/// required (see the top of this file).
const LOCK_LOG: [&str; 5] = [
    "took the lock over",
    "took its free lock",
    "handed the lock",
    "took the lock of VDI",
    "released the lock of VDI",
];

#[test]
fn a_guest_migrates_there_and_back_between_plain_mounts() {
    there_and_back("plain", |_cache| vec![]);
}

#[test]
fn a_guest_migrates_there_and_back_between_writeback_cache_mounts() {
    there_and_back("cached", |cache| {
        vec![
            "--cache-dir".into(),
            cache.display().to_string(),
            "--cache-size".into(),
            "64M".into(),
        ]
    });
}

/// The migration A -> B -> A on two mounts, each started with `--lock-ttl` and the options
/// `opts` gives for its own cache directory (which it may ignore); `kind` starts each line
/// it prints (tests run side by side).
fn there_and_back(kind: &str, opts: impl Fn(&Path) -> Vec<String>) {
    let t0 = Instant::now();
    let image = GuestImage::fetch();
    // In /tmp: the guest's unix socket paths must stay short. Holds mount B, both caches
    // and the guest's sockets and consoles; dropped last (bindings drop in reverse order):
    // the guest's qemus go first, then mount B, then the rig (mount A, the cluster).
    let tmp = tempfile::Builder::new()
        .prefix("gm")
        .tempdir_in("/tmp")
        .unwrap();
    let args = |cache: &str| {
        let mut a = vec!["--lock-ttl".to_string(), TTL.to_string()];
        a.extend(opts(&tmp.path().join(cache)));
        a
    };
    let a_args = args("cache-a");
    let rig = Rig::start(3, 2, "1M", &common::strs(&a_args));
    rig.cluster.dog_ok(&["vdi", "create", "vm", VDI_SIZE]);
    let b_args = args("cache-b");
    let b_log = tmp.path().join("b.log");
    let b = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(1),
        &tmp.path().join("mnt-b"),
        &b_log,
        &common::strs(&b_args),
    );
    let a_log = rig.cluster.dir.path().join("sheepfs.log");
    let disk_a = rig.mount.path("vm");
    let disk_b = b.path("vm");
    let guest_dir = tmp.path().join("g");
    std::fs::create_dir_all(&guest_dir).unwrap();

    let cfg = GuestConfig::default();
    let slots = cfg.slots;
    let mut g = Guest::boot(&image, cfg, &disk_a, &guest_dir);
    eprintln!("{kind}: guest booted on A in {:.1?}", g.boot_time());
    let mut seen = g.wait_writes(WRITES_PER_HOST, WAIT);
    let host_a = Host {
        name: "A",
        mount: &rig.mount,
        cache: tmp.path().join("cache-a"),
    };
    let host_b = Host {
        name: "B",
        mount: &b,
        cache: tmp.path().join("cache-b"),
    };
    let mut gen = holder(&rig.cluster, &host_a, "the guest wrote on A");
    eprintln!("{kind}: the guest wrote on A, which holds the lock, generation {gen}");
    // There over a unix socket, back over loopback TCP.
    for (i, (to, transport)) in [(&host_b, Transport::Unix), (&host_a, Transport::Tcp)]
        .into_iter()
        .enumerate()
    {
        g.config_mut().transport = transport;
        let m = g.migrate(&to.mount.path("vm"));
        eprintln!(
            "{kind}: migration {}, to {}: {}",
            i + 1,
            to.name,
            describe(&m)
        );
        assert!(m.downtime < DOWNTIME_BOUND, "{m:?}");
        assert!(
            m.writes_after > m.writes_before,
            "the guest wrote while it was migrated: {m:?}"
        );
        // The guest goes on writing, now through the other mount, which has the lock.
        seen = g.wait_writes(m.writes_after + WRITES_PER_HOST, WAIT);
        let when = format!("the guest wrote on {} after migration {}", to.name, i + 1);
        let now = holder(&rig.cluster, to, &when);
        assert!(now > gen, "{when}: the lock's generation {now} after {gen}");
        eprintln!(
            "{kind}: the guest wrote on {0}, which holds the lock, generation {now}",
            to.name
        );
        gen = now;
    }
    let fin = g.finish();
    assert!(
        fin.last >= seen,
        "the guest's last write {} < {seen} seen",
        fin.last
    );

    // What the cluster holds, what mount B reads now that A has the lock back, and what A
    // reads: each is the guest's disk.
    let from_dog = tmp.path().join("vm.dog");
    std::fs::write(&from_dog, rig.cluster.dog_ok(&["vdi", "read", "vm"])).unwrap();
    for (what, path) in [
        ("dog vdi read", from_dog.as_path()),
        ("mount B", disk_b.as_path()),
        ("mount A", disk_a.as_path()),
    ] {
        let report = check_pattern(path, slots, fin.last)
            .unwrap_or_else(|e| panic!("{what}: {}", e.chain()));
        assert_eq!(report.newest, fin.last, "{what}");
        assert_eq!(report.written_slots, slots.min(fin.last), "{what}");
        assert_eq!(
            fin.sum,
            sha256_file(path).unwrap(),
            "the guest's checksum of its disk vs {what}'s"
        );
    }

    eprintln!(
        "{kind}: guest booted in {:.1?}, {} writes, whole test {:.1?}",
        g.boot_time(),
        fin.last,
        t0.elapsed()
    );
    for (name, log) in [("A", &a_log), ("B", &b_log)] {
        let lines = lock_lines(log);
        if lines.is_empty() {
            eprintln!("{kind}: mount {name}: no hand-over logged");
        }
        for l in lines {
            eprintln!("{kind}: mount {name}: {l}");
        }
    }
}

/// qemu's measures of a migration, on one line.
fn describe(m: &Migration) -> String {
    // qemu says `completed` a moment before it has computed the times.
    let unmeasured = if m.total.is_zero() {
        " (not measured yet when qemu said completed)"
    } else {
        ""
    };
    format!(
        "downtime {:?}, total {:?}{unmeasured} (setup {:?}), {} KiB of RAM in {} pass(es), guest writes {}..{}",
        m.downtime,
        m.total,
        m.setup,
        m.ram_transferred >> 10,
        m.dirty_syncs,
        m.writes_before,
        m.writes_after
    )
}

/// A mount standing for a host, and the cache directory it has if started with a cache.
struct Host<'a> {
    name: &'a str,
    mount: &'a Mount,
    cache: PathBuf,
}

/// The generation of VDI `vm`'s lock, which `host` must hold (`when`): a mount without a
/// cache owns it by its mount point, a cache by its control socket.
fn holder(c: &Cluster, host: &Host, when: &str) -> u64 {
    let locks = c.dog_json(&["vdi", "lock", "list"]);
    let lock = locks
        .as_array()
        .and_then(|l| l.iter().find(|l| l["vdi"] == "vm"))
        .unwrap_or_else(|| panic!("{when}: VDI 'vm' is not locked: {locks}"));
    let owner = lock["owner"].as_str().unwrap_or_default();
    let by_mount = owner.ends_with(&format!("mount:{}", host.mount.dir.display()));
    let by_cache = lock["control"]
        .as_str()
        .is_some_and(|s| Path::new(s).starts_with(&host.cache));
    assert!(
        by_mount || by_cache,
        "{when}: mount {} ({}) should hold the lock of 'vm': {lock}",
        host.name,
        host.mount.dir.display()
    );
    lock["gen"].as_u64().expect("a generation")
}

/// The lines of a sheepfs log that tell how the lock of VDI `vm` moved by request, from
/// the VDI's name on (no time, level or colours).
fn lock_lines(log: &Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| LOCK_LOG.iter().any(|t| l.contains(t)))
        .filter_map(|l| l.find("VDI 'vm'").map(|at| l[at..].to_string()))
        .collect()
}
