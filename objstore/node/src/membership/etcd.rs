//! The `etcd` driver: nodes on many hosts share an etcd cluster (work in progress).

use std::time::Duration;

use super::{Driver, DriverError, DriverOptions};
use objstore_proto::view::{NodeInfo, View};

/// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` without its scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSpec {
    /// `http://HOST:PORT` for each member given.
    pub endpoints: Vec<String>,
    /// Every key of this cluster starts with it; `/sheep` when none is given.
    pub prefix: String,
}

impl EtcdSpec {
    pub fn parse(rest: &str) -> Result<EtcdSpec, DriverError> {
        let bad = || DriverError::UnknownDriver(format!("etcd://{rest}"));
        let (hosts, prefix) = match rest.split_once('/') {
            Some((h, p)) => (h, format!("/{}", p.trim_matches('/'))),
            None => (rest, "/sheep".to_string()),
        };
        if prefix == "/" {
            return Err(bad());
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h.rsplit_once(':').ok_or_else(bad)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad());
            }
            endpoints.push(format!("http://{h}"));
        }
        Ok(EtcdSpec { endpoints, prefix })
    }
}

pub struct EtcdDriver {}

impl EtcdDriver {
    pub fn open(_spec: &EtcdSpec, _opts: DriverOptions) -> Result<EtcdDriver, DriverError> {
        Err(DriverError::UnknownDriver("etcd (not built yet)".into()))
    }
}

fn todo_err() -> DriverError {
    DriverError::UnknownDriver("etcd (not built yet)".into())
}

impl Driver for EtcdDriver {
    fn cluster_id(&self) -> Result<String, DriverError> {
        Err(todo_err())
    }
    fn join(&self, _me: &NodeInfo) -> Result<View, DriverError> {
        Err(todo_err())
    }
    fn tick(&self) -> Result<View, DriverError> {
        Err(todo_err())
    }
    fn leave(&self) -> Result<(), DriverError> {
        Err(todo_err())
    }
    fn view_at(&self, _epoch: u32) -> Result<Option<View>, DriverError> {
        Err(todo_err())
    }
    fn kv_get(&self, _key: &str) -> Result<Option<Vec<u8>>, DriverError> {
        Err(todo_err())
    }
    fn kv_cas(&self, _k: &str, _e: Option<&[u8]>, _n: Option<&[u8]>) -> Result<bool, DriverError> {
        Err(todo_err())
    }
    fn kv_list(&self, _prefix: &str) -> Result<Vec<(String, Vec<u8>)>, DriverError> {
        Err(todo_err())
    }
    fn kv_cas_leased(
        &self,
        _k: &str,
        _e: Option<&[u8]>,
        _n: &[u8],
        _l: u64,
    ) -> Result<bool, DriverError> {
        Err(todo_err())
    }
    fn lease_grant(&self, _ttl: Duration) -> Result<u64, DriverError> {
        Err(todo_err())
    }
    fn lease_keepalive(&self, _lease: u64) -> Result<bool, DriverError> {
        Err(todo_err())
    }
    fn lease_revoke(&self, _lease: u64) -> Result<(), DriverError> {
        Err(todo_err())
    }
}
