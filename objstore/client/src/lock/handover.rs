//! Cooperative hand-over of a held lock, as RBD's exclusive lock does: a mount that needs to
//! write a VDI another mount holds asks for it (`lock-req/<vdi>`, a [`LockRequest`] bound to
//! a lease of its own, so a request dies with its asker), and waits for the lock to be free.
//! The holder sees the request within [`REQUEST_POLL`] ([`requests`], one listing for all the
//! VDIs it holds), stops taking writes to the VDI, makes what it acknowledged durable, drops
//! what it cached, and releases the lock. The asker then takes it with a new generation
//! ([`acquire_handed_over`]).
//!
//! A holder that does not give the lock up is never overruled: the asker waits until the lock
//! is free, which for a dead or hung holder is when its lease ends (its TTL), and gives up
//! after its `timeout` ([`LockError::HandOverTimedOut`]). Two writers at once are thus ruled
//! out as much as the leases rule them out today.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use objstore_proto::keys;
use objstore_proto::name::validate_name;

use super::{acquire_again, decode, now_secs, LockError, LockInfo};
use crate::client::Client;

/// How often a holder looks for requests for its locks: a request is seen within this. One
/// listing of `lock-req/` per look, from each mount that holds a lock (a mount with a cache
/// holds those of the VDIs it attached until it unmounts): 20 small reads a second per mount,
/// for a hand-over that adds on average 25 ms to the holder's flush (the live-migration
/// bench's target is under 100 ms).
pub const REQUEST_POLL: Duration = Duration::from_millis(50);

/// How often an asker looks whether the holder let the lock go.
const FREE_POLL: Duration = Duration::from_millis(20);

/// A mount asking for a lock another holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockRequest {
    pub vdi: String,
    /// The asking owner (as [`LockInfo::owner`]).
    pub owner: String,
    pub host: String,
    /// Unix seconds.
    pub since: u64,
    /// The generation of the lock it asks for: a request is for that holding only.
    pub gen: u64,
    /// The request's own lease: the request ends with its asker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
}

fn encode(r: &LockRequest) -> String {
    serde_json::to_string(r).expect("serializable")
}

fn decode_request(vdi: &str, raw: &str) -> Result<LockRequest, LockError> {
    serde_json::from_str(raw).map_err(|e| LockError::Corrupt {
        name: vdi.to_string(),
        reason: format!("bad lock request {raw:?}: {e}"),
    })
}

/// Asks the holder of `vdi`'s lock, held at generation `gen`, to hand it to `owner`. The
/// request replaces any other (the holder gives the lock up once; whoever takes it first has
/// it, the other asks again). It ends by itself `ttl` after the last call for it.
pub async fn ask(
    client: &Client,
    vdi: &str,
    owner: &str,
    host: &str,
    gen: u64,
    ttl: Duration,
) -> Result<LockRequest, LockError> {
    validate_name(vdi)?;
    let key = keys::lock_request(vdi);
    loop {
        let cur = client.kv_get(&key).await?;
        if let Some(raw) = &cur {
            if let Ok(r) = decode_request(vdi, raw) {
                if r.owner == owner && r.gen == gen {
                    if let Some(lease) = r.lease {
                        if client.lease_keepalive(lease).await? {
                            return Ok(r);
                        }
                    }
                }
            }
        }
        let lease = client.lease_grant(ttl).await?;
        let r = LockRequest {
            vdi: vdi.to_string(),
            owner: owner.to_string(),
            host: host.to_string(),
            since: now_secs(),
            gen,
            lease: Some(lease),
        };
        if client
            .kv_cas_leased(&key, cur.as_deref(), &encode(&r), lease)
            .await?
        {
            return Ok(r);
        }
        let _ = client.lease_revoke(lease).await;
    }
}

/// Removes `owner`'s request for `vdi` (it got the lock, or gave up).
pub async fn withdraw(client: &Client, vdi: &str, owner: &str) -> Result<(), LockError> {
    validate_name(vdi)?;
    let key = keys::lock_request(vdi);
    loop {
        let Some(raw) = client.kv_get(&key).await? else {
            return Ok(());
        };
        let Ok(r) = decode_request(vdi, &raw) else {
            // Unreadable: nobody's; removed.
            if client.kv_cas(&key, Some(&raw), None).await? {
                return Ok(());
            }
            continue;
        };
        if r.owner != owner {
            return Ok(());
        }
        if client.kv_cas(&key, Some(&raw), None).await? {
            if let Some(lease) = r.lease {
                client.lease_revoke(lease).await?;
            }
            return Ok(());
        }
    }
}

/// Every pending request, sorted by VDI name (unreadable records are skipped, with a warning).
pub async fn requests(client: &Client) -> Result<Vec<LockRequest>, LockError> {
    let mut out = Vec::new();
    for (key, raw) in client.kv_list(keys::LOCK_REQUEST_PREFIX).await? {
        let Some(vdi) = key.strip_prefix(keys::LOCK_REQUEST_PREFIX) else {
            continue;
        };
        match decode_request(vdi, &raw) {
            Ok(mut r) => {
                r.vdi = vdi.to_string();
                out.push(r);
            }
            Err(e) => tracing::warn!("{e}"),
        }
    }
    out.sort_by(|a, b| a.vdi.cmp(&b.vdi));
    Ok(out)
}

/// What [`acquire_handed_over`] got: the lock, and the holder that handed it over, if any.
#[derive(Debug, Clone)]
pub struct Taken {
    pub info: LockInfo,
    pub from: Option<LockInfo>,
}

/// Takes the lock of `vdi` for `owner` (as [`acquire_again`]); while another owner holds it,
/// asks for it ([`ask`]) and waits for the holder to let it go (or for its lease to end),
/// for at most `timeout`: then [`LockError::HandOverTimedOut`]. The request is withdrawn
/// either way.
#[allow(clippy::too_many_arguments)]
pub async fn acquire_handed_over(
    client: &Client,
    vdi: &str,
    owner: &str,
    host: &str,
    ttl: Duration,
    control: Option<&str>,
    timeout: Duration,
) -> Result<Taken, LockError> {
    let start = Instant::now();
    let mut asked: Option<(u64, Instant)> = None;
    let mut from: Option<LockInfo> = None;
    let res = loop {
        match acquire_again(client, vdi, owner, host, Some(ttl), None, control).await {
            Ok(info) => break Ok(Taken { info, from }),
            Err(LockError::Held { .. }) => {}
            Err(e) => break Err(e),
        }
        // Held by another: whoever holds it now (it may have changed hands meanwhile).
        let Some(raw) = client.kv_get(&keys::lock(vdi)).await? else {
            continue;
        };
        let holder = decode(vdi, &raw)?;
        if start.elapsed() >= timeout {
            break Err(LockError::HandOverTimedOut {
                vdi: vdi.to_string(),
                host: holder.host.clone(),
                owner: holder.owner.clone(),
                waited: start.elapsed(),
            });
        }
        // Asked again for a new holding, and renewed a third of the way into its lease.
        let renew = ttl / 3;
        let stale = match asked {
            Some((g, at)) => g != holder.gen || at.elapsed() >= renew,
            None => true,
        };
        if stale {
            ask(client, vdi, owner, host, holder.gen, ttl).await?;
            asked = Some((holder.gen, Instant::now()));
            tracing::info!(
                "VDI '{vdi}': asked {} (owner {}, generation {}) to hand its lock over",
                holder.host,
                holder.owner,
                holder.gen
            );
        }
        from = Some(holder);
        tokio::time::sleep(FREE_POLL).await;
    };
    if asked.is_some() {
        if let Err(e) = withdraw(client, vdi, owner).await {
            tracing::warn!(
                "VDI '{vdi}': withdrawing the request for its lock: {e} (it ends with its lease)"
            );
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = LockRequest {
            vdi: "disk0".into(),
            owner: "hv2/mount:/mnt".into(),
            host: "hv2".into(),
            since: 1_700_000_000,
            gen: 4,
            lease: Some(9),
        };
        assert_eq!(decode_request("disk0", &encode(&r)).unwrap(), r);
        let e = decode_request("disk0", "{").unwrap_err();
        assert!(e.to_string().contains("bad lock request"), "{e}");
        assert_eq!(keys::lock_request("disk0"), "lock-req/disk0");
    }
}
