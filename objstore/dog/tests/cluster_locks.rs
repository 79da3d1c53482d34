//! Attachment locks against real nodes through real `dog`: one owner at a time, re-attach by
//! the same owner, generations, release only by the owner, break, and delete refusing a
//! locked VDI and taking its records with it.

use serde_json::Value;
use testkit::cluster::{Bins, Cluster};

fn bins() -> Bins {
    Bins::fresh()
}

fn acquire(c: &Cluster, name: &str, owner: &str, host: &str) -> Value {
    c.dog_json(&[
        "vdi", "lock", "acquire", name, "--owner", owner, "--host", host,
    ])
}

fn locks(c: &Cluster) -> Vec<Value> {
    c.dog_json(&["vdi", "lock", "list"])
        .as_array()
        .expect("a JSON array")
        .clone()
}

fn text(out: Vec<u8>) -> String {
    String::from_utf8(out).expect("UTF-8 output")
}

#[test]
fn one_owner_at_a_time() {
    let c = Cluster::start(&bins(), 2);
    c.dog_ok(&["cluster", "format", "--copies", "2"]);
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    c.dog_ok(&["vdi", "create", "other", "8M"]);
    c.write_vdi("v", 0, b"payload");
    assert!(locks(&c).is_empty());

    // A free VDI: the first attachment gets the next generation. dog's write, made without
    // the lock, took one (a cache that had the VDI would drop its copy), so it is 2.
    let a = acquire(&c, "v", "A", "hostA");
    assert_eq!(a["vdi"], "v");
    assert_eq!(a["owner"], "A");
    assert_eq!(a["host"], "hostA");
    assert_eq!(a["gen"], 2);
    assert!(a["since"].as_u64().unwrap() > 1_600_000_000, "{a}");

    // Another owner is refused, with who holds it and how to free it.
    let e = c.dog_err(&[
        "vdi", "lock", "acquire", "v", "--owner", "B", "--host", "hostB",
    ]);
    assert!(
        e.contains("VDI 'v' is attached read-write by hostA (owner A) since "),
        "{e}"
    );
    assert!(e.contains(" UTC; if that host is dead, free it with 'dog vdi lock break v'"));

    // The same owner re-attaches: the lock is unchanged, generation included.
    assert_eq!(acquire(&c, "v", "A", "hostA"), a);
    assert_eq!(acquire(&c, "v", "A", "elsewhere"), a);

    // Listed, as JSON (with whether it is lease-bound) and as a table.
    let mut listed = a.clone();
    listed["leased"] = false.into();
    assert_eq!(locks(&c), vec![listed.clone()]);
    let table = text(c.dog_ok(&["vdi", "lock", "list"]));
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 2, "{table}");
    for col in ["VDI", "Host", "Owner", "Since", "Gen"] {
        assert!(lines[0].contains(col), "{table}");
    }
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[..3], ["v", "hostA", "A"], "{table}");
    assert_eq!(row[5], "UTC", "{table}");
    assert_eq!(row[6], "2", "{table}");
    assert_eq!(row[7], "persistent", "{table}");

    // A locked VDI cannot be deleted; the data stays.
    let e = c.dog_err(&["vdi", "delete", "v"]);
    assert!(
        e.contains(
            "VDI 'v' is attached read-write by hostA: detach it (unmount) or \
             'dog vdi lock break v' first"
        ),
        "{e}"
    );
    assert_eq!(c.read_vdi("v", 0, 7), b"payload");

    // So is `dog vdi write`; with --force it writes behind the holder's cache, and takes a
    // generation (the holder's next attachment then drops what it had cached).
    let out = c.dog_stdin(&["vdi", "write", "v"], b"nope");
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("VDI 'v' is attached read-write by hostA: detach it (unmount) or 'dog vdi lock break v' first; --force writes behind that cache"),
        "{e}"
    );
    assert_eq!(c.read_vdi("v", 0, 7), b"payload");
    let out = c.dog_stdin(&["vdi", "write", "v", "--force"], b"PAY");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(c.read_vdi("v", 0, 7), b"PAYload");

    // Another owner's release leaves the lock alone.
    let out = text(c.dog_ok(&["vdi", "lock", "release", "v", "--owner", "B"]));
    assert!(out.contains("nothing released"), "{out}");
    assert_eq!(locks(&c), vec![listed.clone()]);

    // The owner's release frees it; releasing again is harmless.
    let r = c.dog_json(&["vdi", "lock", "release", "v", "--owner", "A"]);
    assert_eq!(r["released"], true, "{r}");
    assert!(locks(&c).is_empty());
    let r = c.dog_json(&["vdi", "lock", "release", "v", "--owner", "A"]);
    assert_eq!(r["released"], false, "{r}");

    // The next attachment gets the next generation.
    let b = acquire(&c, "v", "B", "hostB");
    assert_eq!(b["owner"], "B");
    assert_eq!(b["gen"], 4);
    let e = c.dog_err(&["vdi", "lock", "acquire", "v", "--owner", "A"]);
    assert!(e.contains("attached read-write by hostB (owner B)"), "{e}");

    // Locks are per VDI; "other" was never written.
    let o = acquire(&c, "other", "A", "hostA");
    assert_eq!(o["gen"], 1);
    let names: Vec<Value> = locks(&c).iter().map(|l| l["vdi"].clone()).collect();
    assert_eq!(names, ["other", "v"], "sorted by VDI name");
    c.dog_ok(&["vdi", "lock", "release", "other", "--owner", "A"]);

    // Breaking frees B's lock and says what it freed; a second break finds nothing.
    let freed = c.dog_json(&["vdi", "lock", "break", "v"]);
    assert_eq!(freed["vdi"], "v");
    assert_eq!(freed["freed"], b);
    assert!(locks(&c).is_empty());
    let out = text(c.dog_ok(&["vdi", "lock", "break", "v"]));
    assert!(out.contains("VDI 'v' had no lock"), "{out}");
    assert_eq!(
        c.dog_json(&["vdi", "lock", "break", "v"])["freed"],
        Value::Null
    );
    let e = c.dog_err(&["vdi", "lock", "break", "a/b"]);
    assert!(e.contains("invalid VDI name"), "{e}");

    // Break, in text, names the holder.
    acquire(&c, "v", "C", "hostC");
    let out = text(c.dog_ok(&["vdi", "lock", "break", "v"]));
    assert!(
        out.contains("freed the lock of VDI 'v' held by hostC (owner C)"),
        "{out}"
    );
    assert!(out.contains("gen 5"), "{out}");

    // Unlocked, the VDI deletes, and its generation counter goes with it: a new VDI of the
    // same name starts again at generation 1.
    c.dog_ok(&["vdi", "delete", "v"]);
    let e = c.dog_err(&["vdi", "lock", "acquire", "v", "--owner", "A"]);
    assert!(e.contains("no VDI named 'v'"), "{e}");
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    assert_eq!(acquire(&c, "v", "A", "hostA")["gen"], 1);
    c.dog_ok(&["vdi", "lock", "release", "v", "--owner", "A"]);
    c.dog_ok(&["vdi", "delete", "v"]);
}

#[test]
fn bad_input() {
    let c = Cluster::start(&bins(), 1);
    c.dog_ok(&["cluster", "format", "--copies", "1"]);
    let e = c.dog_err(&["vdi", "lock", "acquire", "missing", "--owner", "A"]);
    assert!(e.contains("no VDI named 'missing'"), "{e}");
    let e = c.dog_err(&["vdi", "lock", "acquire", "a@b", "--owner", "A"]);
    assert!(e.contains("'@'"), "{e}");
    let e = c.dog_err(&["vdi", "lock", "release", "", "--owner", "A"]);
    assert!(e.contains("empty"), "{e}");
    let e = c.dog_err(&["vdi", "lock", "acquire", "x"]);
    assert!(e.contains("--owner"), "{e}");

    // Without --host, the lock records this host's name.
    c.dog_ok(&["vdi", "create", "h", "4M"]);
    let l = c.dog_json(&["vdi", "lock", "acquire", "h", "--owner", "me"]);
    let host = l["host"].as_str().unwrap();
    assert!(!host.is_empty(), "{l}");
    assert_ne!(host, "unknown-host", "{l}");
}

#[test]
fn leased_locks_free_themselves_and_break() {
    let c = Cluster::start(&bins(), 1);
    c.dog_ok(&["cluster", "format", "--copies", "1"]);
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    c.dog_ok(&["vdi", "create", "w", "8M"]);
    let take = |name: &str, owner: &str, ttl: &str| {
        c.dog_json(&[
            "vdi", "lock", "take", name, "--owner", owner, "--host", "h", "--ttl", ttl,
        ])
    };
    // A lease nobody renews (dog exits): the lock frees itself after its TTL.
    let a = take("v", "A", "1s");
    assert_eq!(a["ttl_secs"], 1, "{a}");
    assert!(a["lease"].as_u64().is_some_and(|l| l != 0), "{a}");
    let persistent = acquire(&c, "w", "P", "h");
    assert!(persistent.get("lease").is_none(), "{persistent}");
    let l = locks(&c);
    assert_eq!(
        l.iter()
            .map(|l| (l["vdi"].as_str().unwrap(), l["leased"].as_bool().unwrap()))
            .collect::<Vec<_>>(),
        vec![("v", true), ("w", false)]
    );
    let table = text(c.dog_ok(&["vdi", "lock", "list"]));
    assert!(table.contains("Kind"), "{table}");
    assert!(
        table.contains("lease 1s") && table.contains("persistent"),
        "{table}"
    );
    testkit::wait_until(
        "the unrenewed lock to free itself",
        std::time::Duration::from_secs(10),
        || locks(&c).len() == 1,
    );
    assert_eq!(locks(&c)[0]["vdi"], "w", "the persistent lock stays");
    // Free again: the next attachment gets a new generation.
    let b = take("v", "B", "30s");
    assert_eq!(b["gen"], a["gen"].as_u64().unwrap() + 1, "{b}");
    // Break frees a leased lock at once (and ends its lease).
    let out = c.dog_json(&["vdi", "lock", "break", "v"]);
    assert_eq!(out["freed"]["owner"], "B", "{out}");
    assert_eq!(locks(&c).len(), 1);
    // The same owner taking its persistent lock again with a TTL moves it onto a lease.
    let p2 = c.dog_json(&[
        "vdi", "lock", "acquire", "w", "--owner", "P", "--host", "h", "--ttl", "30s",
    ]);
    assert_eq!(p2["gen"], persistent["gen"], "{p2}");
    assert!(p2["lease"].as_u64().is_some(), "{p2}");
    let e = c.dog_err(&["vdi", "lock", "take", "v", "--owner", "C", "--ttl", "0s"]);
    assert!(e.contains("TTL"), "{e}");
}
