//! Real etcd servers for tests of the etcd membership driver and of clusters across hosts.
//!
//! [`Etcd::single`] starts one member, [`Etcd::start`] (alias [`EtcdCluster::start`]) a
//! cluster of `n` members bootstrapped with `--initial-cluster`, all on loopback ports with
//! their data directories and logs (`m<i>.log`) in one temporary directory. A start returns
//! once every member logs that it serves client traffic at its own address and answers
//! `GET /health` with `"health":"true"` on its client URL (plain HTTP over a [`TcpStream`]),
//! so a member of another test that took the port meanwhile never passes for ours.
//!
//! Members are [`Proc`]s: in their own process groups, killed with the thread that started
//! them, and killed by pid on drop, the end of their logs printed when the test panics.
//! [`Etcd::stop`] (SIGTERM), [`Etcd::kill`] (SIGKILL) and [`Etcd::start_member`] (the same
//! name, ports and data directory) fault a member.
//!
//! The binary is `$ETCD_BIN`, else `/usr/bin/etcd` (Debian's etcd-server, which
//! `scripts/install-deps.sh` installs); [`etcd_binary`] is `None` when it is missing, so a
//! suite can skip its etcd cases with a loud message.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::error::{or_panic, Error, Result};
use crate::{log_tail, try_free_port, try_wait_until, Proc, ProcOptions};

/// How long a start may take to be healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a member may take to stop on SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The etcd binary: `$ETCD_BIN`, else `/usr/bin/etcd`; `None` if that file is missing.
pub fn etcd_binary() -> Option<PathBuf> {
    let p = std::env::var_os("ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/etcd"));
    p.is_file().then_some(p)
}

/// True, after a loud message saying what goes untested, when etcd is not installed: the
/// etcd tests skip then (make test installs it, so CI runs them).
pub fn skip_without_etcd(untested: &str) -> bool {
    if etcd_binary().is_some() {
        return false;
    }
    eprintln!(
        "\n*** SKIPPED: /usr/bin/etcd is missing, so {untested} NOT tested. \
         Install etcd-server (scripts/install-deps.sh, run by make test). ***\n"
    );
    true
}

struct Member {
    name: String,
    /// The IP it listens on (client and peer).
    host: String,
    client_port: u16,
    peer_port: u16,
    proc: Option<Proc>,
}

impl Member {
    fn client_addr(&self) -> String {
        format!("{}:{}", self.host, self.client_port)
    }
    fn peer_url(&self) -> String {
        format!("http://{}:{}", self.host, self.peer_port)
    }
}

/// Running etcd members; every one still running is killed on drop. Fields drop in order:
/// the processes before their directory.
pub struct Etcd {
    members: Vec<Member>,
    bin: PathBuf,
    token: String,
    dir: tempfile::TempDir,
}

/// A name for an [`Etcd`] of several members.
pub type EtcdCluster = Etcd;

impl Etcd {
    /// One member on free loopback ports; panics if it does not become healthy.
    #[track_caller]
    pub fn single() -> Etcd {
        or_panic(Etcd::try_start(1))
    }

    /// `n` members bootstrapped together; panics if they do not become healthy.
    #[track_caller]
    pub fn start(n: usize) -> Etcd {
        or_panic(Etcd::try_start(n))
    }

    /// `n` members bootstrapped together with `--initial-cluster`, waiting until each is
    /// healthy. Ports come from [`try_free_port`], which lets go of them: when a member could
    /// not bind its port (another test took it meanwhile) every member starts again on new
    /// ports, a few times.
    pub fn try_start(n: usize) -> Result<Etcd> {
        Etcd::try_start_on("127.0.0.1", n)
    }

    /// Like [`Etcd::try_start`], every member listening on `host` (an IP of this network
    /// namespace, e.g. [`crate::netns::Netns::bridge_ip`], so nodes in other namespaces reach
    /// it) instead of 127.0.0.1.
    pub fn try_start_on(host: &str, n: usize) -> Result<Etcd> {
        let bin = etcd_binary().ok_or_else(|| {
            Error::Binaries(
                "etcd is missing: install etcd-server (scripts/install-deps.sh) or set ETCD_BIN"
                    .into(),
            )
        })?;
        let dir = tempfile::Builder::new()
            .prefix("testkit-etcd")
            .tempdir()
            .map_err(|e| Error::io("making a temporary directory for etcd", e))?;
        let mut e = Etcd {
            members: Vec::new(),
            bin,
            token: format!("testkit-{}-{:x}", std::process::id(), nanos()),
            dir,
        };
        for attempt in 0.. {
            e.members = (0..n)
                .map(|i| {
                    Ok(Member {
                        name: format!("m{i}"),
                        host: host.to_string(),
                        client_port: try_free_port()?,
                        peer_port: try_free_port()?,
                        proc: None,
                    })
                })
                .collect::<Result<_>>()?;
            // A failed attempt leaves data directories naming other peers: start clean.
            for i in 0..n {
                let _ = std::fs::remove_dir_all(e.data_dir(i));
            }
            let froms: Vec<usize> = (0..n).map(|i| e.log_len(i)).collect();
            for i in 0..n {
                e.spawn(i)?;
            }
            match e.wait_ready(&(0..n).collect::<Vec<_>>(), &froms) {
                Ok(()) => return Ok(e),
                Err(err) if attempt >= 4 || !(0..n).any(|i| e.port_clash(i, froms[i])) => {
                    return Err(err.context(format!("starting {n} etcd member(s)")));
                }
                // A port was taken: all again on new ports.
                Err(_) => e.members.iter_mut().for_each(|m| {
                    if let Some(mut p) = m.proc.take() {
                        p.kill9();
                    }
                }),
            }
        }
        unreachable!("the loop returns")
    }

    /// How many members there are (running or not).
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Every member's client address, `HOST:PORT` (127.0.0.1 unless [`Etcd::try_start_on`]).
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::client_addr).collect()
    }

    /// Member `i`'s client URL, `http://HOST:PORT`.
    pub fn client_url(&self, i: usize) -> String {
        format!("http://{}", self.members[i].client_addr())
    }

    /// What `sheep --cluster` takes: `etcd://127.0.0.1:P1,127.0.0.1:P2/PREFIX` (`prefix` with
    /// or without its leading slash).
    pub fn cluster_spec(&self, prefix: &str) -> String {
        format!(
            "etcd://{}/{}",
            self.endpoints().join(","),
            prefix.trim_matches('/')
        )
    }

    /// The directory holding every member's data directory and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Member `i`'s log file.
    pub fn log(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("m{i}.log"))
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("m{i}.etcd"))
    }

    fn log_len(&self, i: usize) -> usize {
        std::fs::metadata(self.log(i)).map_or(0, |m| m.len() as usize)
    }

    /// What member `i` logged since byte `from`.
    fn log_since(&self, i: usize, from: usize) -> String {
        let b = std::fs::read(self.log(i)).unwrap_or_default();
        String::from_utf8_lossy(&b[from.min(b.len())..]).into_owned()
    }

    fn port_clash(&self, i: usize, from: usize) -> bool {
        self.log_since(i, from).contains("address already in use")
    }

    /// Whether member `i`'s process is running.
    pub fn running(&mut self, i: usize) -> bool {
        self.members[i].proc.as_mut().is_some_and(Proc::running)
    }

    /// Member `i`'s pid, 0 when it is not running.
    pub fn pid(&self, i: usize) -> u32 {
        self.members[i].proc.as_ref().map_or(0, Proc::pid)
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let initial_cluster = self
            .members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url()))
            .collect::<Vec<_>>()
            .join(",");
        let m = &self.members[i];
        let client_url = format!("http://{}", m.client_addr());
        let mut cmd = Command::new(&self.bin);
        cmd.arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(self.data_dir(i))
            .arg("--listen-client-urls")
            .arg(&client_url)
            .arg("--advertise-client-urls")
            .arg(&client_url)
            .arg("--listen-peer-urls")
            .arg(m.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(m.peer_url())
            // Ignored on a restart: the data directory knows its cluster.
            .arg("--initial-cluster")
            .arg(initial_cluster)
            .arg("--initial-cluster-state")
            .arg("new")
            .arg("--initial-cluster-token")
            .arg(&self.token)
            // Loopback: elect fast, so tests that stop a member wait little.
            .arg("--heartbeat-interval")
            .arg("50")
            .arg("--election-timeout")
            .arg("500")
            .arg("--logger")
            .arg("zap")
            .arg("--log-outputs")
            .arg("stderr");
        let name = format!("etcd {}", m.name);
        let proc = Proc::try_spawn_with(&name, cmd, &self.log(i), ProcOptions::default())?;
        self.members[i].proc = Some(proc);
        Ok(())
    }

    /// Waits until every member in `which` logged that it serves clients at its address (since
    /// `froms[k]`) and answers its health check; an error with its log if one exits meanwhile,
    /// or with the end of their logs on a timeout.
    fn wait_ready(&mut self, which: &[usize], froms: &[usize]) -> Result<()> {
        let what = format!(
            "etcd member(s) {} to be healthy",
            which
                .iter()
                .map(|&i| self.members[i].client_addr())
                .collect::<Vec<_>>()
                .join(", ")
        );
        try_wait_until(&what, START_TIMEOUT, || {
            for &i in which {
                if let Some(p) = self.members[i].proc.as_mut() {
                    p.check_alive()?;
                }
            }
            Ok(which.iter().enumerate().all(|(k, &i)| {
                let addr = self.members[i].client_addr();
                let serving = format!("\"address\":\"{addr}\"");
                self.log_since(i, froms[k])
                    .lines()
                    .any(|l| l.contains("serving client traffic") && l.contains(&serving))
                    && healthy(&addr)
            }))
        })
        .map_err(|e| {
            let tails = which
                .iter()
                .map(|&i| {
                    format!(
                        "end of {}:\n{}",
                        self.log(i).display(),
                        self.log_tail(i, 2000)
                    )
                })
                .collect::<Vec<_>>()
                .join("\n");
            e.context(tails)
        })
    }

    /// Whether member `i` answers its health check now (it has a leader and a quorum).
    pub fn healthy(&self, i: usize) -> bool {
        self.members[i].proc.is_some() && healthy(&self.members[i].client_addr())
    }

    /// Waits until every running member is healthy.
    pub fn try_wait_healthy(&mut self) -> Result<()> {
        try_wait_until("etcd to be healthy", START_TIMEOUT, || {
            for m in &mut self.members {
                if let Some(p) = m.proc.as_mut() {
                    p.check_alive()?;
                }
            }
            Ok(self
                .members
                .iter()
                .filter(|m| m.proc.is_some())
                .all(|m| healthy(&m.client_addr())))
        })
    }

    /// SIGTERM to member `i`, waiting for it to exit (SIGKILL after 10 s); it keeps its data.
    pub fn stop(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            if !p.terminate(STOP_GRACE) {
                eprintln!("etcd m{i} did not stop within {STOP_GRACE:?}: killed");
            }
        }
    }

    /// SIGKILL to member `i`; it keeps its data (what it had synced).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].proc.take() {
            p.kill9();
        }
    }

    /// Starts member `i` again (same name, ports and data directory) and waits until it is
    /// healthy: that needs a quorum of the members running. Panics if it cannot.
    #[track_caller]
    pub fn start_member(&mut self, i: usize) {
        or_panic(self.try_start_member(i))
    }

    /// Like [`Etcd::start_member`], returning the error.
    pub fn try_start_member(&mut self, i: usize) -> Result<()> {
        if self.members[i].proc.is_some() {
            return Err(Error::Unexpected {
                what: format!("etcd m{i}"),
                detail: "is already running".into(),
            });
        }
        let from = self.log_len(i);
        self.spawn(i)?;
        self.wait_ready(&[i], &[from])
            .map_err(|e| e.context(format!("restarting etcd m{i}")))
    }

    /// The index of the member that is the raft leader now, as the running members report it
    /// (`POST /v3/maintenance/status` on the JSON gateway): `None` while there is none, or no
    /// running member answers.
    pub fn leader(&self) -> Option<usize> {
        let status: Vec<(usize, serde_json::Value)> = (0..self.members.len())
            .filter(|&i| self.members[i].proc.is_some())
            .filter_map(|i| Some((i, member_status(&self.members[i].client_addr())?)))
            .collect();
        let leader = status
            .iter()
            .find_map(|(_, s)| s["leader"].as_str().filter(|l| *l != "0"))?
            .to_string();
        status
            .iter()
            .find(|(_, s)| s["header"]["member_id"].as_str() == Some(leader.as_str()))
            .map(|(i, _)| *i)
    }

    /// Waits until some running member is the leader and returns its index.
    pub fn try_wait_leader(&self) -> Result<usize> {
        let mut leader = None;
        try_wait_until("an etcd leader", START_TIMEOUT, || {
            leader = self.leader();
            Ok(leader.is_some())
        })?;
        Ok(leader.expect("set when the wait ends"))
    }

    /// The last `bytes` of member `i`'s log.
    pub fn log_tail(&self, i: usize, bytes: u64) -> String {
        log_tail(&self.log(i), bytes)
    }
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// One HTTP/1.1 request to `addr` (`Connection: close`); the whole response.
fn http(addr: &str, request_line: &str, body: &str) -> std::io::Result<String> {
    let sock: std::net::SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::other(format!("{addr}: {e}")))?;
    let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(1)))?;
    write!(
        s,
        "{request_line} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

/// A member's status from the JSON gateway (`header.member_id`, `leader`, ...).
fn member_status(addr: &str) -> Option<serde_json::Value> {
    let resp = http(addr, "POST /v3/maintenance/status", "{}").ok()?;
    let (head, body) = resp.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    serde_json::from_str(body).ok()
}

/// `GET /health` on `addr` over plain HTTP/1.1: true when etcd says `"health":"true"` (it has
/// a leader and answers a read through raft).
pub fn healthy(addr: &str) -> bool {
    http(addr, "GET /health", "")
        .is_ok_and(|b| b.starts_with("HTTP/1.1 200") && b.contains("\"health\":\"true\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn skip() -> bool {
        skip_without_etcd("testkit's etcd harness is")
    }

    #[test]
    fn single_member_stops_and_starts_on_its_data() {
        if skip() {
            return;
        }
        let mut e = Etcd::single();
        assert!(e.healthy(0));
        let spec = e.cluster_spec("/t/");
        assert_eq!(spec, format!("etcd://{}/t", e.endpoints()[0]));
        e.stop(0);
        assert!(!e.healthy(0) && !healthy(&e.endpoints()[0]));
        e.start_member(0);
        assert!(e.healthy(0));
        e.kill(0);
        e.start_member(0);
        assert!(e.healthy(0));
        let pid = e.pid(0) as libc::pid_t;
        drop(e);
        // SAFETY: signal 0 only checks; the pid was reaped, so nobody (or a stranger) has it.
        let gone = unsafe { libc::kill(pid, 0) } != 0;
        assert!(gone, "etcd {pid} outlived its Etcd");
    }

    #[test]
    fn three_members_keep_a_quorum_with_one_down() {
        if skip() {
            return;
        }
        let mut e = EtcdCluster::start(3);
        assert_eq!(e.endpoints().len(), 3);
        let leader = e.try_wait_leader().unwrap();
        e.kill(leader);
        e.try_wait_healthy().unwrap();
        let next = e.try_wait_leader().unwrap();
        assert_ne!(next, leader, "a killed member is still the leader");
        assert!((0..3).filter(|&i| i != leader).all(|i| e.healthy(i)));
        e.start_member(leader);
        e.try_wait_healthy().unwrap();
        assert!((0..3).all(|i| e.healthy(i)));
    }
}
