//! The Debian package end to end, on this machine (as root; `make test` builds it first with
//! `make deb`): built by `scripts/build-deb.sh`, installed with `dpkg -i`, its files checked
//! (binaries, unit, man pages read by `man -l`, completions, the example config), a cluster of
//! the installed `sheep` and `dog` with its data under /var/lib/sheep, a mount made by mount(8)
//! from an fstab line through `/sbin/mount.fuse.sheepfs` and ended by `umount`, an upgrade to
//! a newer build, `dpkg -r` and `dpkg -P`: the data and, until the purge, the edited config
//! stay.
//!
//! Nothing else under test runs `/usr/bin/*` (testkit runs target/'s binaries), so installing
//! while other tests run is safe. A guard purges the package, unmounts, stops the mount's
//! sheepfs (by pid) and removes the test's data even when the test fails.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

mod common;

use common::run;
use testkit::cluster::{Bins, Cluster, ClusterOptions};
use testkit::mount::is_mounted;

const PKG: &str = "sheepstore";
const CONF: &str = "/etc/sheep/1.conf";
const DATA_ROOT: &str = "/var/lib/sheep";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `dpkg-query`'s status of the package ("" when dpkg knows nothing of it).
fn status() -> String {
    let o = Command::new("dpkg-query")
        .args(["-W", "-f=${Status} ${Version}", PKG])
        .output()
        .expect("dpkg-query");
    stdout(&o)
}

/// The package installed for the test: purged, and the test's data removed, on drop.
struct Installed {
    data: PathBuf,
    made_root: bool,
}

impl Installed {
    fn new() -> Installed {
        Installed {
            data: Path::new(DATA_ROOT).join(format!("pkgtest-{}", std::process::id())),
            made_root: !Path::new(DATA_ROOT).exists(),
        }
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        if !status().is_empty() {
            let _ = Command::new("dpkg").args(["-P", PKG]).output();
        }
        let _ = std::fs::remove_dir_all(&self.data);
        if self.made_root {
            // Only if empty: whatever else is there is not the test's.
            let _ = std::fs::remove_dir(DATA_ROOT);
        }
    }
}

/// The sheepfs processes serving `mnt` (found by pid: their command line names it).
fn sheepfs_pids(mnt: &Path) -> Vec<i32> {
    let want = mnt.as_os_str().as_encoded_bytes();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let mut args = cmdline.split(|b| *b == 0);
        if args.next().is_some_and(|a0| a0.ends_with(b"sheepfs")) && args.any(|a| a == want) {
            pids.push(pid);
        }
    }
    pids
}

/// A mount made by mount(8): on drop, detached if still there and its sheepfs killed.
struct MountGuard(PathBuf);

impl Drop for MountGuard {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            testkit::mount::unmount(&self.0);
        }
        for pid in sheepfs_pids(&self.0) {
            // SAFETY: signalling a pid found a moment ago to be our mount's sheepfs.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Builds the package (a no-op build when nothing changed: `make test` ran `make deb`).
fn build_deb() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(repo().join("scripts/build-deb.sh"))
        .env("CARGO", cargo)
        .output()
        .expect("running scripts/build-deb.sh");
    assert!(
        out.status.success(),
        "scripts/build-deb.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    let rel = text.lines().last().expect("build-deb.sh names the package");
    let deb = repo().join(rel.trim());
    assert!(deb.is_file(), "{} is missing", deb.display());
    deb
}

/// The same package as a newer version, to install over it.
fn repack_newer(deb: &Path, dir: &Path) -> (PathBuf, String) {
    let tree = dir.join("tree");
    run(
        "dpkg-deb",
        &["-R", deb.to_str().unwrap(), tree.to_str().unwrap()],
    );
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).unwrap();
    let old = text
        .lines()
        .find_map(|l| l.strip_prefix("Version: "))
        .expect("a Version line")
        .to_owned();
    let new = format!("{old}.1");
    std::fs::write(&control, text.replace(&old, &new)).unwrap();
    let out = dir.join("newer.deb");
    run(
        "dpkg-deb",
        &[
            "--root-owner-group",
            "-Zgzip",
            "-b",
            tree.to_str().unwrap(),
            out.to_str().unwrap(),
        ],
    );
    (out, new)
}

fn check_files() {
    let mut want: Vec<String> = ["sheep", "dog", "sheepfs", "cachectl"]
        .iter()
        .flat_map(|b| {
            [
                format!("/usr/bin/{b}"),
                format!("/usr/share/bash-completion/completions/{b}"),
                format!("/usr/share/zsh/vendor-completions/_{b}"),
                format!("/usr/share/fish/vendor_completions.d/{b}.fish"),
            ]
        })
        .collect();
    want.extend(
        [
            "/sbin/mount.fuse.sheepfs",
            "/lib/systemd/system/sheep@.service",
            CONF,
            "/usr/share/man/man8/sheep.8.gz",
            "/usr/share/man/man8/dog.8.gz",
            "/usr/share/man/man8/dog-vdi-create.8.gz",
            "/usr/share/man/man8/sheepfs.8.gz",
            "/usr/share/man/man8/mount.fuse.sheepfs.8.gz",
            "/usr/share/man/man1/cachectl.1.gz",
            "/usr/share/man/man1/cachectl-flush.1.gz",
        ]
        .map(String::from),
    );
    let listed = stdout(&run("dpkg", &["-L", PKG]));
    for f in &want {
        assert!(Path::new(f).exists(), "{f} is not installed");
        assert!(
            listed.lines().any(|l| l == f),
            "dpkg -L {PKG} does not list {f}"
        );
    }
    assert_eq!(
        std::fs::canonicalize("/sbin/mount.fuse.sheepfs").unwrap(),
        Path::new("/usr/bin/sheepfs")
    );
    let conffiles = stdout(&run("dpkg-query", &["-W", "-f=${Conffiles}", PKG]));
    assert!(
        conffiles.contains(CONF),
        "{CONF} is not a conffile: {conffiles}"
    );
    assert!(
        !listed.lines().any(|l| l.starts_with(DATA_ROOT)),
        "the package must not own data directories:\n{listed}"
    );
}

fn check_version() {
    for b in ["sheep", "dog", "sheepfs", "cachectl"] {
        let out = stdout(&run(&format!("/usr/bin/{b}"), &["--version"]));
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(
            words,
            [b, env!("CARGO_PKG_VERSION")],
            "{b} --version names the command and its version"
        );
    }
}

/// Every installed page reads with `man -l`, without a warning, and shows its options.
fn check_man_pages() {
    let pages = stdout(&run("dpkg", &["-L", PKG]));
    let pages: Vec<&str> = pages
        .lines()
        .filter(|l| l.starts_with("/usr/share/man/") && l.ends_with(".gz"))
        .collect();
    assert!(pages.len() > 10, "man pages: {pages:?}");
    for page in pages {
        let out = Command::new("man")
            .args(["-P", "cat", "-l", page])
            .env("MANWIDTH", "100")
            .env("LC_ALL", "C.UTF-8")
            .output()
            .expect("man (man-db: make deps installs it)");
        let text = stdout(&out);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && err.trim().is_empty(),
            "man -l {page}: {err}"
        );
        assert!(
            text.contains("NAME") && text.contains("SYNOPSIS"),
            "man -l {page}:\n{text}"
        );
    }
    let sheepfs = stdout(&run(
        "man",
        &["-P", "cat", "-l", "/usr/share/man/man8/sheepfs.8.gz"],
    ));
    assert!(
        sheepfs.contains("fuse.sheepfs") && sheepfs.contains("_netdev"),
        "{sheepfs}"
    );
}

fn check_completions() {
    for b in ["sheep", "dog", "sheepfs", "cachectl"] {
        let f = format!("/usr/share/bash-completion/completions/{b}");
        run("bash", &["-n", &f]);
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.contains(&format!("complete -F _{b}")), "{f}");
    }
    let fish = std::fs::read_to_string("/usr/share/fish/vendor_completions.d/sheep.fish").unwrap();
    assert!(
        fish.contains("complete -c sheep") && fish.contains("-l dir"),
        "{fish}"
    );
    let zsh = std::fs::read_to_string("/usr/share/zsh/vendor-completions/_dog").unwrap();
    assert!(zsh.starts_with("#compdef dog"), "{zsh}");
}

/// `systemd-analyze verify` on an instance of the unit, where systemd is installed.
fn check_unit() {
    let unit = std::fs::read_to_string("/lib/systemd/system/sheep@.service").unwrap();
    assert!(
        unit.contains("EnvironmentFile=/etc/sheep/%i.conf"),
        "{unit}"
    );
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("systemd-analyze is missing: the unit is not verified");
        return;
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "sheep@1.service"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "systemd-analyze verify sheep@1.service: {err}"
    );
    assert!(
        !err.contains("sheep@"),
        "systemd-analyze verify sheep@1.service: {err}"
    );
}

/// Files below `dir` with their sizes, sorted.
fn listing(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                todo.push(e.path());
            } else {
                out.push((e.path(), m.len()));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn the_package_installs_mounts_from_fstab_upgrades_and_keeps_data_when_removed() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("\n*** SKIPPED: not root, so the package is NOT installed and NOT tested\n");
        return;
    }
    let deb = build_deb();
    let scratch = tempfile::tempdir().unwrap();
    let guard = Installed::new();
    run("dpkg", &["-i", deb.to_str().unwrap()]);
    assert!(status().starts_with("install ok installed"), "{}", status());
    check_files();
    check_version();
    check_man_pages();
    check_completions();
    check_unit();

    // A cluster of the installed binaries, its data where the packaged config puts data.
    let bins = Bins::in_dir(Path::new("/usr/bin")).unwrap();
    let opts = ClusterOptions {
        dir: Some(guard.data.clone()),
        ..ClusterOptions::default()
    };
    let cluster = Cluster::try_start_with(&bins, 2, opts).unwrap();
    cluster.format(2, "4M");
    cluster.dog_ok(&["vdi", "create", "disk", "8M"]);
    let key = cluster.key_file();
    let mnt = scratch.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();

    // mount(8) runs the helper; an unknown option is refused, named, and nothing is mounted.
    let out = Command::new("mount")
        .args(["-t", "fuse.sheepfs", &cluster.addr(0)])
        .arg(&mnt)
        .args(["-o", "_netdev,cache-sise=1G"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a bad option mounted");
    assert!(err.contains("unknown mount option 'cache-sise'"), "{err}");
    assert!(!is_mounted(&mnt) && sheepfs_pids(&mnt).is_empty());

    // The fstab line of docs/sheepfs.md: mount returns once the mount is up.
    let log = scratch.path().join("sheepfs.log");
    let cache = scratch.path().join("cache");
    let fstab = scratch.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "{},{} {} fuse.sheepfs _netdev,nofail,x-systemd.requires=sheep@1.service,defaults,key-file={},cache-dir={},cache-size=64M,cache_mode=writeback,log-file={} 0 0\n",
            cluster.addr(0),
            cluster.addr(1),
            mnt.display(),
            key.display(),
            cache.display(),
            log.display()
        ),
    )
    .unwrap();
    let mount_guard = MountGuard(mnt.clone());
    run(
        "mount",
        &["--fstab", fstab.to_str().unwrap(), mnt.to_str().unwrap()],
    );
    assert!(is_mounted(&mnt), "mount returned before the mount was up");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info
        .lines()
        .find(|l| l.split(' ').nth(4) == mnt.to_str())
        .unwrap();
    // fuser mounts with mount(2) as root: the kernel lists type fuse, source sheepfs.
    assert!(
        line.contains(" - fuse") && line.contains(" sheepfs "),
        "{line}"
    );
    let pids = sheepfs_pids(&mnt);
    assert_eq!(pids.len(), 1, "one sheepfs serves the mount: {pids:?}");

    let data = testkit::pseudo_random(64 << 10, 45);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mnt.join("disk"))
        .unwrap();
    f.write_all_at(&data, 1 << 20).unwrap();
    f.sync_all().unwrap();
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, 1 << 20).unwrap();
    assert!(back == data, "read back through the mount");
    drop(f);
    assert!(
        cluster.read_vdi("disk", 1 << 20, data.len() as u64) == data,
        "fsync on the mount put the data in the cluster"
    );

    // umount ends sheepfs, which pushes its cache and exits.
    run("umount", &[mnt.to_str().unwrap()]);
    assert!(!is_mounted(&mnt));
    testkit::wait_until(
        "sheepfs to exit after umount",
        Duration::from_secs(30),
        || sheepfs_pids(&mnt).is_empty(),
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("cache clean: every write is in the cluster"),
        "{text}"
    );
    drop(mount_guard);
    drop(cluster);

    // An admin's edit of the config survives an upgrade and a removal; data survives all.
    let mut conf = std::fs::read_to_string(CONF).unwrap();
    conf.push_str("SHEEP_ARGS=--zone 7\n");
    std::fs::write(CONF, &conf).unwrap();
    let before = listing(&guard.data);
    assert!(before.len() > 4, "node data: {before:?}");

    let (newer, version) = repack_newer(&deb, scratch.path());
    run("dpkg", &["-i", newer.to_str().unwrap()]);
    assert_eq!(status(), format!("install ok installed {version}"));
    assert_eq!(
        std::fs::read_to_string(CONF).unwrap(),
        conf,
        "upgrade kept the edited config"
    );
    assert_eq!(listing(&guard.data), before, "upgrade kept the data");

    run("dpkg", &["-r", PKG]);
    assert!(
        status().starts_with("deinstall ok config-files"),
        "{}",
        status()
    );
    assert!(
        !Path::new("/usr/bin/sheep").exists() && !Path::new("/sbin/mount.fuse.sheepfs").exists()
    );
    assert_eq!(
        std::fs::read_to_string(CONF).unwrap(),
        conf,
        "remove kept the config"
    );
    assert_eq!(listing(&guard.data), before, "remove kept the data");

    run("dpkg", &["-P", PKG]);
    assert!(
        status().is_empty() || status().starts_with("unknown"),
        "{}",
        status()
    );
    assert!(!Path::new(CONF).exists(), "purge removes the conffile");
    assert_eq!(listing(&guard.data), before, "purge kept the data");
}
