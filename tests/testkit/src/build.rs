//! The binaries under test, built before use: tests never run a stale `sheep`, `dog`, `sheepfs`
//! or `cachectl`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The packages whose binaries the end-to-end tests start.
const PACKAGES: [&str; 4] = ["objstore-node", "objstore-dog", "sheepfs", "cachectl"];

/// Builds every binary the tests use, once per process, in the profile of the running test
/// executable (`target/<profile>/deps/<test>`), and returns the directory holding them.
pub fn binaries() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("test executable path: {e}"))?;
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| format!("{} has no target directory", exe.display()))?
        .to_path_buf();
    let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--quiet")
        .arg("--manifest-path")
        .arg(&manifest)
        .arg("--bins");
    for p in PACKAGES {
        cmd.args(["-p", p]);
    }
    match profile {
        "debug" => {}
        "release" => {
            cmd.arg("--release");
        }
        other => {
            cmd.args(["--profile", other]);
        }
    }
    // The target directory of the running test, whatever CARGO_TARGET_DIR says now.
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let out = cmd.output().map_err(|e| format!("running {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    for name in ["sheep", "dog", "sheepfs", "cachectl"] {
        let p = dir.join(name);
        if !p.is_file() {
            return Err(format!("{} is missing after the build", p.display()));
        }
    }
    Ok(dir)
}
