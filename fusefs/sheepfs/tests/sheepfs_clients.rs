//! Real third-party clients on a real mount: qemu-img, qemu-io, fio, and dog on the other side.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use common::{run, stdout, Rig};
use testkit::pseudo_random;

#[test]
fn qemu_img_create_info_convert_compare() {
    let rig = Rig::start(3, 3, "4M", &[]);
    let img = rig.path("new");
    run("qemu-img", &["create", "-f", "raw", &img, "10G"]);
    let list = rig.cluster.dog_json(&["vdi", "list"]);
    let new = list
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "new")
        .expect("dog vdi list shows the VDI qemu-img created");
    assert_eq!(new["size"], 10u64 << 30);
    let info: serde_json::Value =
        serde_json::from_str(&stdout(&run("qemu-img", &["info", "--output=json", &img]))).unwrap();
    assert_eq!(info["format"], "raw");
    assert_eq!(info["virtual-size"], 10u64 << 30);

    // 256 MiB image in, and back out.
    let src = rig.scratch("src.img");
    std::fs::write(&src, pseudo_random(256 << 20, 11)).unwrap();
    let conv = rig.path("conv");
    run(
        "qemu-img",
        &[
            "convert", "-f", "raw", "-O", "raw", "-t", "none", &src, &conv,
        ],
    );
    let back = rig.scratch("back.img");
    run(
        "qemu-img",
        &[
            "convert", "-f", "raw", "-O", "raw", "-T", "none", &conv, &back,
        ],
    );
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &src, &conv],
    );
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &src, &back],
    );

    // qemu-img create over an existing VDI truncates it to 0 first: refused, VDI whole.
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-f", "raw", &conv, "1G"])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "qemu-img create over an existing VDI must fail"
    );
    run(
        "qemu-img",
        &["compare", "-f", "raw", "-F", "raw", &src, &conv],
    );
    assert!(rig
        .mount
        .log_tail()
        .contains("refusing to shrink VDI 'conv'"));
}

#[test]
fn qemu_io_native_and_io_uring_unaligned_patterns_and_discard() {
    let rig = Rig::start(3, 2, "1M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "d", "16M"]);
    let d = rig.path("d");
    // Unaligned offsets and lengths across 1 MiB object boundaries.
    let cmds = [
        "write -P 0x11 1048000 3000000",
        "write -P 0x22 4194303 1",
        "write -P 0x33 5242879 1048578",
        "read -P 0x11 1048000 3000000",
        "read -P 0x22 4194303 1",
        "read -P 0x33 5242879 1048578",
        "read -P 0 0 1048000",
        "discard 2097152 1048576",
        "read -P 0 2097152 1048576",
        "read -P 0x11 1048000 1049152",
        "read -P 0x11 3145728 902272",
        "discard 5242880 100000",
        "read -P 0 5242880 100000",
        "read -P 0x33 5342880 948577",
    ];
    for aio in ["native", "io_uring"] {
        let mut args = vec!["-f", "raw", "-t", "none", "-i", aio];
        for c in &cmds {
            args.push("-c");
            args.push(c);
        }
        args.push(&d);
        let out = run("qemu-io", &args);
        let text = stdout(&out);
        assert!(
            !text.contains("Pattern verification failed"),
            "{aio}: {text}"
        );
        assert!(!text.to_lowercase().contains("error"), "{aio}: {text}");
        assert_eq!(
            text.matches("read ").count(),
            9,
            "{aio}: every read ran: {text}"
        );
    }
    // The whole-object discard left a hole: object 2 is gone.
    let obj = rig.cluster.dog_json(&["vdi", "object", "d", "2"]);
    assert!(
        obj["oid"].is_null(),
        "discarded object still allocated: {obj}"
    );
}

#[test]
fn fio_random_write_then_verify_libaio_depth16() {
    let rig = Rig::start(3, 3, "4M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "f", "128M"]);
    let f = rig.path("f");
    let args = common::fio_verify_args(&f, "128M", &["--do_verify=1", "--number_ios=8192"]);
    let out = run("fio", &args.iter().map(String::as_str).collect::<Vec<_>>());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fio json");
    let job = &v["jobs"][0];
    assert_eq!(job["error"], 0, "fio reported an error");
    assert!(job["write"]["total_ios"].as_u64().unwrap() >= 8192);
    assert!(
        job["read"]["total_ios"].as_u64().unwrap() >= 8192,
        "verify read everything back"
    );
}

#[test]
fn mount_and_dog_see_the_same_bytes() {
    let rig = Rig::start(3, 3, "1M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "x", "8M"]);
    let data = pseudo_random(3 << 20, 5);
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(rig.path("x"))
            .unwrap();
        f.seek(SeekFrom::Start(12345)).unwrap();
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    assert!(
        rig.cluster.read_vdi("x", 12345, data.len() as u64) == data,
        "dog sees the mount's write"
    );

    // The mount's lock goes with the kernel's release of the closed file, just after close.
    testkit::wait_until(
        "the mount's lock released",
        std::time::Duration::from_secs(5),
        || rig.cluster.dog_json(&["vdi", "lock", "list"]) == serde_json::json!([]),
    );
    let other = pseudo_random(2 << 20, 6);
    rig.cluster.write_vdi("x", 5 << 20, &other);
    let mut got = vec![0u8; other.len()];
    let mut f = std::fs::File::open(rig.path("x")).unwrap();
    f.seek(SeekFrom::Start(5 << 20)).unwrap();
    f.read_exact(&mut got).unwrap();
    assert!(got == other, "the mount sees dog's write (no stale pages)");

    // While a file stays open, dog allocates a new object; the next open on the mount picks
    // it up for every descriptor.
    let newer = pseudo_random(1 << 20, 9);
    rig.cluster.write_vdi("x", 7 << 20, &newer);
    let _again = std::fs::File::open(rig.path("x")).unwrap();
    let mut got = vec![0u8; newer.len()];
    f.seek(SeekFrom::Start(7 << 20)).unwrap();
    f.read_exact(&mut got).unwrap();
    assert!(got == newer, "a new open refreshes the shared handle");
}
