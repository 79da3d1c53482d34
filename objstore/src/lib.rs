//! objstore: the cluster core. Layers point one way:
//! ids → views → placement → wire protocol → store → node / client → VDIs.
//!
//! - [`oid`], [`view`], [`size`]: plain data.
//! - [`placement`]: which nodes hold an object, a pure function.
//! - [`proto`], [`conn`], [`api`]: the wire protocol, multiplexed connections, JSON bodies;
//!   [`pagebuf`]: the page-aligned buffers large payloads are received into.
//! - [`store`]: objects as files on a node's disk.
//! - [`membership`]: the driver trait and the `local` driver.
//! - [`node`]: the `sheep` daemon. [`client`]: placement-aware client. [`vdi`]: VDIs on top.

pub mod api;
pub mod client;
pub mod conn;
pub mod lock;
pub mod membership;
pub mod node;
pub mod oid;
pub mod pagebuf;
pub mod placement;
pub mod proto;
pub mod size;
pub mod store;
pub mod vdi;
pub mod view;

pub use client::{Client, ClientError, ClientOptions};
pub use oid::ObjectId;
pub use vdi::{Vdi, VdiError};
