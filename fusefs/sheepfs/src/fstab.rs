//! `sheepfs` as a mount helper: `mount -t fuse.sheepfs CLUSTER MOUNTPOINT -o OPTIONS`, an
//! `/etc/fstab` line and systemd `.mount` units all run `/sbin/mount.fuse.sheepfs` (a link to
//! `sheepfs`) as
//!
//! ```text
//! mount.fuse.sheepfs CLUSTER MOUNTPOINT [-sfnv] [-o OPTIONS] [-t fuse.sheepfs]
//! ```
//!
//! This module turns that into the plain `sheepfs` command line: CLUSTER is `--cluster`, and
//! each `-o NAME=VALUE` is `--NAME VALUE` (`-o NAME` for a flag), NAME being any long option
//! of `sheepfs` (`_` may stand for `-`: `allow_other`). The names come from the clap
//! definition itself, so every option `sheepfs --help` lists has an `-o` spelling. Options
//! meant for mount(8), systemd or other tools (`_netdev`, `nofail`, `x-systemd.*`,
//! `defaults`, `noauto`, ...) are left out; any other name is refused, naming it (`-s`,
//! sloppy: skipped). The mount helper always returns once the mount is up, as mount(8)
//! expects, so `foreground` is refused.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use thiserror::Error;

/// The name mount(8) runs for `-t fuse.sheepfs`, installed as a link to `sheepfs`.
pub const HELPER: &str = "mount.fuse.sheepfs";

/// The `-o` spellings, for `sheepfs --help` (long) and the man page.
pub const LONG_HELP: &str = "\
Mounting with mount(8) and /etc/fstab: 'mount -t fuse.sheepfs CLUSTER MOUNTPOINT -o
OPTIONS' runs /sbin/mount.fuse.sheepfs (a link to sheepfs), which mounts in the
background and returns once the mount is up; 'umount MOUNTPOINT' ends it. CLUSTER is
--cluster; every other option above is -o NAME=VALUE, or -o NAME for a flag (_ may
stand for -). For example:

    mount -t fuse.sheepfs 10.0.0.1:7000,10.0.0.2:7000 /mnt/vdi \\
      -o key-file=/etc/sheep/cluster.key,cache-dir=/var/cache/sheepfs

An /etc/fstab line (one line, here split after commas):

    10.0.0.1:7000  /mnt/vdi  fuse.sheepfs  _netdev,nofail,
      x-systemd.requires=sheep@1.service,log-file=/var/log/sheepfs.log,
      key-file=/etc/sheep/cluster.key,cache-dir=/var/cache/sheepfs  0  0

Give log-file=PATH: without it the mount keeps logging to the stderr mount(8) had
(the journal, under systemd). Ignored (meant for mount, systemd or other tools):
defaults, rw, auto, noauto, user, nouser, users, owner, group, _netdev, nofail, exec,
noexec, suid, nosuid, dev, nodev, sync, async, atime, noatime, relatime, x-*,
comment=*. Any other unknown name is refused, naming it.";

/// Generic mount options that say nothing to sheepfs (sheepfs always mounts nosuid, nodev,
/// noatime).
const GENERIC: &[&str] = &[
    "defaults",
    "rw",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "exec",
    "noexec",
    "suid",
    "nosuid",
    "dev",
    "nodev",
    "sync",
    "async",
    "dirsync",
    "atime",
    "noatime",
    "relatime",
    "norelatime",
    "strictatime",
    "lazytime",
    "nolazytime",
    "diratime",
    "nodiratime",
    "silent",
    "loud",
];

/// Options of `sheepfs` with no `-o` spelling: given otherwise, or meaningless here.
const NOT_OPTIONS: &[&str] = &["cluster", "foreground", "help", "version"];

/// A mount helper command line that cannot be followed: each names what is wrong.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum HelperError {
    #[error("usage: {HELPER} CLUSTER MOUNTPOINT [-sfnv] [-o OPTIONS] ({0})")]
    Usage(String),
    #[error("unknown mount option '{0}' (sheepfs takes: {1}; see sheepfs --help)")]
    Unknown(String, String),
    #[error("mount option '{0}' needs a value: {0}=VALUE")]
    NeedsValue(String),
    #[error("mount option '{0}' takes no value (got '{0}={1}')")]
    NoValue(String, String),
    #[error("mount option 'ro': sheepfs mounts are read-write")]
    ReadOnly,
    #[error("mount option '{0}': give the cluster as the first field (CLUSTER), not as an option")]
    Cluster(String),
    #[error("mount option 'foreground': {HELPER} returns once the mount is up; run 'sheepfs --foreground' for a foreground mount")]
    Foreground,
    #[error("-N: mounting into another mount namespace is not supported")]
    Namespace,
}

/// What the helper is asked to do.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// `-f` (fake): do everything but mount, i.e. nothing beyond checking the options.
    Fake,
    /// Run `sheepfs` with these arguments (program name excluded).
    Mount(Vec<OsString>),
}

/// Whether this process was started as a mount helper (`argv[0]` ends in `mount.*`).
pub fn called_as_helper(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .and_then(OsStr::to_str)
        .is_some_and(|n| n.starts_with("mount."))
}

/// Turns a mount helper's arguments (program name excluded) into `sheepfs`'s, using `cmd`
/// (the `sheepfs` clap definition) to know its options and which take a value.
pub fn sheepfs_args(cmd: &clap::Command, args: &[OsString]) -> Result<Request, HelperError> {
    let mut positional = Vec::new();
    let mut options: Vec<String> = Vec::new();
    let (mut fake, mut sloppy) = (false, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let s = a.to_string_lossy();
        match s.as_ref() {
            "-o" => {
                let v = it
                    .next()
                    .ok_or_else(|| HelperError::Usage("-o needs OPTIONS".into()))?;
                options.extend(v.to_string_lossy().split(',').map(str::to_owned));
            }
            "-t" => {
                it.next();
            }
            "-N" => return Err(HelperError::Namespace),
            f if f.starts_with("-o") && f.len() > 2 => {
                options.extend(f[2..].split(',').map(str::to_owned));
            }
            f if f.starts_with('-') && f.len() > 1 => {
                for c in f[1..].chars() {
                    match c {
                        'f' => fake = true,
                        's' => sloppy = true,
                        'n' | 'v' => {}
                        _ => return Err(HelperError::Usage(format!("unknown flag -{c}"))),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [cluster, mountpoint] = positional.as_slice() else {
        return Err(HelperError::Usage(format!(
            "expected CLUSTER and MOUNTPOINT, got {} argument(s)",
            positional.len()
        )));
    };
    let mut out: Vec<OsString> = vec!["--cluster".into(), cluster.clone(), mountpoint.clone()];
    for opt in options.iter().filter(|o| !o.is_empty()) {
        let (name, value) = match opt.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (opt.as_str(), None),
        };
        if GENERIC.contains(&name) || name.starts_with("x-") || name == "comment" {
            continue;
        }
        let long = name.replace('_', "-");
        match long.as_str() {
            "ro" => return Err(HelperError::ReadOnly),
            "cluster" => return Err(HelperError::Cluster(name.into())),
            "foreground" => return Err(HelperError::Foreground),
            _ => {}
        }
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && !NOT_OPTIONS.contains(&long.as_str()));
        let Some(arg) = arg else {
            if sloppy {
                eprintln!("{HELPER}: ignoring unknown mount option '{name}' (-s)");
                continue;
            }
            return Err(HelperError::Unknown(name.into(), option_names(cmd)));
        };
        let takes_value = arg.get_action().takes_values();
        match (takes_value, value) {
            (true, Some(v)) => out.extend([format!("--{long}").into(), v.into()]),
            (true, None) => return Err(HelperError::NeedsValue(name.into())),
            (false, None) => out.push(format!("--{long}").into()),
            (false, Some(v)) => return Err(HelperError::NoValue(name.into(), v.into())),
        }
    }
    Ok(if fake {
        Request::Fake
    } else {
        Request::Mount(out)
    })
}

/// The `-o` names `sheepfs` takes, for an error message.
fn option_names(cmd: &clap::Command) -> String {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| a.get_long())
        .filter(|l| !NOT_OPTIONS.contains(l))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction, Command};

    /// The shape of sheepfs's command line: options with values, flags, a positional.
    fn cli() -> Command {
        Command::new("sheepfs")
            .arg(Arg::new("cluster").long("cluster").required(true))
            .arg(Arg::new("mountpoint").required(true))
            .arg(
                Arg::new("foreground")
                    .long("foreground")
                    .action(ArgAction::SetTrue),
            )
            .arg(Arg::new("cache_dir").long("cache-dir"))
            .arg(Arg::new("cache_size").long("cache-size"))
            .arg(
                Arg::new("allow_other")
                    .long("allow-other")
                    .action(ArgAction::SetTrue),
            )
    }

    fn run(args: &[&str]) -> Result<Request, HelperError> {
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        sheepfs_args(&cli(), &args)
    }

    fn mount(args: &[&str]) -> Vec<String> {
        match run(args).unwrap() {
            Request::Mount(v) => v.into_iter().map(|s| s.into_string().unwrap()).collect(),
            Request::Fake => panic!("fake"),
        }
    }

    #[test]
    fn options_become_flags() {
        let got = mount(&[
            "h:7000,h:7001",
            "/mnt",
            "-o",
            "rw,_netdev,cache-dir=/c,cache_size=10G,allow_other,x-systemd.requires=sheep@1.service,nofail",
            "-t",
            "fuse.sheepfs",
        ]);
        assert_eq!(
            got,
            [
                "--cluster",
                "h:7000,h:7001",
                "/mnt",
                "--cache-dir",
                "/c",
                "--cache-size",
                "10G",
                "--allow-other"
            ]
        );
        assert_eq!(mount(&["-n", "c:1", "/m"]), ["--cluster", "c:1", "/m"]);
        assert_eq!(
            run(&["c:1", "/m", "-fv", "-o", "defaults"]).unwrap(),
            Request::Fake
        );
    }

    #[test]
    fn bad_options_are_named() {
        let e = run(&["c:1", "/m", "-o", "cache-dir=/c,bogus=1"]).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("'bogus'") && msg.contains("cache-size"),
            "{msg}"
        );
        let e = run(&["c:1", "/m", "-o", "cache-dir"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'cache-dir' needs a value"), "{e}");
        let e = run(&["c:1", "/m", "-o", "allow_other=1"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("'allow_other' takes no value"), "{e}");
        assert!(matches!(
            run(&["c:1", "/m", "-o", "ro"]),
            Err(HelperError::ReadOnly)
        ));
        assert!(matches!(
            run(&["c:1", "/m", "-o", "foreground"]),
            Err(HelperError::Foreground)
        ));
        assert!(matches!(
            run(&["c:1", "/m", "-o", "cluster=x:1"]),
            Err(HelperError::Cluster(_))
        ));
        let e = run(&["c:1"]).unwrap_err().to_string();
        assert!(e.contains("CLUSTER and MOUNTPOINT"), "{e}");
        assert!(matches!(
            run(&["c:1", "/m", "-N", "1"]),
            Err(HelperError::Namespace)
        ));
        assert!(matches!(
            run(&["c:1", "/m", "-o"]),
            Err(HelperError::Usage(_))
        ));
    }

    #[test]
    fn sloppy_skips_unknown_options() {
        assert_eq!(
            mount(&["-s", "c:1", "/m", "-o", "bogus,cache-dir=/c"]),
            ["--cluster", "c:1", "/m", "--cache-dir", "/c"]
        );
    }

    #[test]
    fn helper_is_recognised_by_its_name() {
        assert!(called_as_helper(OsStr::new("/sbin/mount.fuse.sheepfs")));
        assert!(called_as_helper(OsStr::new("mount.fuse.sheepfs")));
        assert!(!called_as_helper(OsStr::new("/usr/bin/sheepfs")));
    }
}
