//! The live-migration harness proven on a local file (no sheepfs): a real guest writes its
//! counter pattern to a 64 MiB raw disk while it is migrated A -> B -> A between three qemu
//! processes, as between hosts sharing storage. Host B sees the image through another path
//! (a hard link in its own directory), as a second mount would show it. Then the guest's
//! checksum of its disk must equal the file's, and the file must hold every write the guest
//! acknowledged (its last 4096, should it make more), and nothing else.
//!
//! It needs the guest that `scripts/fetch-guest.sh` builds into `target/guest` (Debian
//! packages through apt, about 40 MB, once): `make test` runs the script first, and the
//! test runs it too (it does nothing once the guest is built). Some 15 s under TCG. The
//! same migration between two sheepfs mounts: `fusefs/sheepfs/tests/guest_migration.rs`.

use std::fs::File;
use std::time::{Duration, Instant};

use testkit::guest::{check_pattern, sha256_file, Guest, GuestConfig, GuestImage, Transport};

/// Writes the guest acknowledges on each host before moving on: proves its disk works there.
const WRITES_PER_HOST: u64 = 100;
const WAIT: Duration = Duration::from_secs(180);

#[test]
fn guest_keeps_every_write_through_migration_there_and_back() {
    let t0 = Instant::now();
    let image = GuestImage::fetch();
    // In /tmp: unix socket paths must stay short.
    let dir = tempfile::Builder::new()
        .prefix("guest-mig")
        .tempdir_in("/tmp")
        .unwrap();
    let host_a = dir.path().join("a");
    let host_b = dir.path().join("b");
    std::fs::create_dir_all(&host_a).unwrap();
    std::fs::create_dir_all(&host_b).unwrap();
    let disk_a = host_a.join("disk.raw");
    let disk_b = host_b.join("disk.raw");
    File::create(&disk_a).unwrap().set_len(64 << 20).unwrap();
    std::fs::hard_link(&disk_a, &disk_b).unwrap();

    let cfg = GuestConfig::default();
    let slots = cfg.slots;
    let mut g = Guest::boot(&image, cfg, &disk_a, dir.path());
    let booted = g.boot_time();
    let mut seen = g.wait_writes(WRITES_PER_HOST, WAIT);
    // There over a unix socket, back over loopback TCP.
    for (to, transport) in [(&disk_b, Transport::Unix), (&disk_a, Transport::Tcp)] {
        g.config_mut().transport = transport;
        let m = g.migrate(to);
        assert!(m.downtime < Duration::from_secs(10), "{m:?}");
        assert!(
            m.writes_after > m.writes_before,
            "the guest wrote while it was migrated: {m:?}"
        );
        // The guest goes on writing, now through the new qemu.
        seen = g.wait_writes(m.writes_after + WRITES_PER_HOST, WAIT);
    }
    let fin = g.finish();
    assert!(
        fin.last >= seen,
        "the guest's last write {} < {seen} seen",
        fin.last
    );
    let sum = sha256_file(&disk_a).unwrap();
    assert_eq!(
        fin.sum, sum,
        "the guest's checksum of its disk vs the file's"
    );
    let report = check_pattern(&disk_a, slots, fin.last).unwrap();
    assert_eq!(report.newest, fin.last);
    assert_eq!(report.written_slots, slots.min(fin.last));

    eprintln!(
        "guest: booted in {booted:.1?}, {} writes, whole test {:.1?}",
        fin.last,
        t0.elapsed()
    );
    for (i, m) in g.migrations().iter().enumerate() {
        eprintln!(
            "migration {}: downtime {:?}, total {:?} (setup {:?}), {} KiB of RAM in {} pass(es), guest writes {}..{}",
            i + 1,
            m.downtime,
            m.total,
            m.setup,
            m.ram_transferred >> 10,
            m.dirty_syncs,
            m.writes_before,
            m.writes_after
        );
    }
}
