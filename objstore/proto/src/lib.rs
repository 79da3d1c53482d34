//! objstore-proto: what every part of the cluster agrees on. Plain data and pure functions, no
//! I/O beyond reading and writing frames on a stream.
//!
//! - [`oid`], [`view`], [`size`], [`duration`]: object ids, cluster views and formats, human
//!   sizes and durations; [`table`]: text tables for the command-line tools.
//! - [`name`]: VDI names. [`keys`]: the cluster key-value store's key names.
//! - [`extent`]: a VDI range cut at object boundaries.
//! - [`placement`]: which nodes hold an object, a pure function.
//! - [`auth`]: the cluster key and the handshake's proofs; [`rlimit`]: the open-file limit.
//! - [`frame`]: frames and opcodes of the wire protocol; [`api`]: its JSON bodies;
//!   [`pagebuf`]: the page-aligned buffers large payloads are received into.
//! - [`version`]: object versions, which decide which copy of an object is current;
//!   [`payload`]: the version prefixes of the payloads that change an object; [`arcs`]: a
//!   peer's copies by ring arc, as digests and as listings, for recovery's plans.
//! - [`check`]: which copies of an object are good and which to repair (check and scrub).
//! - [`redundancy`]: copies or `x:y` erasure coding; [`ec`]: the erasure code's strips, and how
//!   a stripe a crash left mixed is resolved.

pub mod api;
pub mod arcs;
pub mod auth;
pub mod check;
pub mod cowrec;
pub mod duration;
pub mod ec;
pub mod extent;
pub mod frame;
pub mod keys;
pub mod name;
pub mod oid;
pub mod pagebuf;
pub mod payload;
pub mod placement;
pub mod redundancy;
pub mod rlimit;
pub mod size;
pub mod table;
pub mod version;
pub mod view;

pub use oid::{ObjIndex, ObjectId, Vid};
