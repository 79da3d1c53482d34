//! A real mount with the cluster key: sheepfs given the key serves; given another key it does
//! not mount and says why; its cache's control socket is owner-only (0600) in a directory no
//! one else can write (0700).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::*;

#[test]
fn a_mount_with_the_key_serves_and_its_control_socket_is_owner_only() {
    let rig = Rig::start(1, 1, "4M", &[]);
    // A second mount on the same cluster, with a cache, to see its directory and socket.
    let dir = rig.scratch("cache");
    let mnt = rig.cluster.dir.path().join("mnt2");
    let m = testkit::mount::Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(0),
        &mnt,
        &rig.cluster.dir.path().join("sheepfs2.log"),
        &["--cache-dir", &dir],
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(Path::new(&dir)), 0o700, "the cache directory");
    assert_eq!(
        mode(&Path::new(&dir).join("control.sock")),
        0o600,
        "the control socket"
    );
    rig.cluster.dog_ok(&["vdi", "create", "w", "4M"]);
    let data = vec![7u8; 4096];
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(rig.path("w"))
            .unwrap();
        f.write_all_at(&data, 0).unwrap();
        f.sync_all().unwrap();
        let g = std::fs::File::open(m.path("w")).unwrap();
        let mut back = vec![0u8; 4096];
        g.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(
            back, data,
            "written through one mount, read through the other"
        );
    }
    drop(m);

    // Another key: sheepfs does not mount, and says which node refused and why.
    let wrong = rig.cluster.dir.path().join("wrong.key");
    testkit::auth::write_new_key(&wrong).unwrap();
    let mnt3 = rig.cluster.dir.path().join("mnt3");
    std::fs::create_dir_all(&mnt3).unwrap();
    let mut cmd = Command::new(SHEEPFS);
    cmd.args(["--cluster", &rig.cluster.addr(0)])
        .arg(&mnt3)
        .args(["--foreground", "--timeout", "5s", "--key-file"])
        .arg(&wrong);
    testkit::die_with_parent(&mut cmd, libc::SIGKILL);
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("did not prove it holds the cluster key"), "{e}");
    assert!(!testkit::mount::is_mounted(&mnt3));
}
