//! `sheepfs`: the cluster's VDIs as plain files at a FUSE mount point, through the local
//! object cache (crate `objcache`) when there is one.
//!
//! ```text
//!  kernel FUSE ── fuser session threads (clone_fd) ── SheepFs::<op>() returns at once
//!                                                       │ reply moved into a tokio task
//!                                                       ▼
//!              objcache::CachedVdi ─or─ objstore_client::Vdi (cached inode) ── Client ── sheep × N
//!                      ▲
//!  cachectl ── DIR/control.sock (socket: calls the cache, and the fs to take a file over)
//! ```
//! - [`fs`]: the `fuser::Filesystem` implementation.
//! - `handles`: the open VDIs' handles (plain or cached), and taking one over into the cache.
//! - `locks`: without a cache, the attachment locks of the VDIs open read-write, and their
//!   cooperative hand-over to another mount (`handover`: the holder's side);
//!   `cachelocks`: the hand-over of the locks the cache holds.
//! - `alloc`: what `fallocate` does to a VDI.
//! - `names`: inode numbers, one per name (a VDI or a snapshot `NAME@TAG`, read-only).
//! - `switch`: a snapshot or rollback asked over the control socket, and the mount going
//!   on with the VDI's new inode.
//! - [`socket`]: the cache's control socket server; the protocol is the `cache_control`
//!   crate (`fusefs/control`), shared with `cachectl`.
//! - [`errno`]: the one mapping from library errors to errno values.
//! - [`mount`]: mount options and the checks made before mounting.
//! - [`fstab`]: `sheepfs` run as `mount.fuse.sheepfs` by mount(8), `/etc/fstab` and systemd:
//!   the `-o` options turned into `sheepfs` flags.

mod alloc;
mod cachelocks;
pub mod errno;
pub mod fs;
pub mod fstab;
mod handles;
mod handover;
mod locks;
pub mod mount;
mod names;
pub mod socket;
mod switch;

pub use fs::SheepFs;
pub use locks::{LockMode, WriteLocks};
