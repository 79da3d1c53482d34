//! The cache's object files on disk as a whole: finding them at start, removing them.

use std::fs;
use std::path::Path;

use crate::object::{paths, sums_path, Key};

/// Every (key) with a meta file under `dir`; removes data files without one. Only at start.
pub fn scan(dir: &Path) -> Vec<Key> {
    let mut out = Vec::new();
    let Ok(vids) = fs::read_dir(dir) else {
        return out;
    };
    for v in vids.flatten() {
        let Some(vid) = v
            .file_name()
            .to_str()
            .and_then(|s| u32::from_str_radix(s, 16).ok())
        else {
            continue;
        };
        let Ok(files) = fs::read_dir(v.path()) else {
            continue;
        };
        for f in files.flatten() {
            let name = f.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(stem) = name.strip_suffix(".data").or(name.strip_suffix(".sums")) {
                // A data (or sums) file whose meta file is gone (sheepfs died creating or
                // retiring the object) holds nothing the cache can trust.
                if !v.path().join(format!("{stem}.meta")).exists() {
                    let _ = fs::remove_file(f.path());
                }
                continue;
            }
            let Some(idx) = name
                .strip_suffix(".meta")
                .and_then(|s| u32::from_str_radix(s, 16).ok())
            else {
                continue;
            };
            out.push((vid, idx));
        }
    }
    out
}

/// Removes every `.sums` file under `dir`: an older sheepfs wrote into the cache since they
/// were written (see [`crate::dir::DirState::sums`]), so its objects load unverified.
pub fn drop_sums(dir: &Path) {
    let mut dropped = 0;
    for v in fs::read_dir(dir).into_iter().flatten().flatten() {
        for f in fs::read_dir(v.path()).into_iter().flatten().flatten() {
            if f.path().extension().is_some_and(|e| e == "sums")
                && fs::remove_file(f.path()).is_ok()
            {
                dropped += 1;
            }
        }
    }
    if dropped > 0 {
        tracing::warn!(
            "cache {}: an older sheepfs used it since its checksums were written: {dropped} \
             object(s) load without checksums",
            dir.display()
        );
    }
}

/// Removes the files of `key` (used when its meta file cannot be trusted).
pub fn remove_key(dir: &Path, key: Key) {
    let (d, m) = paths(dir, key);
    let _ = fs::remove_file(d);
    let _ = fs::remove_file(sums_path(&m));
    let _ = fs::remove_file(m);
}
