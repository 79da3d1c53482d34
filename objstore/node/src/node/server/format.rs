//! `Format`: the cluster's format, stored once in the membership store.

use objstore_proto::api::FormatRequest;
use objstore_proto::frame::ResultCode;
use objstore_proto::keys;
use objstore_proto::view::ClusterConfig;

use super::{driver_call, Failure, Handled, Reply};
use crate::node::Node;

pub(super) async fn format(node: &Node, req: FormatRequest) -> Handled {
    let min_copies = req
        .min_copies
        .unwrap_or_else(|| objstore_proto::view::default_min_copies(req.copies));
    ClusterConfig::validate(req.copies, min_copies, req.object_size).map_err(Failure::invalid)?;
    if let Some(r) = req.vdi_redundancy {
        if !r.is_ec() {
            return Err(Failure::invalid(format!(
                "the VDIs' default {r} is not an erasure code: format with --copies {r}"
            )));
        }
        r.validate(0, node.epoch().view.zones())
            .map_err(Failure::invalid)?;
    }
    let cfg = ClusterConfig {
        vdi_redundancy: req.vdi_redundancy,
        copies: req.copies,
        min_copies,
        object_size: req.object_size as u32,
        formatted_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    let raw = serde_json::to_vec(&cfg).expect("serializable");
    let ok = driver_call(node, move |d| d.kv_cas(keys::CONFIG, None, Some(&raw))).await?;
    if !ok {
        let cur = node.config();
        return Err(Failure::new(
            ResultCode::AlreadyFormatted,
            match cur {
                Some(c) => format!(
                    "the cluster is already formatted ({} copies, {} MiB objects)",
                    c.copies,
                    c.object_size >> 20
                ),
                None => "the cluster is already formatted".to_string(),
            },
        ));
    }
    tracing::info!(
        "cluster formatted: {} copies (writes need {}), {} byte objects, VDIs {}",
        cfg.copies,
        cfg.min_copies,
        cfg.object_size,
        cfg.default_redundancy()
    );
    Ok(Reply::empty())
}
