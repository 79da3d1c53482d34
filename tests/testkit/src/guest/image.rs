//! The guest's files: the kernel, initramfs and qemu that `scripts/fetch-guest.sh` fetches
//! from Debian's packages and builds into a directory (`target/guest` by default), made
//! once and reused.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::{or_panic, output, Error, Result};

/// The kernel, initramfs and qemu that `scripts/fetch-guest.sh` puts in a directory.
#[derive(Debug, Clone)]
pub struct GuestImage {
    pub dir: PathBuf,
    pub qemu: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
}

impl GuestImage {
    /// `$TESTKIT_GUEST_DIR`, or `target/guest` in the workspace (the script's default).
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("TESTKIT_GUEST_DIR") {
            Some(d) => PathBuf::from(d),
            None => workspace().join("target/guest"),
        }
    }

    /// Runs `scripts/fetch-guest.sh dir` (idempotent: it downloads and builds only what is
    /// missing or out of date, and takes a lock against a concurrent run) once per process
    /// and directory, and returns what it made.
    pub fn try_fetch(dir: &Path) -> Result<GuestImage> {
        static FETCHED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
        let mut fetched = FETCHED.lock().unwrap_or_else(|e| e.into_inner());
        if !fetched.iter().any(|d| d == dir) {
            let mut cmd = Command::new("bash");
            cmd.arg(workspace().join("scripts/fetch-guest.sh")).arg(dir);
            let out = output(cmd, "scripts/fetch-guest.sh")
                .map_err(|e| e.context("fetching the guest from Debian's packages"))?;
            let said = String::from_utf8_lossy(&out);
            if said.lines().count() > 1 {
                eprint!("{said}");
            }
            fetched.push(dir.to_path_buf());
        }
        let image = GuestImage {
            dir: dir.to_path_buf(),
            qemu: dir.join("bin/qemu-system-x86_64"),
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initramfs.cpio.gz"),
        };
        for f in [&image.qemu, &image.kernel, &image.initrd] {
            if !f.is_file() {
                return Err(Error::Binaries(format!(
                    "{} is missing after scripts/fetch-guest.sh",
                    f.display()
                )));
            }
        }
        Ok(image)
    }

    /// Like [`GuestImage::try_fetch`] on [`GuestImage::default_dir`]; panics on failure.
    #[track_caller]
    pub fn fetch() -> GuestImage {
        static IMAGE: OnceLock<GuestImage> = OnceLock::new();
        IMAGE
            .get_or_init(|| or_panic(GuestImage::try_fetch(&GuestImage::default_dir())))
            .clone()
    }

    /// The packages it was made of (`NAME=VERSION` lines).
    pub fn versions(&self) -> String {
        std::fs::read_to_string(self.dir.join("VERSIONS")).unwrap_or_default()
    }
}

/// The workspace's root directory.
fn workspace() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    root.canonicalize().unwrap_or(root)
}
