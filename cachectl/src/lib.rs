//! `cachectl`: inspect, flush and evict the object cache of a running sheepfs through its
//! control socket (the protocol is [`cache_control`]).
//!
//! - [`client`]: one request/response round trip on the socket, and the user-facing errors.
//! - [`render`]: the human summary and table, and Prometheus text exposition.
//! - [`cli`]: the command line and what each command does.

pub mod cli;
pub mod client;
pub mod render;
