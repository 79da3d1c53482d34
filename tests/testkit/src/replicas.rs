//! Replica checks: for every object of a VDI, every copy the cluster reports is read from its
//! node's disk and compared, so a test can say "all replicas agree" and mean it.
//!
//! [`check`] asks `dog vdi objects NAME --json` where each object (the inode and every allocated
//! data object) should be (`placement`) and who holds it at which `version`, then reads each
//! holder's copy straight from its file `<node_dir>/obj/<oid>.<version on disk>`. It returns a [`Report`] when
//! every object has exactly the expected number of copies (the VDI's copies, or every node when
//! there are fewer), on exactly its placement, in as many distinct zones as the nodes allow, all
//! at one version and with identical bytes; otherwise [`Problems`], naming each disagreeing object and
//! node. The judgement itself ([`judge`]) is a pure function, unit-tested below with bad inputs.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

use crate::cluster::Cluster;

/// One node's copy of an object, as `dog` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub addr: String,
    /// The object's version on that node (see objstore_proto::version).
    pub version: u64,
    /// The copy is a tombstone (a deleted object).
    pub deleted: bool,
}

/// Where one object should be and where it is (one entry of `dog vdi object(s) --json`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectReplicas {
    /// None for the inode object.
    pub index: Option<u64>,
    /// None for a hole.
    pub oid: Option<String>,
    /// The nodes that should hold it in the current epoch, in ring order: reads go to the
    /// first one first.
    pub placement: Vec<String>,
    /// The nodes that hold it, with their versions, sorted by address.
    pub holders: Vec<Holder>,
}

impl ObjectReplicas {
    /// Parses one object entry printed by `dog vdi object NAME INDEX --json`.
    pub fn from_json(v: &Value) -> Result<ObjectReplicas, String> {
        let addr = |a: &Value| {
            a.as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("address {a} is not a string in {v}"))
        };
        let placement = v["placement"]
            .as_array()
            .ok_or_else(|| format!("no placement list in {v}"))?
            .iter()
            .map(addr)
            .collect::<Result<Vec<_>, _>>()?;
        let mut holders = v["holders"]
            .as_array()
            .ok_or_else(|| format!("no holders list in {v}"))?
            .iter()
            .map(|h| {
                Ok(Holder {
                    addr: addr(&h["addr"])?,
                    version: h["version"]
                        .as_u64()
                        .ok_or_else(|| format!("bad version in {h}"))?,
                    deleted: h["deleted"].as_bool().unwrap_or(false),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        holders.sort_by(|a, b| a.addr.cmp(&b.addr));
        Ok(ObjectReplicas {
            index: v["index"].as_u64(),
            oid: v["oid"].as_str().map(str::to_string),
            placement,
            holders,
        })
    }

    /// The holders' addresses, sorted.
    pub fn addrs(&self) -> Vec<String> {
        self.holders.iter().map(|h| h.addr.clone()).collect()
    }

    /// The placement, sorted (to compare with [`ObjectReplicas::addrs`]).
    pub fn placement_sorted(&self) -> Vec<String> {
        let mut p = self.placement.clone();
        p.sort();
        p
    }

    /// The distinct versions of the copies, sorted.
    pub fn versions(&self) -> Vec<u64> {
        let mut s: Vec<u64> = self.holders.iter().map(|h| h.version).collect();
        s.sort_unstable();
        s.dedup();
        s
    }

    /// `index 5 (object 00000a0000000005)` or `inode (object 80000a0000000000)`.
    pub fn name(&self) -> String {
        let what = match self.index {
            Some(i) => format!("index {i}"),
            None => "inode".to_string(),
        };
        format!("{what} (object {})", self.oid.as_deref().unwrap_or("none"))
    }
}

/// One disagreement: which object, which node (when one node is to blame), what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub object: String,
    pub node: Option<String>,
    pub what: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.node {
            Some(n) => write!(f, "{} on {n}: {}", self.object, self.what),
            None => write!(f, "{}: {}", self.object, self.what),
        }
    }
}

/// Everything that disagreed in one VDI.
#[derive(Debug, Clone)]
pub struct Problems {
    pub vdi: String,
    pub problems: Vec<Problem>,
}

impl Problems {
    fn one(vdi: &str, what: String) -> Problems {
        Problems {
            vdi: vdi.to_string(),
            problems: vec![Problem {
                object: format!("VDI '{vdi}'"),
                node: None,
                what,
            }],
        }
    }
}

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "replicas of VDI '{}' disagree ({} problem(s)):",
            self.vdi,
            self.problems.len()
        )?;
        for p in &self.problems {
            writeln!(f, "  {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

/// What a successful check covered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub vdi: String,
    /// Objects checked, the inode included.
    pub objects: usize,
    /// Copies each object has.
    pub copies: usize,
    /// Copies read from disk and compared.
    pub copies_read: usize,
}

/// A copy's bytes as read from one node's disk (or why it could not be read).
pub type CopyBytes = Result<Vec<u8>, String>;

/// The nodes of the cluster with their zones.
pub type Zones = BTreeMap<String, u32>;

/// Judges objects against `copies` expected copies on the nodes of `zones` (each holder's
/// zone; copies must cover `min(copies, distinct zones)` zones). `bytes(object, holder)` gives
/// that holder's copy. Pure: no cluster needed, so the judgement is tested on its own.
pub fn judge(
    vdi: &str,
    objects: &[ObjectReplicas],
    copies: usize,
    zones: &Zones,
    mut bytes: impl FnMut(&ObjectReplicas, &Holder) -> CopyBytes,
) -> Result<Report, Problems> {
    let zone_count = zones.values().collect::<BTreeSet<_>>().len();
    let mut problems = Vec::new();
    let mut copies_read = 0;
    for o in objects {
        let object = o.name();
        let mut say = |node: Option<&str>, what: String| {
            problems.push(Problem {
                object: object.clone(),
                node: node.map(str::to_string),
                what,
            })
        };
        if o.oid.is_none() {
            say(
                None,
                "no object id (a hole where an object was expected)".into(),
            );
            continue;
        }
        if o.placement.len() != copies {
            say(
                None,
                format!(
                    "placement names {} node(s) {:?}, expected {copies}",
                    o.placement.len(),
                    o.placement
                ),
            );
        }
        if o.holders.len() != copies {
            say(
                None,
                format!(
                    "{} cop(ies) on {:?}, expected {copies}",
                    o.holders.len(),
                    o.addrs()
                ),
            );
        }
        for p in &o.placement {
            if !o.holders.iter().any(|h| &h.addr == p) {
                say(Some(p), "placed here but holds no copy".into());
            }
        }
        for h in &o.holders {
            if !o.placement.contains(&h.addr) {
                say(
                    Some(&h.addr),
                    format!(
                        "holds a copy (version {}) but is not in its placement",
                        h.version
                    ),
                );
            }
        }
        let mut held_zones = BTreeSet::new();
        for h in &o.holders {
            match zones.get(&h.addr) {
                Some(z) => {
                    held_zones.insert(*z);
                }
                None => say(
                    Some(&h.addr),
                    "holds a copy but is not a node of the view".into(),
                ),
            }
        }
        let want_zones = copies.min(zone_count);
        if held_zones.len() < want_zones {
            say(
                None,
                format!(
                    "copies in {} zone(s) {held_zones:?}, expected {want_zones} distinct",
                    held_zones.len()
                ),
            );
        }
        let newest = o.holders.iter().map(|h| h.version).max();
        if o.versions().len() > 1 {
            for h in &o.holders {
                if Some(h.version) != newest {
                    say(
                        Some(&h.addr),
                        format!(
                            "stale version {} (newest {})",
                            h.version,
                            newest.unwrap_or_default()
                        ),
                    );
                }
            }
        }
        // Bytes: copies may differ in file length only by trailing zeros (bytes past the end
        // of a file read as zeros). Copies are grouped by content; when one group is larger
        // than every other, the copies outside it are the ones named, else every copy is.
        let mut groups: Vec<(Vec<u8>, Vec<&str>)> = Vec::new();
        for h in &o.holders {
            let mut data = match bytes(o, h) {
                Ok(d) => d,
                Err(e) => {
                    say(Some(&h.addr), format!("copy unreadable: {e}"));
                    continue;
                }
            };
            copies_read += 1;
            let end = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
            data.truncate(end);
            match groups.iter_mut().find(|(d, _)| *d == data) {
                Some((_, nodes)) => nodes.push(&h.addr),
                None => groups.push((data, vec![&h.addr])),
            }
        }
        if groups.len() > 1 {
            groups.sort_by_key(|(_, nodes)| std::cmp::Reverse(nodes.len()));
            let majority = groups[0].1.len() > groups[1].1.len();
            let (reference, others) = if majority {
                (&groups[0], &groups[1..])
            } else {
                (&groups[0], &groups[..])
            };
            for (data, nodes) in others {
                for n in nodes {
                    let what = if majority {
                        format!(
                            "bytes differ from the {} agreeing cop(ies) on {:?}, first at \
                             offset {}",
                            reference.1.len(),
                            reference.1,
                            first_difference(&reference.0, data).unwrap_or(0)
                        )
                    } else {
                        format!(
                            "bytes differ from another copy and no version has a majority \
                             ({} versions among {} copies)",
                            groups.len(),
                            o.holders.len()
                        )
                    };
                    say(Some(n), what);
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(Report {
            vdi: vdi.to_string(),
            objects: objects.len(),
            copies,
            copies_read,
        })
    } else {
        Err(Problems {
            vdi: vdi.to_string(),
            problems,
        })
    }
}

/// The first offset where `a` and `b` differ, a missing tail counting as zeros.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    let n = a.len().max(b.len());
    (0..n).find(|&i| a.get(i).copied().unwrap_or(0) != b.get(i).copied().unwrap_or(0))
}

fn dog_json(c: &Cluster, args: &[&str]) -> Result<Value, String> {
    let mut a = args.to_vec();
    a.push("--json");
    let out = c.try_dog(&a).map_err(|e| e.chain())?;
    if !out.status.success() {
        return Err(format!(
            "dog {a:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("dog {a:?} printed bad JSON: {e}"))
}

/// Where object `index` of VDI `name` should be and is (`dog vdi object NAME INDEX`).
pub fn object(c: &Cluster, name: &str, index: u64) -> Result<ObjectReplicas, String> {
    ObjectReplicas::from_json(&dog_json(c, &["vdi", "object", name, &index.to_string()])?)
}

/// Every object of VDI `name`, its inode first (`dog vdi objects NAME`).
pub fn objects(c: &Cluster, name: &str) -> Result<Vec<ObjectReplicas>, String> {
    let v = dog_json(c, &["vdi", "objects", name])?;
    v.as_array()
        .ok_or_else(|| format!("dog vdi objects printed {v}, not a list"))?
        .iter()
        .map(ObjectReplicas::from_json)
        .collect()
}

/// The file holding `addr`'s copy of `oid`, if `addr` is one of the cluster's nodes and holds
/// data for it. Its name carries the version last flushed, which may be older than the
/// version the node reports, so the file is found by the object id.
pub fn copy_path(c: &Cluster, addr: &str, oid: &str) -> Option<PathBuf> {
    let i = (0..c.ports.len()).find(|&i| c.addr(i) == addr)?;
    let dir = c.node_dir(i).join("obj");
    let prefix = format!("{oid}.");
    std::fs::read_dir(&dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with(&prefix) && !n.ends_with(".del"))
        .map(|n| dir.join(n))
}

/// Checks every replica of every object of VDI `name` (see the module doc). Call it when the
/// cluster is quiet (after [`Cluster::wait_recovered`]): a write in flight makes copies differ.
pub fn check(c: &Cluster, name: &str) -> Result<Report, Problems> {
    let fail = |what: String| Problems::one(name, what);
    let info = dog_json(c, &["vdi", "info", name]).map_err(fail)?;
    let want = info["copies"]
        .as_u64()
        .ok_or_else(|| fail(format!("no copies in {info}")))?;
    let nodes = dog_json(c, &["node", "list"]).map_err(fail)?;
    let zones: Zones = nodes
        .as_array()
        .ok_or_else(|| fail(format!("dog node list printed {nodes}")))?
        .iter()
        .map(|n| match (n["addr"].as_str(), n["zone"].as_u64()) {
            (Some(a), Some(z)) => Ok((a.to_string(), z as u32)),
            _ => Err(fail(format!("no addr or zone in {n}"))),
        })
        .collect::<Result<_, _>>()?;
    let copies = (want as usize).min(zones.len());
    let objs = objects(c, name).map_err(fail)?;
    let allocated = info["allocated_objects"].as_u64().unwrap_or(0) as usize;
    let data_objects = objs.iter().filter(|o| o.index.is_some()).count();
    if data_objects != allocated {
        return Err(fail(format!(
            "dog vdi objects listed {data_objects} data object(s), vdi info says {allocated}"
        )));
    }
    judge(name, &objs, copies, &zones, |o, h| {
        let oid = o.oid.as_deref().unwrap_or_default();
        if h.deleted {
            return Ok(Vec::new());
        }
        let path = copy_path(c, &h.addr, oid)
            .ok_or_else(|| format!("{} holds no file for {oid}", h.addr))?;
        copy_data(&path).map_err(|e| format!("{}: {e}", path.display()))
    })
}

/// Bytes before an object's data in a node's object file: the store's header with its block
/// checksums (`HEADER_LEN` in `objstore/node/src/store/sums.rs`, which asserts the two agree).
pub const OBJECT_HEADER_LEN: u64 = 69632;
const OBJECT_MAGIC: &[u8; 8] = b"SHEEPOBJ";

/// The object's bytes in the node's object file at `path`, without the store's header (a file
/// without the header, as stores before checksums wrote them, is returned whole).
pub fn copy_data(path: &std::path::Path) -> std::io::Result<Vec<u8>> {
    let mut b = std::fs::read(path)?;
    if b.starts_with(OBJECT_MAGIC) && b.len() as u64 >= OBJECT_HEADER_LEN {
        b.drain(..OBJECT_HEADER_LEN as usize);
    }
    Ok(b)
}

/// Where the table of block sums starts in an object file, and the bytes a sum covers
/// (`TABLE_AT`, `BLOCK` in `objstore/node/src/store/sums.rs`).
const SUMS_AT: u64 = 64;
const SUM_BLOCK: usize = 4096;

/// Overwrites `bytes` of the object's data at `at` in the node's object file at `path`, behind
/// the node's back, and rewrites the sums of the blocks they touch: wrong bytes that pass every
/// block checksum (as a bug above the store would leave them), found only by comparing copies
/// or parity. The file must hold the bytes already (no growth). The new file is made aside
/// (in the store's `.tmp`, which the node clears when it opens) and renamed over the old one,
/// so a read by the node meanwhile (its scrub) sees either file whole, never new bytes under
/// old sums.
pub fn rewrite_sealed(path: &std::path::Path, at: u64, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::read(path)?;
    let len = (file.len() as u64).saturating_sub(OBJECT_HEADER_LEN);
    if at + bytes.len() as u64 > len {
        return Err(std::io::Error::other(format!(
            "{}: {} bytes at {at} are past the object's {len}",
            path.display(),
            bytes.len()
        )));
    }
    let data_at = (OBJECT_HEADER_LEN + at) as usize;
    file[data_at..data_at + bytes.len()].copy_from_slice(bytes);
    let zero_sum = crc_fast::crc32_iscsi(&[0u8; SUM_BLOCK]);
    let first = at / SUM_BLOCK as u64;
    let end = (at + bytes.len() as u64).div_ceil(SUM_BLOCK as u64);
    for b in first..end {
        let mut block = vec![0u8; SUM_BLOCK];
        let n = (len - b * SUM_BLOCK as u64).min(SUM_BLOCK as u64) as usize;
        let from = (OBJECT_HEADER_LEN + b * SUM_BLOCK as u64) as usize;
        block[..n].copy_from_slice(&file[from..from + n]);
        let sum = crc_fast::crc32_iscsi(&block) ^ zero_sum;
        let s = (SUMS_AT + 4 * b) as usize;
        file[s..s + 4].copy_from_slice(&sum.to_le_bytes());
    }
    let dir = path.parent().expect("an object file is in a directory");
    let tmp = dir.join(".tmp").join(format!(
        "rewrite-{}",
        path.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&tmp, &file)?;
    std::fs::rename(&tmp, path)
}

/// [`check`], panicking with the problems.
pub fn assert_consistent(c: &Cluster, name: &str) -> Report {
    check(c, name).unwrap_or_else(|p| panic!("{p}"))
}

/// Waits until the cluster's view (as `dog node list` shows it) is exactly the nodes `nodes`:
/// [`Cluster::wait_members`] counts nodes, and an older view can have the same count.
pub fn wait_view(c: &Cluster, nodes: &[usize]) {
    let mut want: Vec<String> = nodes.iter().map(|&i| c.addr(i)).collect();
    want.sort();
    crate::wait_until(
        &format!("the view to be exactly {want:?}"),
        std::time::Duration::from_secs(20),
        || {
            let Ok(v) = dog_json(c, &["node", "list"]) else {
                return false;
            };
            let mut got: Vec<String> = v
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n["addr"].as_str().map(str::to_string))
                .collect();
            got.sort();
            got == want
        },
    );
}

/// How long node `i`'s log is now: pass it to [`log_since`] to see only what comes after.
pub fn log_mark(c: &Cluster, i: usize) -> u64 {
    std::fs::metadata(node_log(c, i)).map_or(0, |m| m.len())
}

/// What node `i` logged after `mark` (its log is appended to by every start of the node).
pub fn log_since(c: &Cluster, i: usize, mark: u64) -> String {
    let b = std::fs::read(node_log(c, i)).unwrap_or_default();
    String::from_utf8_lossy(&b[(mark as usize).min(b.len())..]).into_owned()
}

fn node_log(c: &Cluster, i: usize) -> PathBuf {
    c.dir.path().join(format!("node{i}.log"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(index: u64, placement: &[&str], holders: &[(&str, u64)]) -> ObjectReplicas {
        ObjectReplicas {
            index: Some(index),
            oid: Some(format!("{:016x}", 0x0a_0000_0000u64 | index)),
            placement: placement.iter().map(|s| s.to_string()).collect(),
            holders: holders
                .iter()
                .map(|(a, s)| Holder {
                    addr: a.to_string(),
                    version: *s,
                    deleted: false,
                })
                .collect(),
        }
    }

    /// a, b, c, one zone each.
    fn zones() -> Zones {
        [("a", 1), ("b", 2), ("c", 3)]
            .into_iter()
            .map(|(a, z)| (a.to_string(), z))
            .collect()
    }

    fn same(_: &ObjectReplicas, _: &Holder) -> CopyBytes {
        Ok(vec![7; 16])
    }

    #[test]
    fn agreeing_replicas_pass() {
        let o = [
            obj(0, &["a", "b"], &[("a", 3), ("b", 3)]),
            obj(1, &["b", "c"], &[("b", 5), ("c", 5)]),
        ];
        let r = judge("v", &o, 2, &zones(), same).unwrap();
        assert_eq!((r.objects, r.copies, r.copies_read), (2, 2, 4));
    }

    #[test]
    fn trailing_zeros_do_not_count() {
        let o = [obj(0, &["a", "b"], &[("a", 3), ("b", 3)])];
        judge("v", &o, 2, &zones(), |_, h| {
            Ok(if h.addr == "a" {
                vec![1, 2, 0, 0]
            } else {
                vec![1, 2]
            })
        })
        .unwrap();
    }

    #[test]
    fn each_kind_of_disagreement_is_named() {
        let o = [
            // Stale version on b.
            obj(0, &["a", "b"], &[("a", 4), ("b", 3)]),
            // One copy missing: c is placed but holds nothing.
            obj(1, &["a", "c"], &[("a", 3)]),
            // A copy outside the placement, three copies.
            obj(2, &["a", "b"], &[("a", 3), ("b", 3), ("c", 3)]),
            // Bytes differ on c.
            obj(3, &["b", "c"], &[("b", 3), ("c", 3)]),
        ];
        let e = judge("v", &o, 2, &zones(), |o, h| {
            Ok(if o.index == Some(3) && h.addr == "c" {
                vec![7, 7, 8]
            } else {
                vec![7; 3]
            })
        })
        .unwrap_err();
        let text = e.to_string();
        let has = |obj: u64, node: Option<&str>, what: &str| {
            e.problems.iter().any(|p| {
                p.object.starts_with(&format!("index {obj} "))
                    && p.node.as_deref() == node
                    && p.what.contains(what)
            })
        };
        assert!(has(0, Some("b"), "stale version 3 (newest 4)"), "{text}");
        assert!(has(1, Some("c"), "placed here but holds no copy"), "{text}");
        assert!(has(1, None, "1 cop(ies)"), "{text}");
        assert!(has(2, Some("c"), "not in its placement"), "{text}");
        assert!(has(2, None, "3 cop(ies)"), "{text}");
        assert!(has(3, Some("b"), "no version has a majority"), "{text}");
        assert!(has(3, Some("c"), "no version has a majority"), "{text}");
        assert!(has(1, None, "copies in 1 zone(s)"), "{text}");
        assert_eq!(e.problems.len(), 8, "{text}");
    }

    #[test]
    fn the_odd_copy_out_is_named() {
        let o = [obj(0, &["a", "b", "c"], &[("a", 3), ("b", 3), ("c", 3)])];
        let e = judge("v", &o, 3, &zones(), |_, h| {
            Ok(if h.addr == "a" {
                vec![1, 9]
            } else {
                vec![1, 2]
            })
        })
        .unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        assert_eq!(e.problems[0].node.as_deref(), Some("a"), "{e}");
        assert!(
            e.problems[0].what.contains(
                r#"differ from the 2 agreeing cop(ies) on ["b", "c"], first at offset 1"#
            ),
            "{e}"
        );
    }

    #[test]
    fn copies_sharing_a_zone_are_a_problem_when_zones_allow() {
        let mut z = zones();
        z.insert("b".into(), 1);
        let o = [obj(0, &["a", "b"], &[("a", 3), ("b", 3)])];
        let e = judge("v", &o, 2, &z, same).unwrap_err();
        assert!(
            e.problems[0]
                .what
                .contains("copies in 1 zone(s) {1}, expected 2 distinct"),
            "{e}"
        );
        // With one zone only, copies cannot do better.
        let one: Zones = [("a".to_string(), 1), ("b".to_string(), 1)].into();
        judge("v", &o, 2, &one, same).unwrap();
    }

    #[test]
    fn unreadable_copy_and_hole_are_problems() {
        let mut hole = obj(1, &[], &[]);
        hole.oid = None;
        let o = [obj(0, &["a"], &[("a", 1)]), hole];
        let e = judge("v", &o, 1, &zones(), |_, _| Err("gone".into())).unwrap_err();
        assert!(e.problems[0].what.contains("unreadable: gone"), "{e}");
        assert!(e.problems[1].what.contains("hole"), "{e}");
    }
}
