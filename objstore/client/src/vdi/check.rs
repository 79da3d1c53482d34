//! Checking a VDI's objects (`dog vdi check`, `dog cluster check`): every owner of every object
//! (the inode, then each allocated index) is asked for its copy (`CheckObj`), the answers are
//! judged ([`objstore_proto::check::judge`]: the newest version wins; at one version a copy
//! that failed verification or whose digest is in a minority is bad), and each bad copy is
//! restored from a good one (`RepairObj` to its node). An object with no good copy is
//! unrecoverable: it is named and left as it is.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use serde::Serialize;

use super::{Vdi, VdiError, PARALLEL};
use crate::client::{Client, ClientError};
use objstore_proto::check::judge;
use objstore_proto::oid::ObjectId;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::version::Version;

/// How long a check waits before it looks again at an object whose copies disagree.
const RECHECK_AFTER: std::time::Duration = std::time::Duration::from_millis(200);

/// One object to check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub vdi: String,
    /// None for the inode.
    pub index: Option<u64>,
    pub oid: ObjectId,
    /// The erasure code of a data object of an erasure-coded VDI (checked strip by strip by
    /// its primary); None for copies.
    pub ec: Option<Redundancy>,
}

/// The objects of VDI `name`: its inode, then every allocated index (objects shared with an
/// ancestor included: the VDI reads them).
pub async fn targets(client: &Arc<Client>, name: &str) -> Result<Vec<Target>, VdiError> {
    let v = Vdi::open(client.clone(), name).await?;
    let vid = v.info().vid;
    let mut t = vec![Target {
        vdi: name.to_string(),
        index: None,
        oid: ObjectId::inode(vid),
        ec: None,
    }];
    let indexes = v.size().div_ceil(v.object_size() as u64);
    let ec = v.header().ec();
    t.extend((0..indexes).filter_map(|i| {
        v.object(i).map(|oid| Target {
            vdi: name.to_string(),
            index: Some(i),
            oid,
            ec,
        })
    }));
    Ok(t)
}

/// What a check does besides looking.
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckOptions {
    /// Report bad copies without repairing them.
    pub dry_run: bool,
    /// Compare states (versions, presence) only; read no bytes.
    pub state_only: bool,
}

/// A bad copy.
#[derive(Debug, Clone, Serialize)]
pub struct BadCopy {
    pub addr: SocketAddr,
    /// What is wrong with it.
    pub problem: String,
    /// Restored from a good copy.
    pub repaired: bool,
    /// Where it was restored from, or would be.
    pub source: Option<SocketAddr>,
    /// Why the repair failed, when it did.
    pub repair_error: Option<String>,
}

/// An owner not judged: it did not answer, or is recovering its copy.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    pub addr: SocketAddr,
    pub why: String,
}

/// One object whose copies were not all good.
#[derive(Debug, Clone, Serialize)]
pub struct ObjectReport {
    pub vdi: String,
    /// None for the inode.
    pub index: Option<u64>,
    pub oid: String,
    /// The newest version an owner holds (None: nothing anywhere).
    pub version: Option<Version>,
    pub bad: Vec<BadCopy>,
    pub skipped: Vec<Skipped>,
    /// Why no copy can be trusted, when none can.
    pub unrecoverable: Option<String>,
}

impl ObjectReport {
    fn is_clean(&self) -> bool {
        self.bad.is_empty() && self.skipped.is_empty() && self.unrecoverable.is_none()
    }

    /// `index 5 of VDI 'a'`, `inode of VDI 'a'`.
    pub fn what(&self) -> String {
        match self.index {
            Some(i) => format!("index {i} of VDI '{}'", self.vdi),
            None => format!("inode of VDI '{}'", self.vdi),
        }
    }
}

/// What a check found (see docs/operations.md, "Check and scrub").
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// The VDIs checked.
    pub vdis: Vec<String>,
    /// Objects checked (inodes included).
    pub objects: u64,
    /// Copies that answered.
    pub copies: u64,
    /// Bytes the nodes read to verify them.
    pub bytes: u64,
    /// Bad copies found.
    pub bad_copies: u64,
    /// Bad copies restored from a good one.
    pub repaired_copies: u64,
    /// Objects with at least one copy restored.
    pub repaired_objects: u64,
    /// Bad copies whose repair failed (the object has a good copy; run the check again).
    pub failed_repairs: u64,
    /// Objects with no good copy.
    pub unrecoverable_objects: u64,
    /// Copies not judged (their node did not answer or is recovering them).
    pub skipped_copies: u64,
    /// Every object that was not clean, with what was found and done.
    pub problems: Vec<ObjectReport>,
}

impl Summary {
    /// Something is left wrong: an unrecoverable object or a failed repair.
    pub fn failed(&self) -> bool {
        self.unrecoverable_objects > 0 || self.failed_repairs > 0
    }

    /// The unrecoverable objects, as `VDI 'a' index 5 (oid)` lines.
    pub fn unrecoverable(&self) -> impl Iterator<Item = &ObjectReport> {
        self.problems.iter().filter(|p| p.unrecoverable.is_some())
    }
}

/// Checks (and unless `opts.dry_run` repairs) `targets`, several objects at a time;
/// `progress` is called once per object checked.
pub async fn check(
    client: &Client,
    targets: Vec<Target>,
    opts: CheckOptions,
    mut progress: impl FnMut(&ObjectReport),
) -> Summary {
    let mut s = Summary::default();
    for t in &targets {
        if !s.vdis.contains(&t.vdi) {
            s.vdis.push(t.vdi.clone());
        }
    }
    let mut results = futures::stream::iter(targets)
        .map(|t| check_one(client, t, opts))
        .buffer_unordered(PARALLEL);
    while let Some((report, copies, bytes)) = results.next().await {
        progress(&report);
        s.objects += 1;
        s.copies += copies;
        s.bytes += bytes;
        s.bad_copies += report.bad.len() as u64;
        let repaired = report.bad.iter().filter(|b| b.repaired).count() as u64;
        s.repaired_copies += repaired;
        s.repaired_objects += u64::from(repaired > 0);
        s.failed_repairs += report
            .bad
            .iter()
            .filter(|b| b.repair_error.is_some())
            .count() as u64;
        s.unrecoverable_objects += u64::from(report.unrecoverable.is_some());
        s.skipped_copies += report.skipped.len() as u64;
        if !report.is_clean() {
            s.problems.push(report);
        }
    }
    s.problems
        .sort_by(|a, b| (&a.vdi, a.index).cmp(&(&b.vdi, b.index)));
    s
}

/// One object: its report, the copies that answered, the bytes read.
async fn check_one(client: &Client, t: Target, opts: CheckOptions) -> (ObjectReport, u64, u64) {
    let mut report = ObjectReport {
        vdi: t.vdi,
        index: t.index,
        oid: t.oid.to_string(),
        version: None,
        bad: Vec::new(),
        skipped: Vec::new(),
        unrecoverable: None,
    };
    if let Some(scheme) = t.ec {
        return check_ec(client, t.oid, scheme, opts, report).await;
    }
    let owners = match client.view().replicas(t.oid) {
        Ok(o) => o,
        Err(e) => {
            report.unrecoverable = Some(format!("no placement: {e}"));
            return (report, 0, 0);
        }
    };
    let ask = || {
        futures::future::join_all(owners.iter().map(|&a| async move {
            let r = client.check_obj(a, t.oid, opts.state_only).await;
            (a, r.map_err(|e: ClientError| e.to_string()))
        }))
    };
    let mut answers: Vec<(SocketAddr, Result<_, String>)> = ask().await;
    let first = judge(&answers);
    if !first.bad.is_empty() || first.unrecoverable.is_some() {
        // Copies caught between a change's owners (a write applied on some, not yet on
        // others) look behind: look again once the change is through, and judge that.
        tokio::time::sleep(RECHECK_AFTER).await;
        answers = ask().await;
    }
    let copies = answers.iter().filter(|(_, a)| a.is_ok()).count() as u64;
    let bytes = answers
        .iter()
        .filter_map(|(_, a)| a.as_ref().ok().map(|c| c.bytes))
        .sum();
    let j = judge(&answers);
    report.version = j.newest.map(|s| s.version);
    report.skipped = j
        .skipped
        .iter()
        .map(|(addr, why)| Skipped {
            addr: *addr,
            why: why.clone(),
        })
        .collect();
    report.unrecoverable = j.unrecoverable.clone();
    let source = j.good.first().copied();
    for (addr, bad) in &j.bad {
        let mut b = BadCopy {
            addr: *addr,
            problem: bad.to_string(),
            repaired: false,
            source,
            repair_error: None,
        };
        if let (false, Some(src), Some(newest), None) =
            (opts.dry_run, source, j.newest, &j.unrecoverable)
        {
            match client
                .repair_obj(*addr, t.oid, newest.version, Some(src))
                .await
            {
                Ok(_) => b.repaired = true,
                Err(e) => b.repair_error = Some(e.to_string()),
            }
        }
        report.bad.push(b);
    }
    (report, copies, bytes)
}

/// [`check_one`] of an erasure-coded object: its primary reads every strip back, judges
/// them (a checksum failing, a strip missing or behind, bytes that disagree with the other
/// strips) and rebuilds the bad ones unless this is a dry run. Its strips count as copies.
async fn check_ec(
    client: &Client,
    oid: ObjectId,
    scheme: Redundancy,
    opts: CheckOptions,
    mut report: ObjectReport,
) -> (ObjectReport, u64, u64) {
    match client.ec_check_obj(oid, scheme, !opts.dry_run).await {
        Ok(r) => {
            report.version = r.version;
            report.unrecoverable = r.unrecoverable;
            report.bad = (r.bad.into_iter())
                .map(|b| BadCopy {
                    addr: b.addr,
                    problem: format!("strip {}: {}", b.strip, b.problem),
                    repaired: b.repaired,
                    source: None,
                    repair_error: b.repair_error,
                })
                .collect();
            (report, r.strips, r.bytes)
        }
        // Never written (its map entry survived a crash that dropped it): nothing to judge.
        Err(ClientError::NotFound(_)) => (report, 0, 0),
        Err(e) => {
            report.unrecoverable = Some(format!("its primary could not check it: {e}"));
            (report, 0, 0)
        }
    }
}
