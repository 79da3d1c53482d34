//! The cache checks its blocks after a restart (issue 25, docs/cache.md "Checksums"): data
//! written through a writeback cache and pushed, sheepfs killed with `kill -9`, a byte of a
//! cached block flipped in its data file, sheepfs mounted again: the read gets the right
//! bytes (fetched again from the cluster), and `cachectl stats` counts the corrupt block.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::{block_pattern, cachectl_ok, open_rw, rig_with_cache_and, stats, strs, SHEEPFS};
use testkit::mount::Mount;

/// The cached data files under `cache/obj`.
fn data_files(cache: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for vdir in std::fs::read_dir(cache.join("obj")).unwrap().flatten() {
        for f in std::fs::read_dir(vdir.path()).unwrap().flatten() {
            if f.path().extension().is_some_and(|e| e == "data") {
                out.push(f.path());
            }
        }
    }
    out
}

#[test]
fn a_byte_flipped_in_a_cached_block_while_sheepfs_was_down_is_never_served() {
    let (_tmp, mut rig, cache, args) = rig_with_cache_and(3, 3, "64M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "v", "8M"]);
    let want: Vec<u8> = (0..16).flat_map(|i| block_pattern(i + 1)).collect();
    let file = open_rw(rig.path("v"));
    file.write_all_at(&want, 0).unwrap();
    drop(file);
    // Pushed: the cached blocks are clean, the cluster holds the same bytes.
    cachectl_ok(&cache, &["flush"]);
    assert_eq!(stats(&cache)["dirty"], 0);
    rig.mount.kill9();

    let files = data_files(&cache);
    assert_eq!(files.len(), 1, "one cached object: {files:?}");
    // The data file (sparse, as long as the blocks written) with one byte of block 5 flipped.
    let mut raw = std::fs::read(&files[0]).unwrap();
    let at = 5 * 4096 + 123;
    assert_eq!(
        raw[..want.len()],
        want[..],
        "the cache held the written bytes"
    );
    raw[at] = !raw[at];
    std::fs::write(&files[0], &raw).unwrap();

    rig.mount = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(0),
        &rig.mount.dir,
        &rig.cluster.dir.path().join("sheepfs-2.log"),
        &strs(&args),
    );
    let mut got = vec![0u8; want.len()];
    open_rw(rig.path("v")).read_exact_at(&mut got, 0).unwrap();
    assert!(got == want, "the read got the cluster's bytes");
    let st = stats(&cache);
    assert_eq!(st["total"]["corrupt_blocks"], 1, "{st}");
    // The block was fetched again: read again, still right, nothing more found.
    let mut again = vec![0u8; want.len()];
    open_rw(rig.path("v")).read_exact_at(&mut again, 0).unwrap();
    assert!(again == want);
    assert_eq!(stats(&cache)["total"]["corrupt_blocks"], 1);
    let text = String::from_utf8(cachectl_ok(&cache, &["stats"]).stdout).unwrap();
    assert!(text.contains("Corrupt blocks:  1 "), "{text}");
    rig.mount.unmount_and_wait();
}
