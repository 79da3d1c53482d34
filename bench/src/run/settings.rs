//! What a run measures: the profile's defaults and matrix, command-line overrides, and their
//! validation. Everything here is plain data, checked before any process starts.

use std::collections::BTreeSet;

use anyhow::{bail, Result};
use clap::ValueEnum;

use super::fio::Engine;
use super::RunArgs;
use objstore_proto::redundancy::Redundancy;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The membership driver of every cluster the bench starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Membership {
    /// The nodes share a state directory (the default, as `make run`).
    #[default]
    Local,
    /// A one-member etcd started for each cluster (as `CLUSTER=etcd make run`).
    Etcd,
}

impl Membership {
    pub fn name(self) -> &'static str {
        match self {
            Membership::Local => "local",
            Membership::Etcd => "etcd",
        }
    }
}

/// How much to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    /// Everything, at full size, key figures repeated (30–60 minutes).
    Full,
    /// A subset at small sizes, for a look in a few minutes.
    Quick,
    /// A tiny version of every group, so CI keeps the whole harness working.
    Smoke,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Full => "full",
            Profile::Quick => "quick",
            Profile::Smoke => "smoke",
        }
    }
}

/// A group of figures (the `group` of a figure id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Group {
    Iops,
    Sweep,
    Throughput,
    Cache,
    Flush,
    Dog,
    Objsize,
    Scaling,
    Metadata,
    Snapshot,
    Handover,
    Scale,
    Raid,
}

impl Group {
    pub fn name(self) -> &'static str {
        match self {
            Group::Iops => "iops",
            Group::Sweep => "sweep",
            Group::Throughput => "throughput",
            Group::Cache => "cache",
            Group::Flush => "flush",
            Group::Dog => "dog",
            Group::Objsize => "objsize",
            Group::Scaling => "scaling",
            Group::Metadata => "metadata",
            Group::Snapshot => "snapshot",
            Group::Handover => "handover",
            Group::Scale => "scale",
            Group::Raid => "raid",
        }
    }

    /// Whether its figures are measured on the main cluster (the others start their own).
    pub fn on_main_cluster(self) -> bool {
        !matches!(
            self,
            Group::Objsize
                | Group::Scaling
                | Group::Metadata
                | Group::Snapshot
                | Group::Handover
                | Group::Scale
                | Group::Raid
        )
    }

    pub fn all() -> &'static [Group] {
        &[
            Group::Iops,
            Group::Sweep,
            Group::Throughput,
            Group::Cache,
            Group::Flush,
            Group::Dog,
            Group::Objsize,
            Group::Scaling,
            Group::Metadata,
            Group::Snapshot,
            Group::Handover,
            Group::Scale,
            Group::Raid,
        ]
    }
}

/// 4 KiB random workloads of the `iops` group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IopsRw {
    /// `randread`.
    Read,
    /// `randrw --rwmixread=80`.
    Mix,
}

/// The jobs and sizes a profile measures (the command line sets size, runtime and rounds).
#[derive(Debug, Clone)]
pub struct Matrix {
    /// Per workload, the engines (with their depth or job count) it runs with.
    pub iops: Vec<(IopsRw, Vec<Engine>)>,
    /// Cache sizes of the hit-ratio sweep, in percent of the file.
    pub sweep_pcts: Vec<u32>,
    /// Block sizes of the sequential `throughput` jobs.
    pub throughput_bs: Vec<u64>,
    /// Queue depths of the cache goal figures (4k random read and writeback write).
    pub cache_depths: Vec<u32>,
    /// Passes of the first read (cold and cache off) in each round ([`super::fio::FioJob::passes`]).
    pub first_read_passes: usize,
    /// Object sizes of the `objsize` table, one formatted cluster each.
    pub objsize_objects: Vec<u64>,
    /// Block sizes of the `objsize` table.
    pub objsize_bs: Vec<u64>,
    /// Largest file of the `objsize` jobs (the run's size when smaller).
    pub objsize_file_cap: u64,
    /// (nodes, copies) of the `scaling` clusters.
    pub scaling: Vec<(usize, usize)>,
    /// Largest file of the `scaling` jobs.
    pub scaling_file_cap: u64,
    /// VDIs created for the `metadata` figures.
    pub metadata_vdis: usize,
    /// Dirty data in the holder's cache at a `handover` figure's hand-over.
    pub handover_dirty: u64,
    /// Hand-overs without dirty data per round of the `handover` group, per kind of mount.
    pub handover_bare: usize,
    /// Nodes of the `scale` group's simulated clusters, and the entries each holds.
    pub scale_nodes: Vec<usize>,
    pub scale_per_node: u64,
    /// Objects per node of the `scale` group's two-node restarts.
    pub scale_objects: Vec<u64>,
    /// Objects in the file store whose index the `scale` group measures.
    pub scale_file_objects: u64,
    /// Objects of the node the `scale` group reads while peers list it.
    pub scale_listed: u64,
    /// Redundancy schemes of the `raid` table (a cluster each per object size).
    pub raid_schemes: Vec<Redundancy>,
    /// Object sizes of the `raid` table.
    pub raid_objects: Vec<u64>,
    /// Block sizes of the `raid` table's sequential jobs.
    pub raid_bs: Vec<u64>,
    /// Nodes of each `raid` cluster (at least the widest scheme's strips).
    pub raid_nodes: usize,
    /// Largest file of the `raid` jobs.
    pub raid_file_cap: u64,
}

fn schemes(list: &[&str]) -> Vec<Redundancy> {
    list.iter()
        .map(|r| r.parse().expect("a scheme of the profile"))
        .collect()
}

impl Matrix {
    pub fn of(profile: Profile) -> Matrix {
        let seq_bs = vec![16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB];
        match profile {
            Profile::Full => {
                let engines = vec![
                    Engine::Sync,
                    Engine::Psync(1),
                    Engine::Psync(4),
                    Engine::Psync(10),
                    Engine::Libaio(1),
                    Engine::Libaio(4),
                    Engine::Libaio(16),
                    Engine::Libaio(64),
                ];
                Matrix {
                    iops: vec![(IopsRw::Read, engines.clone()), (IopsRw::Mix, engines)],
                    sweep_pcts: vec![0, 25, 50, 75, 100],
                    throughput_bs: seq_bs.clone(),
                    cache_depths: vec![1, 16],
                    first_read_passes: 8,
                    objsize_objects: vec![MIB, 4 * MIB, 16 * MIB],
                    objsize_bs: seq_bs,
                    objsize_file_cap: u64::MAX,
                    scaling: vec![(1, 1), (3, 1), (3, 2), (3, 3), (6, 1), (6, 2), (6, 3)],
                    scaling_file_cap: 256 * MIB,
                    metadata_vdis: 1000,
                    handover_dirty: 256 * MIB,
                    handover_bare: 6,
                    // 200 (--scale-nodes 10,50,200) did not settle its kill within 16
                    // minutes: docs/architecture.md, "Recovery's cost".
                    scale_nodes: vec![10, 50],
                    scale_per_node: 150_000,
                    scale_objects: vec![10_000, 100_000, 1_000_000, 10_000_000],
                    scale_file_objects: 200_000,
                    scale_listed: 1_000_000,
                    raid_schemes: schemes(&["2", "3", "2:1", "4:2"]),
                    raid_objects: vec![MIB, 4 * MIB],
                    raid_bs: vec![4 * KIB, 64 * KIB, MIB],
                    raid_nodes: 6,
                    raid_file_cap: 256 * MIB,
                }
            }
            Profile::Quick => Matrix {
                iops: vec![
                    (IopsRw::Read, vec![Engine::Libaio(1), Engine::Libaio(16)]),
                    (IopsRw::Mix, vec![Engine::Libaio(16)]),
                ],
                sweep_pcts: vec![0, 50, 100],
                throughput_bs: vec![MIB],
                cache_depths: vec![1, 16],
                first_read_passes: 2,
                objsize_objects: vec![MIB, 16 * MIB],
                objsize_bs: vec![MIB],
                objsize_file_cap: 64 * MIB,
                scaling: vec![(1, 1), (3, 3)],
                scaling_file_cap: 64 * MIB,
                metadata_vdis: 100,
                handover_dirty: 64 * MIB,
                handover_bare: 4,
                scale_nodes: vec![10, 50],
                scale_per_node: 30_000,
                scale_objects: vec![10_000, 100_000],
                scale_file_objects: 20_000,
                scale_listed: 100_000,
                raid_schemes: schemes(&["3", "4:2"]),
                raid_objects: vec![4 * MIB],
                raid_bs: vec![MIB],
                raid_nodes: 6,
                raid_file_cap: 64 * MIB,
            },
            Profile::Smoke => Matrix {
                iops: vec![
                    (IopsRw::Read, vec![Engine::Libaio(16)]),
                    (IopsRw::Mix, vec![Engine::Psync(4)]),
                ],
                sweep_pcts: vec![0, 100],
                throughput_bs: vec![MIB],
                cache_depths: vec![16],
                first_read_passes: 1,
                objsize_objects: vec![MIB, 4 * MIB],
                objsize_bs: vec![MIB],
                objsize_file_cap: 16 * MIB,
                scaling: vec![(1, 1), (3, 3)],
                scaling_file_cap: 16 * MIB,
                metadata_vdis: 10,
                handover_dirty: 16 * MIB,
                handover_bare: 2,
                scale_nodes: vec![10],
                scale_per_node: 3_000,
                scale_objects: vec![10_000],
                scale_file_objects: 2_000,
                scale_listed: 10_000,
                raid_schemes: schemes(&["3", "2:1"]),
                raid_objects: vec![4 * MIB],
                raid_bs: vec![MIB],
                raid_nodes: 3,
                raid_file_cap: 16 * MIB,
            },
        }
    }
}

/// Everything a run needs to know, resolved from the arguments and the profile.
#[derive(Debug, Clone)]
pub struct Settings {
    pub profile: Profile,
    pub nodes: usize,
    pub copies: usize,
    pub object_size: u64,
    /// File/VDI size of the fio jobs on the main cluster (and of `dog` and `flush`).
    pub size: u64,
    pub runtime_s: u64,
    pub rounds: usize,
    pub groups: BTreeSet<Group>,
    /// Only the key steps (goal figures and their references).
    pub key_only: bool,
    pub matrix: Matrix,
    pub membership: Membership,
}

impl Settings {
    /// The profile's defaults overridden by the command line, validated.
    pub fn resolve(args: &RunArgs) -> Result<Settings> {
        let (size, runtime_s, rounds) = match args.profile {
            Profile::Full => (GIB, 10, 3),
            Profile::Quick => (256 * MIB, 2, 1),
            Profile::Smoke => (16 * MIB, 1, 1),
        };
        let mut groups: BTreeSet<Group> = if args.only.is_empty() {
            Group::all().iter().copied().collect()
        } else {
            args.only.iter().copied().collect()
        };
        if args.key_only {
            groups.retain(|g| {
                !matches!(
                    g,
                    Group::Objsize
                        | Group::Scaling
                        | Group::Metadata
                        | Group::Snapshot
                        | Group::Raid
                )
            });
        }
        let s = Settings {
            profile: args.profile,
            nodes: args.nodes,
            copies: args.copies,
            object_size: args.object_size,
            size: args.size.unwrap_or(size),
            runtime_s: args.runtime.unwrap_or(runtime_s),
            rounds: args.rounds.unwrap_or(rounds),
            groups,
            key_only: args.key_only,
            membership: args.membership,
            matrix: Matrix {
                scale_nodes: (args.scale_nodes.clone())
                    .map(|n| n.into_iter().filter(|&n| n > 0).collect())
                    .unwrap_or(Matrix::of(args.profile).scale_nodes),
                ..Matrix::of(args.profile)
            },
        };
        s.validate()?;
        Ok(s)
    }

    fn validate(&self) -> Result<()> {
        if self.nodes == 0 {
            bail!("--nodes must be at least 1");
        }
        if self.copies == 0 || self.copies > self.nodes {
            bail!(
                "--copies {} must be between 1 and --nodes ({})",
                self.copies,
                self.nodes
            );
        }
        let o = self.object_size;
        if !o.is_power_of_two() || !(MIB..=64 * MIB).contains(&o) {
            bail!(
                "--object-size {} must be a power of two from 1M to 64M",
                objstore_proto::size::format_size(o)
            );
        }
        if self.size < 4 * MIB || !self.size.is_multiple_of(MIB) {
            bail!(
                "--size {} must be a whole number of MiB, at least 4M (the largest block size)",
                objstore_proto::size::format_size(self.size)
            );
        }
        if self.runtime_s == 0 {
            bail!("--runtime must be at least 1 second");
        }
        if self.rounds == 0 {
            bail!("--rounds must be at least 1");
        }
        Ok(())
    }

    pub fn runs(&self, group: Group) -> bool {
        self.groups.contains(&group)
    }

    /// File size of the `objsize` jobs.
    pub fn objsize_file(&self) -> u64 {
        self.size.min(self.matrix.objsize_file_cap)
    }

    /// File size of the `scaling` jobs.
    pub fn scaling_file(&self) -> u64 {
        self.size.min(self.matrix.scaling_file_cap)
    }
}

/// Parses a human size (`4M`, `1G`, `512k`, plain bytes) as dog does, for clap.
pub fn parse_size_arg(text: &str) -> Result<u64, String> {
    objstore_proto::size::parse_size(text).map_err(|e| e.to_string())
}

/// A block size as fio and job names spell it: `4k`, `64k`, `1m`, `4m`.
pub fn size_label(bytes: u64) -> String {
    if bytes >= MIB && bytes.is_multiple_of(MIB) {
        format!("{}m", bytes / MIB)
    } else if bytes >= KIB && bytes.is_multiple_of(KIB) {
        format!("{}k", bytes / KIB)
    } else {
        bytes.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        args: RunArgs,
    }

    fn settings(argv: &[&str]) -> Result<Settings> {
        let mut full = vec!["bench"];
        full.extend_from_slice(argv);
        let w = Wrap::try_parse_from(full).map_err(|e| anyhow::anyhow!("{e}"))?;
        Settings::resolve(&w.args)
    }

    #[test]
    fn profile_defaults_and_overrides() {
        let s = settings(&[]).unwrap();
        assert_eq!((s.size, s.runtime_s, s.rounds), (GIB, 10, 3));
        assert_eq!(s.groups.len(), Group::all().len());
        let s = settings(&["--profile", "quick", "--size", "64M", "--only", "iops,dog"]).unwrap();
        assert_eq!((s.size, s.runtime_s, s.rounds), (64 * MIB, 2, 1));
        assert!(s.runs(Group::Iops) && s.runs(Group::Dog) && !s.runs(Group::Sweep));
        let s = settings(&["--profile", "smoke"]).unwrap();
        assert_eq!(s.objsize_file(), 16 * MIB);
        let s = settings(&["--key-only"]).unwrap();
        assert!(s.key_only && s.runs(Group::Iops) && !s.runs(Group::Metadata));
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        let err = |argv: &[&str]| settings(argv).unwrap_err().to_string();
        assert!(err(&["--size", "12Q"]).contains("not a size"));
        assert!(err(&["--only", "iops,nope"]).contains("nope"));
        assert!(err(&["--copies", "4"]).contains("--copies 4"));
        assert!(err(&["--object-size", "3M"]).contains("power of two"));
        assert!(err(&["--size", "1000k"]).contains("whole number of MiB"));
        assert!(err(&["--rounds", "0"]).contains("--rounds"));
        assert!(err(&["--nodes", "0"]).contains("--nodes"));
    }

    #[test]
    fn labels() {
        assert_eq!(size_label(4096), "4k");
        assert_eq!(size_label(MIB), "1m");
        assert_eq!(size_label(16 * MIB), "16m");
        assert_eq!(size_label(100), "100");
    }
}
