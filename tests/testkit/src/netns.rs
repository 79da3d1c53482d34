//! Network namespaces as separate hosts on one machine, for tests of clusters across hosts.
//!
//! ```text
//!   root namespace: bridge tknb<pid><seq>  10.77.X.254/24   (etcd listens here; dog runs here)
//!        │ tknv<pid><seq><i>  (root side of a veth pair; cut(i) takes it down)
//!        │
//!   namespace tkn-<pid>-<seq>-<i>:  eth0 10.77.X.<i+1>/24, lo up   (one sheep, or a client)
//! ```
//!
//! - **Names** carry this process's pid and a per-process counter, so test binaries running in
//!   parallel never collide; `X` is a /24 no interface of the root namespace has yet, chosen
//!   and taken under an exclusive lock on `/tmp/testkit-netns.lock`. Leftovers of a process
//!   that no longer exists (a runner killed with SIGKILL) are deleted under the same lock.
//! - **Processes** run in namespace `i` through [`Netns::command`] / [`Netns::wrap`]:
//!   `nsenter --net=/run/netns/NAME -- PROG`. nsenter execs `PROG` (no fork), so the pid a
//!   [`crate::Proc`] holds is the program's, and the parent-death signal survives. Not
//!   `ip netns exec`: it also makes a new mount namespace, so a FUSE mount made inside would be
//!   invisible to the test.
//! - **[`Netns::cut`]** takes namespace `i`'s link to the bridge down: it reaches nobody and
//!   nobody reaches it (etcd included), its processes keep running. **[`Netns::heal`]** brings
//!   it back.
//! - **Drop** deletes every veth, namespace and the bridge, pass or fail. A namespace whose
//!   processes still run lives on, unnamed and without links, until they exit.
//!
//! Needs root and iproute2 (`ip netns`) and util-linux (`nsenter`): [`unavailable`]
//! says why not, so a suite can skip loudly.

use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::cluster::NodeHost;
use crate::error::{or_panic, Error, Result};
use crate::output;

/// Namespaces of one [`Netns`] at most (one hex digit in a veth's name).
pub const MAX: usize = 16;
const LOCK: &str = "/tmp/testkit-netns.lock";
const NS_PREFIX: &str = "tkn-";
const BRIDGE_PREFIX: &str = "tknb";
const VETH_PREFIX: &str = "tknv";

static SEQ: AtomicU32 = AtomicU32::new(0);

/// `n` network namespaces on one bridge; everything deleted on drop.
pub struct Netns {
    /// 10.77.`subnet`.0/24.
    subnet: u8,
    bridge: String,
    /// Namespace names, in order; only those created so far.
    names: Vec<String>,
    /// Root-side veth names, in order; only those created so far.
    veths: Vec<String>,
    tag: String,
}

/// Why namespaces cannot be made here (not root, no `ip netns`, no `nsenter`), or `None`.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need CAP_NET_ADMIN)".into());
    }
    let works = |prog: &str, args: &[&str]| {
        Command::new(prog)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works("ip", &["netns", "list"]) {
        return Some("`ip netns list` fails (install iproute2)".into());
    }
    if !works("nsenter", &["--version"]) {
        return Some("nsenter is missing (install util-linux)".into());
    }
    None
}

fn ip(args: &[&str]) -> Result<Vec<u8>> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    output(cmd, &format!("ip {}", args.join(" ")))
}

/// An exclusive `flock` on [`LOCK`], released on drop.
struct Locked(std::fs::File);

impl Locked {
    fn take() -> Result<Locked> {
        let f = std::fs::File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .map_err(|e| Error::io(format!("opening {LOCK}"), e))?;
        // SAFETY: a valid open descriptor.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::io(
                format!("locking {LOCK}"),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Locked(f))
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: a valid open descriptor.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

fn pid_gone(pid: Option<u32>) -> bool {
    pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists())
}

/// Deletes the namespaces, veths and bridges of test processes that no longer exist.
fn remove_leftovers() {
    let names = ip(&["netns", "list"]).unwrap_or_default();
    for line in String::from_utf8_lossy(&names).lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let pid = name
            .strip_prefix(NS_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse().ok());
        if pid_gone(pid) {
            eprintln!("testkit::netns: deleting namespace {name} left by process {pid:?}");
            let _ = ip(&["netns", "delete", name]);
        }
    }
    let links = ip(&["-o", "link", "show"]).unwrap_or_default();
    for line in String::from_utf8_lossy(&links).lines() {
        // "7: tknv0012ab001@if6: <...": the name, without the peer's suffix.
        let Some(name) = line
            .split(": ")
            .nth(1)
            .map(|n| n.split('@').next().unwrap_or(n))
        else {
            continue;
        };
        let pid = [BRIDGE_PREFIX, VETH_PREFIX]
            .iter()
            .find_map(|p| name.strip_prefix(p))
            .and_then(|r| r.get(..6))
            .and_then(|h| u32::from_str_radix(h, 16).ok());
        if pid_gone(pid) {
            eprintln!("testkit::netns: deleting link {name} left by process {pid:?}");
            let _ = ip(&["link", "delete", name]);
        }
    }
}

impl Netns {
    /// `n` namespaces on a fresh bridge; panics if they cannot be made.
    #[track_caller]
    pub fn new(n: usize) -> Netns {
        or_panic(Netns::try_new(n))
    }

    /// `n` (at most [`MAX`]) namespaces, each with `lo` up and `eth0` at 10.77.X.`i+1`/24 on a
    /// bridge at 10.77.X.254 in the root namespace. On an error, what was made is deleted.
    pub fn try_new(n: usize) -> Result<Netns> {
        if n > MAX {
            return Err(Error::Unexpected {
                what: "Netns::try_new".into(),
                detail: format!("{n} namespaces asked, at most {MAX}"),
            });
        }
        let pid = std::process::id();
        let seq = SEQ.fetch_add(1, Ordering::SeqCst) % 256;
        let tag = format!("{pid:06x}{seq:02x}");
        let lock = Locked::take()?;
        remove_leftovers();
        let used = String::from_utf8_lossy(&ip(&["-o", "-4", "addr", "show"])?).into_owned();
        let start = (pid as usize * 7 + seq as usize) % 250;
        let subnet = (0..250)
            .map(|k| ((start + k) % 250 + 1) as u8)
            .find(|x| !used.contains(&format!(" 10.77.{x}.")))
            .ok_or_else(|| Error::Unexpected {
                what: "10.77.0.0/16".into(),
                detail: "every /24 is in use".into(),
            })?;
        let mut me = Netns {
            subnet,
            bridge: String::new(),
            names: Vec::new(),
            veths: Vec::new(),
            tag: tag.clone(),
        };
        let bridge = format!("{BRIDGE_PREFIX}{tag}");
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        me.bridge = bridge.clone();
        ip(&[
            "addr",
            "add",
            &format!("{}/24", me.bridge_ip()),
            "dev",
            &bridge,
        ])?;
        ip(&["link", "set", &bridge, "up"])?;
        // The subnet is ours now: others see it in the root namespace's addresses.
        drop(lock);
        for i in 0..n {
            me.add(i)?;
        }
        Ok(me)
    }

    fn add(&mut self, i: usize) -> Result<()> {
        let name = format!("{NS_PREFIX}{}-{}-{i}", std::process::id(), self.tag);
        ip(&["netns", "add", &name])?;
        self.names.push(name.clone());
        let veth = format!("{VETH_PREFIX}{}{i:x}", self.tag);
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &name,
        ])?;
        self.veths.push(veth.clone());
        ip(&["link", "set", &veth, "master", &self.bridge])?;
        ip(&["link", "set", &veth, "up"])?;
        let addr = format!("{}/24", self.ip(i));
        ip(&["-n", &name, "addr", "add", &addr, "dev", "eth0"])?;
        ip(&["-n", &name, "link", "set", "eth0", "up"])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(())
    }

    /// How many namespaces there are.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Namespace `i`'s name (under `/run/netns`).
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// Namespace `i`'s address on the bridge, 10.77.X.`i+1`.
    pub fn ip(&self, i: usize) -> String {
        format!("10.77.{}.{}", self.subnet, i + 1)
    }

    /// The bridge's address in the root namespace, 10.77.X.254: where a service every
    /// namespace reaches (etcd) listens.
    pub fn bridge_ip(&self) -> String {
        format!("10.77.{}.254", self.subnet)
    }

    /// The prefix that runs a program in namespace `i`: `nsenter --net=/run/netns/NAME --`.
    pub fn wrap(&self, i: usize) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--net=/run/netns/{}", self.names[i]),
            "--".into(),
        ]
    }

    /// `prog` to run in namespace `i` (arguments still to add).
    pub fn command(&self, i: usize, prog: impl AsRef<std::ffi::OsStr>) -> Command {
        let w = self.wrap(i);
        let mut cmd = Command::new(&w[0]);
        cmd.args(&w[1..]).arg(prog);
        cmd
    }

    /// Where a node in namespace `i` runs, for [`crate::cluster::ClusterOptions::hosts`].
    pub fn host(&self, i: usize) -> NodeHost {
        NodeHost {
            ip: self.ip(i),
            wrap: self.wrap(i),
        }
    }

    /// Cuts namespace `i` off from everyone (its link to the bridge down); panics if `ip`
    /// fails.
    pub fn cut(&self, i: usize) {
        or_panic(ip(&["link", "set", &self.veths[i], "down"]).map(drop));
    }

    /// Connects namespace `i` again after [`Netns::cut`]; panics if `ip` fails.
    pub fn heal(&self, i: usize) {
        or_panic(ip(&["link", "set", &self.veths[i], "up"]).map(drop));
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // A veth's deletion takes its peer in the namespace with it.
        for v in &self.veths {
            if let Err(e) = ip(&["link", "delete", v]) {
                eprintln!("testkit::netns: {e}");
            }
        }
        for n in &self.names {
            if let Err(e) = ip(&["netns", "delete", n]) {
                eprintln!("testkit::netns: {e}");
            }
        }
        if !self.bridge.is_empty() {
            if let Err(e) = ip(&["link", "delete", &self.bridge]) {
                eprintln!("testkit::netns: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skip() -> bool {
        if let Some(why) = unavailable() {
            eprintln!("\n*** SKIPPED: network namespaces are unavailable: {why} ***\n");
            return true;
        }
        false
    }

    fn ping(ns: &Netns, from: usize, to: &str) -> bool {
        let mut cmd = ns.command(from, "sh");
        // bash's /dev/tcp is not everywhere: a connect to a closed port answers RST when the
        // host is reachable ("refused"), and times out when it is not.
        cmd.arg("-c").arg(format!(
            "timeout 2 bash -c 'exec 3<>/dev/tcp/{to}/9' 2>&1; true"
        ));
        let out = cmd.output().unwrap();
        String::from_utf8_lossy(&out.stdout).contains("refused")
    }

    #[test]
    fn namespaces_reach_each_other_until_cut_and_are_deleted() {
        if skip() {
            return;
        }
        let ns = Netns::new(2);
        let names: Vec<String> = (0..2).map(|i| ns.name(i).to_string()).collect();
        assert!(ping(&ns, 0, &ns.ip(1)), "ns0 cannot reach ns1");
        assert!(ping(&ns, 1, &ns.bridge_ip()), "ns1 cannot reach the bridge");
        ns.cut(1);
        assert!(!ping(&ns, 0, &ns.ip(1)), "ns1 reachable while cut");
        ns.heal(1);
        crate::wait_until(
            "ns1 to be reachable again",
            std::time::Duration::from_secs(10),
            || ping(&ns, 0, &ns.ip(1)),
        );
        drop(ns);
        let list = String::from_utf8_lossy(&ip(&["netns", "list"]).unwrap()).into_owned();
        for n in names {
            assert!(!list.contains(&n), "{n} outlived its Netns");
        }
    }
}
