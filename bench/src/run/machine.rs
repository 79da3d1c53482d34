//! What the run ran on (CPU, memory, kernel, the scratch disk's filesystem, fio), and UTC
//! timestamps, for the report header.

use std::path::Path;
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::figures::Machine;

/// Best effort: a field that cannot be read stays empty (or zero).
pub fn probe(work: &Path) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    Machine {
        cpus: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        mem_gib: mem_gib(&meminfo),
        cpu_model: field(&cpuinfo, "model name").unwrap_or_default(),
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        fs: fs_type(work).unwrap_or_default(),
        fio_version: Command::new("fio")
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default(),
    }
}

/// `key : value` from /proc/cpuinfo-like text.
fn field(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim().to_string())
    })
}

fn mem_gib(meminfo: &str) -> f64 {
    let kib: f64 = field(meminfo, "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    (kib / (1u64 << 20) as f64 * 10.0).round() / 10.0
}

/// Appended to the filesystem type of an ext4 mount without a journal: there, creating a
/// file skips every inode freed in the last minutes (ext4's `recently_deleted`), so object
/// creation runs several times slower for up to 5 minutes after many files were deleted.
pub const NO_JOURNAL: &str = " (no journal)";

/// The filesystem type of the mount holding `path` (the longest mount point above it), with
/// [`NO_JOURNAL`] for an ext4 mount without a journal.
fn fs_type(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (fs, source) = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let mount = Path::new(f.get(4)?);
            let sep = f.iter().position(|x| *x == "-")?;
            let fs = f.get(sep + 1)?;
            let source = f.get(sep + 2).copied().unwrap_or_default();
            path.starts_with(mount).then(|| {
                (
                    mount.components().count(),
                    (fs.to_string(), source.to_string()),
                )
            })
        })
        .max_by_key(|(depth, _)| *depth)
        .map(|(_, m)| m)?;
    let no_journal = fs == "ext4" && ext4_has_journal(&source) == Some(false);
    Some(if no_journal { fs + NO_JOURNAL } else { fs })
}

/// Whether the ext4 filesystem on device `source` (`/dev/vda`) has a journal, from
/// `/sys/fs/ext4/<device>/journal_task` (`<none>` without one); None when unknown.
fn ext4_has_journal(source: &str) -> Option<bool> {
    let dev = Path::new(source).file_name()?;
    let task =
        std::fs::read_to_string(Path::new("/sys/fs/ext4").join(dev).join("journal_task")).ok()?;
    Some(task.trim() != "<none>")
}

/// Now, as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    utc(secs)
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ`, from the date dog prints.
fn utc(secs: u64) -> String {
    let text = objstore_client::lock::format_utc(secs);
    let date_time = text.trim_end_matches(" UTC").replacen(' ', "T", 1);
    format!("{date_time}Z")
}

/// The command line, each argument quoted when it needs it.
pub fn command_line() -> String {
    std::env::args()
        .map(|a| {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=,:".contains(c))
            {
                a
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_000_000), "2026-11-30T00:53:20Z");
    }

    #[test]
    fn probes_this_machine() {
        let m = probe(Path::new("/"));
        assert!(m.cpus >= 1);
        assert!(m.mem_gib > 0.0);
        assert!(!m.fs.is_empty());
        assert_eq!(
            field("a : 1\nmodel name\t: X Y\n", "model name").as_deref(),
            Some("X Y")
        );
    }
}
