//! The CPU cost of the store's checksums: sums 1 GiB in 4 KiB blocks, as a write or a checked
//! read does, and prints CPU seconds per GiB, twice: over a 4 MiB buffer summed again and
//! again (in the CPU's cache, like an object a read has just copied in) and over a 64 MiB one
//! (from memory). `cargo run --release -p objstore-node --example crc_cost`

use std::time::Instant;

use objstore_node::store::sums;

fn cpu_seconds() -> f64 {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid out-pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let t = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    t(ru.ru_utime) + t(ru.ru_stime)
}

fn main() {
    for (mib, what) in [(4usize, "in cache"), (64, "from memory")] {
        let buf: Vec<u8> = (0..mib << 20).map(|i| (i * 2654435761) as u8).collect();
        let rounds = 1024 / mib;
        let (cpu0, wall0) = (cpu_seconds(), Instant::now());
        let mut x = 0u32;
        for _ in 0..rounds {
            for s in sums::sums_of(&buf) {
                x = x.wrapping_add(s);
            }
        }
        let cpu = cpu_seconds() - cpu0;
        let wall = wall0.elapsed().as_secs_f64();
        println!(
            "crc32c over 1 GiB in 4 KiB blocks, {mib} MiB buffer ({what}): {cpu:.3} CPU s ({wall:.3} s wall, {:.1} GiB/s); checksum {x:08x}",
            1.0 / wall
        );
    }
}
