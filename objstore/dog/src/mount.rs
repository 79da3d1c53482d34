//! Asking the mount that holds a VDI to snapshot or roll it back: a sheepfs with a cache
//! writes its control socket into the VDI's lock record (`LockInfo::control`). A VDI attached
//! read-write holds data the cluster may not have yet (a writeback cache) and a handle that
//! would go on writing the old inode, so only its holder can take a consistent snapshot and
//! go on with the new inode.
//!
//! The socket speaks the cache's control protocol (JSON lines, `fusefs/control`); dog sends
//! its `snapshot` and `rollback` requests as plain JSON, so the admin CLI does not depend on
//! the mount's crates.

use std::path::Path;

use anyhow::{anyhow, bail, Context};
use objstore_client::lock::{self, LockInfo};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Where to send a request for VDI `name`, which `holder` has attached: its control socket
/// when the holder runs on this host and said where it listens; otherwise an error naming
/// the holder's host and what to run there.
pub fn route(name: &str, holder: &LockInfo, what: &str) -> anyhow::Result<String> {
    let here = lock::local_host();
    let cmd = match what {
        "rollback" => format!("cachectl rollback {name} --yes"),
        _ => format!("cachectl snapshot {name}"),
    };
    let refuse = |why: &str| {
        anyhow!(
            "VDI '{}' is attached read-write by {} (owner {}){why}: run '{cmd}' on {} (with --cache-dir of that mount), or unmount it there and run this again",
            holder.vdi,
            holder.host,
            holder.owner,
            holder.host
        )
    };
    if holder.host != here {
        return Err(refuse(""));
    }
    match &holder.control {
        None => Err(refuse(", which takes no requests (a mount without a cache, or a lock taken with 'dog vdi lock')")),
        Some(p) if !Path::new(p).exists() => Err(refuse(&format!(
            " on this host, but its control socket {p} is not there"
        ))),
        Some(p) => Ok(p.clone()),
    }
}

/// Sends `request` to the control socket at `path` and returns the final reply's content
/// (the value under `ok`); an `error` line is the error.
pub async fn ask(path: &str, request: &Value, host: &str) -> anyhow::Result<Value> {
    let unreachable = || {
        format!(
            "the mount holding the VDI on {host} did not answer on its control socket {path}: run the cachectl command there, or unmount it"
        )
    };
    let stream = tokio::net::UnixStream::connect(path)
        .await
        .with_context(unreachable)?;
    let (rd, mut wr) = stream.into_split();
    let mut line = serde_json::to_string(request)?;
    line.push('\n');
    wr.write_all(line.as_bytes())
        .await
        .with_context(unreachable)?;
    let mut lines = BufReader::new(rd).lines();
    while let Some(l) = lines.next_line().await.with_context(unreachable)? {
        let v: Value = serde_json::from_str(l.trim())
            .with_context(|| format!("the mount's control socket {path} answered {l:?}"))?;
        if let Some(ok) = v.get("ok") {
            return Ok(ok.clone());
        }
        if let Some(e) = v.get("error").and_then(Value::as_str) {
            bail!("the mount holding the VDI refused: {e}");
        }
        // Progress lines: go on.
    }
    bail!(
        "{}: it closed the connection without an answer",
        unreachable()
    )
}

/// What the mount did, for people (`reply`: the `snapshot` or `rollback` reply).
pub fn text(reply: &Value, rollback: bool) -> String {
    let s = |k: &str| {
        reply
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    let n = |k: &str| reply.get(k).and_then(Value::as_u64).unwrap_or(0);
    let size = |k: &str| objstore_proto::size::format_size(n(k));
    let mut out = if rollback {
        format!(
            "rolled VDI '{}' back to '{}' (now id {:x}) through the mount holding it\n",
            s("vdi"),
            s("snapshot"),
            n("new_vid")
        )
    } else {
        format!(
            "took snapshot '{}' (id {:x}) through the mount holding '{}' (now id {:x})\n",
            s("snapshot"),
            n("vid"),
            s("vdi"),
            n("new_vid")
        )
    };
    if reply.get("attached").and_then(Value::as_bool) == Some(true) {
        out += &if rollback {
            format!(
                "the mount dropped {} it cached of the VDI, of which {} were writes never pushed (discarded by the rollback)\n",
                size("dropped"),
                size("discarded_dirty")
            )
        } else {
            format!(
                "the mount flushed {} of cached writes first\n",
                size("flushed")
            )
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(host: &str, control: Option<&str>) -> LockInfo {
        LockInfo {
            vdi: "disk0".into(),
            owner: "o".into(),
            host: host.into(),
            since: 0,
            gen: 1,
            lease: None,
            ttl_secs: None,
            control: control.map(str::to_string),
        }
    }

    #[test]
    fn another_host_is_named() {
        let e = route("disk0", &holder("hv-elsewhere-9", Some("/x")), "snapshot").unwrap_err();
        let e = e.to_string();
        assert!(e.contains("attached read-write by hv-elsewhere-9"), "{e}");
        assert!(
            e.contains("run 'cachectl snapshot disk0' on hv-elsewhere-9"),
            "{e}"
        );
    }

    #[test]
    fn this_host_without_a_socket() {
        let here = lock::local_host();
        let e = route("disk0", &holder(&here, None), "rollback")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("takes no requests") && e.contains("cachectl rollback disk0 --yes"),
            "{e}"
        );
        let e = route(
            "disk0",
            &holder(&here, Some("/nonexistent/control.sock")),
            "snapshot",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("/nonexistent/control.sock is not there"), "{e}");
    }
}
