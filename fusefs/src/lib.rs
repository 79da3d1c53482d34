//! `sheepfs`: the cluster's VDIs as plain files at a FUSE mount point.
//!
//! ```text
//!  kernel FUSE ── fuser session threads (clone_fd) ── SheepFs::<op>() returns at once
//!                                                       │ reply moved into a tokio task
//!                                                       ▼
//!                                   objstore_client::Vdi (cached inode) ── objstore_client::Client ── sheep × N
//! ```
//! - [`fs`]: the `fuser::Filesystem` implementation.
//! - [`cache`]: the local object cache.
//! - the cache control protocol spoken on the cache's unix socket is the `cache_control`
//!   crate (`fusefs/control`), shared with `cachectl`.
//! - [`errno`]: the one mapping from library errors to errno values.
//! - [`mount`]: mount options and the checks made before mounting.

pub mod cache;
pub mod errno;
pub mod fs;
pub mod mount;

pub use fs::SheepFs;
