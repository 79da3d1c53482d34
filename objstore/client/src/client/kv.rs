//! The cluster's key-value store and leases through any node (the VDI table, locks, the
//! format and recovery records live there).

use std::time::Duration;

use bytes::Bytes;

use super::{answer, parse, unreachable, Answer, Client, ClientError};
use objstore_proto::api::{KvCasLeasedRequest, KvCasRequest, LeaseGrantRequest, LeaseId};
use objstore_proto::frame::Opcode;

impl Client {
    pub async fn kv_get(&self, key: &str) -> Result<Option<String>, ClientError> {
        let f = self
            .kv_call(Opcode::KvGet, Bytes::from(key.to_string()))
            .await?;
        Ok(f.map(|f| String::from_utf8_lossy(&f.payload).into_owned()))
    }

    /// Replaces `key` if it still holds `expected`; false if it changed.
    pub async fn kv_cas(
        &self,
        key: &str,
        expected: Option<&str>,
        new: Option<&str>,
    ) -> Result<bool, ClientError> {
        let body = serde_json::to_vec(&KvCasRequest {
            key: key.to_string(),
            expected: expected.map(str::to_string),
            new: new.map(str::to_string),
        })
        .expect("serializable");
        match self.kv_call(Opcode::KvCas, Bytes::from(body)).await {
            Ok(_) => Ok(true),
            Err(ClientError::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Like [`Client::kv_cas`] with a value bound to lease `lease` (it vanishes when the
    /// lease ends); false if the key changed or the lease ended.
    pub async fn kv_cas_leased(
        &self,
        key: &str,
        expected: Option<&str>,
        new: &str,
        lease: u64,
    ) -> Result<bool, ClientError> {
        let body = serde_json::to_vec(&KvCasLeasedRequest {
            key: key.to_string(),
            expected: expected.map(str::to_string),
            new: new.to_string(),
            lease,
        })
        .expect("serializable");
        match self.kv_call(Opcode::KvCasLeased, Bytes::from(body)).await {
            Ok(_) => Ok(true),
            Err(ClientError::Conflict) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A new cluster-wide lease that ends `ttl` (rounded up to whole seconds) after its last
    /// renewal.
    pub async fn lease_grant(&self, ttl: Duration) -> Result<u64, ClientError> {
        let ttl_secs = (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1);
        let body = serde_json::to_vec(&LeaseGrantRequest { ttl_secs }).expect("serializable");
        match self.kv_call(Opcode::LeaseGrant, Bytes::from(body)).await? {
            Some(f) => Ok(parse::<LeaseId>(self.bootstrap[0], &f.payload)?.lease),
            None => Err(unreachable(self.bootstrap[0], "answered not found".into())),
        }
    }

    /// Renews lease `lease` through the first node that answers, without the retry loop of
    /// the other key-value calls (a renewal is due again soon); false if the lease ended.
    pub async fn lease_keepalive(&self, lease: u64) -> Result<bool, ClientError> {
        let body = serde_json::to_vec(&LeaseId { lease }).expect("serializable");
        let (addr, f) = self
            .any_node(Opcode::LeaseKeepalive, Bytes::from(body))
            .await?;
        match answer(addr, Ok(f)) {
            Answer::Ok(_) => Ok(true),
            Answer::NotFound => Ok(false),
            Answer::Fatal(e) => Err(e),
            Answer::Retry(why) => Err(unreachable(addr, why)),
        }
    }

    /// Ends lease `lease` now, deleting the keys bound to it; an unknown lease is no error.
    pub async fn lease_revoke(&self, lease: u64) -> Result<(), ClientError> {
        let body = serde_json::to_vec(&LeaseId { lease }).expect("serializable");
        self.kv_call(Opcode::LeaseRevoke, Bytes::from(body))
            .await
            .map(|_| ())
    }

    pub async fn kv_list(&self, prefix: &str) -> Result<Vec<(String, String)>, ClientError> {
        let f = self
            .kv_call(Opcode::KvList, Bytes::from(prefix.to_string()))
            .await?;
        match f {
            Some(f) => parse(self.bootstrap[0], &f.payload),
            None => Ok(Vec::new()),
        }
    }
}
