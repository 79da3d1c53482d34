//! A hung node (SIGSTOP: its sockets stay open, nothing answers) under the mount costs a pause,
//! not an error (issue 22, scenario 4): fio verify on the mount (no cache) keeps going while one
//! of 4 nodes (3 copies) is stopped for longer than the mount's operation timeout, and reads
//! through the mount and through `dog` finish on the other replicas while it is still stopped.
//!
//! And what the node does once continued: the requests it received while stopped, which its
//! clients gave up on and retried elsewhere, must not land over newer data.

mod common;

use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::Rig;
use serde_json::Value;
use testkit::replicas;
use testkit::wait_until;

/// The mount's operation timeout (`sheepfs --timeout`): an I/O failing for this long is EIO.
const OP_TIMEOUT_SECS: u64 = 20;
const READ_SEED: u64 = 22;
/// The node that hangs; node 0 (the mount's and dog's bootstrap address) stays up.
const HUNG: usize = 2;

/// Runs `cmd` (killed if the test dies) and returns its output and how long it took.
fn timed(mut cmd: Command) -> (Output, Duration) {
    testkit::die_with_parent(&mut cmd, libc::SIGKILL);
    let t = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    (out, t.elapsed())
}

fn secs(ns: &Value) -> f64 {
    ns.as_f64().unwrap_or(f64::NAN) / 1e9
}

/// fio randwrite 4k verify on `f` for `runtime_secs`, verifying the last writes as it goes
/// (a time-based run has no verify phase); started once it has allocated a few objects.
fn start_fio(rig: &Rig, f: &str, runtime_secs: u64) -> Child {
    let mut fio = Command::new("fio");
    testkit::die_with_parent(&mut fio, libc::SIGKILL);
    let fio = fio
        .args(common::fio_verify_args(
            f,
            "64M",
            &[
                "--time_based",
                &format!("--runtime={runtime_secs}"),
                "--verify_backlog=1024",
            ],
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fio (make test installs it)");
    wait_until("fio to allocate objects", Duration::from_secs(30), || {
        rig.cluster.dog_json(&["vdi", "info", "f"])["allocated_objects"]
            .as_u64()
            .unwrap()
            >= 4
    });
    fio
}

/// fio's job report (it may print notes before its JSON), after printing its figures.
fn fio_job(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let report: Value =
        serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).unwrap_or_default();
    let job = report["jobs"][0].clone();
    eprintln!(
        "fio: error {}, {} writes, {} verify reads; longest write {:.2} s (completion {:.2} s)",
        job["error"],
        job["write"]["total_ios"],
        job["read"]["total_ios"],
        secs(&job["write"]["lat_ns"]["max"]),
        secs(&job["write"]["clat_ns"]["max"]),
    );
    job
}

fn assert_fio_ok(out: &Output, job: &Value) {
    assert!(
        out.status.success() && job["error"] == 0,
        "fio failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(
        job["read"]["total_ios"].as_u64().unwrap_or(0) > 0,
        "fio verified nothing"
    );
}

#[test]
fn a_stopped_node_pauses_fio_verify_and_reads_without_eio() {
    let rig = Rig::start(4, 3, "4M", &["--timeout", &OP_TIMEOUT_SECS.to_string()]);
    let c = &rig.cluster;
    c.dog_ok(&["vdi", "create", "f", "64M"]);
    // Known data to read back while the node is stopped: 4 objects, most of them on node 2.
    let data = testkit::pseudo_random(16 << 20, READ_SEED);
    c.dog_ok(&["vdi", "create", "r", "16M"]);
    c.write_vdi("r", 0, &data);

    // fio runs past the operation timeout, all of it with the node stopped.
    let mut fio = start_fio(&rig, &rig.path("f"), OP_TIMEOUT_SECS + 4);
    let stopped_at = Instant::now();
    let paused = c.pause_node(HUNG);

    // Reads while it is stopped: through the mount (O_DIRECT, no page cache) and with dog
    // (told about every node, the stopped one included), each from its own thread.
    let mut dd = Command::new("dd");
    dd.arg(format!("if={}", rig.path("r")))
        .args(["iflag=direct", "bs=1M", "status=none"]);
    let mount_read = thread::spawn(move || timed(dd));
    let dog_read = {
        let cmd = c.dog_command(&["vdi", "read", "r"]);
        thread::spawn(move || timed(cmd))
    };

    // The node is continued only once fio is done (what it does then is the next test's).
    let deadline = Duration::from_secs(OP_TIMEOUT_SECS * 3);
    while fio.try_wait().unwrap().is_none() && stopped_at.elapsed() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    let stopped_for = stopped_at.elapsed();
    let (dd_out, dd_took) = mount_read.join().unwrap();
    let (dog_out, dog_took) = dog_read.join().unwrap();
    paused.resume().unwrap();
    let out = fio.wait_with_output().unwrap();

    let job = fio_job(&out);
    eprintln!(
        "node stopped for {stopped_for:?}; reads meanwhile: through the mount {dd_took:?}, \
         dog vdi read {dog_took:?}"
    );
    assert!(
        stopped_for > Duration::from_secs(OP_TIMEOUT_SECS),
        "fio ended {stopped_for:?} after the stop, before the operation timeout"
    );
    assert_fio_ok(&out, &job);
    // Neither waited for the node to come back.
    assert!(
        dd_took < stopped_for && dog_took < stopped_for,
        "reads waited for the stopped node: mount {dd_took:?}, dog {dog_took:?}"
    );
    assert!(
        dd_out.status.success(),
        "reading through the mount failed: {}",
        String::from_utf8_lossy(&dd_out.stderr)
    );
    assert!(
        dd_out.stdout == data,
        "the mount read other bytes ({} of {})",
        dd_out.stdout.len(),
        data.len()
    );
    assert!(
        dog_out.status.success(),
        "dog vdi read failed: {}",
        String::from_utf8_lossy(&dog_out.stderr)
    );
    assert!(
        dog_out.stdout == data,
        "dog vdi read other bytes ({} of {})",
        dog_out.stdout.len(),
        data.len()
    );
}

/// (Failed before issue 22's versions and the client's expected version: the continued node
/// applied writes its clients had given up on over newer data.)
#[test]
fn a_continued_node_lands_no_stale_write() {
    let rig = Rig::start(4, 3, "4M", &[]);
    let c = &rig.cluster;
    c.dog_ok(&["vdi", "create", "f", "64M"]);
    let fio = start_fio(&rig, &rig.path("f"), 40);
    // Three hangs, each long enough for the clients to time out on the node, the membership
    // to drop it and the writes to go on without it; then it is continued and rejoins.
    for round in 0..3 {
        let paused = c.pause_node(HUNG);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(8) {
            thread::sleep(Duration::from_millis(50));
        }
        paused.resume().unwrap();
        c.wait_members(4);
        eprintln!("round {round}: node {HUNG} continued and back");
    }
    let out = fio.wait_with_output().unwrap();
    let job = fio_job(&out);
    c.wait_recovered();
    let copies = replicas::check(c, "f");
    assert_fio_ok(&out, &job);
    if let Err(p) = copies {
        panic!("{p}");
    }
}
