//! Files of evicted objects, emptied and kept for the next object to be cached.
//!
//! Creating a file makes ext4 search for a free inode, and after many deletions (an eviction
//! run, `cachectl evict`) that search steps over every recently deleted inode: it took about
//! a sixth of sheepfs's CPU during a first sequential read after an evict. Reusing the files
//! of evicted objects avoids it.
//!
//! ```text
//! <cache>/spare/<n>.data, <n>.meta   both empty; a pair is complete when both exist
//! ```
//! Both files are truncated before they move here, so a file moved back into `obj/` is never
//! mistaken for a cached object: an empty meta file has no valid header and is dropped at
//! load. At start, complete pairs are kept and stray files removed.
//!
//! The renames are not made durable one by one (a directory fsync per eviction would cost a
//! journal commit each): the cache trusts its files after a restart only when the host did
//! not go down, or when the last mount ended cleanly, and a clean end fsyncs the directories
//! first (`Space::sync_dirs`).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Pairs kept at most (two empty inodes each).
const MAX_SPARES: usize = 4096;

pub struct Spares {
    dir: PathBuf,
    /// Numbers of complete pairs, and the next number to give out.
    state: Mutex<(Vec<u64>, u64)>,
}

impl Spares {
    /// Takes stock of `dir` (created if missing); without a usable directory nothing is kept.
    pub fn open(dir: PathBuf) -> Spares {
        let _ = fs::create_dir_all(&dir);
        let mut datas = Vec::new();
        let mut metas = std::collections::HashSet::new();
        let mut strays = Vec::new();
        for e in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let parsed = name
                .split_once('.')
                .and_then(|(n, ext)| Some((n.parse::<u64>().ok()?, ext.to_string())));
            match parsed {
                Some((n, ext)) if ext == "data" => datas.push(n),
                Some((n, ext)) if ext == "meta" => {
                    metas.insert(n);
                }
                _ => strays.push(e.path()),
            }
        }
        let mut free = Vec::new();
        for n in datas {
            if metas.remove(&n) && free.len() < MAX_SPARES {
                free.push(n);
            } else {
                strays.push(dir.join(format!("{n}.data")));
                metas.remove(&n);
                strays.push(dir.join(format!("{n}.meta")));
            }
        }
        strays.extend(metas.into_iter().map(|n| dir.join(format!("{n}.meta"))));
        for p in strays {
            let _ = fs::remove_file(p);
        }
        let next = free.iter().max().map_or(0, |m| m + 1);
        Spares {
            dir,
            state: Mutex::new((free, next)),
        }
    }

    /// The directory the spares are kept in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn paths(&self, n: u64) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("{n}.data")),
            self.dir.join(format!("{n}.meta")),
        )
    }

    /// Moves a spare pair to `data` and `meta` (their directory must exist); false if there is
    /// none or moving failed (the caller then creates the files).
    pub fn take_into(&self, data: &Path, meta: &Path) -> bool {
        let Some(n) = self.state.lock().unwrap().0.pop() else {
            return false;
        };
        let (sd, sm) = self.paths(n);
        if fs::rename(&sm, meta).is_ok() && fs::rename(&sd, data).is_ok() {
            return true;
        }
        let _ = fs::remove_file(sd);
        let _ = fs::remove_file(sm);
        false
    }

    /// Keeps the files of an evicted object, whose open handles are `data_file`/`meta_file`
    /// and nobody else uses: empties both (frees their blocks) and moves them here; removes
    /// them instead when the pool is full or anything fails.
    pub fn keep(&self, files: (&fs::File, &fs::File), data: &Path, meta: &Path) {
        let n = {
            let mut st = self.state.lock().unwrap();
            if st.0.len() >= MAX_SPARES {
                None
            } else {
                st.1 += 1;
                Some(st.1 - 1)
            }
        };
        let kept = n.filter(|&n| {
            let (sd, sm) = self.paths(n);
            files.1.set_len(0).is_ok()
                && files.0.set_len(0).is_ok()
                && fs::rename(meta, &sm).is_ok()
                && fs::rename(data, &sd).is_ok()
        });
        match kept {
            Some(n) => self.state.lock().unwrap().0.push(n),
            None => {
                let _ = fs::remove_file(data);
                let _ = fs::remove_file(meta);
                if let Some(n) = n {
                    let (sd, sm) = self.paths(n);
                    let _ = fs::remove_file(sd);
                    let _ = fs::remove_file(sm);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_take_and_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let (d, m) = (tmp.path().join("a.data"), tmp.path().join("a.meta"));
        fs::write(&d, vec![7u8; 8192]).unwrap();
        fs::write(&m, b"header").unwrap();
        let s = Spares::open(tmp.path().join("spare"));
        let fd = fs::File::options().write(true).open(&d).unwrap();
        let fm = fs::File::options().write(true).open(&m).unwrap();
        s.keep((&fd, &fm), &d, &m);
        assert!(!d.exists() && !m.exists());
        // A stray half pair is removed at start; the complete pair survives.
        fs::write(tmp.path().join("spare/9.meta"), b"").unwrap();
        let s = Spares::open(tmp.path().join("spare"));
        assert!(!tmp.path().join("spare/9.meta").exists());
        let (d2, m2) = (tmp.path().join("b.data"), tmp.path().join("b.meta"));
        assert!(s.take_into(&d2, &m2));
        // Emptied before it was kept: no stale header, no stale data.
        assert_eq!(fs::metadata(&d2).unwrap().len(), 0);
        assert_eq!(fs::metadata(&m2).unwrap().len(), 0);
        assert!(!s.take_into(&d, &m), "the pool is empty");
    }
}
