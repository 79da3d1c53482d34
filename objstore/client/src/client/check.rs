//! `CheckObj` and `RepairObj` to one node: what it holds of one object and whether it reads
//! back, and the restore of its copy from a good one. Judging the answers is
//! [`objstore_proto::check::judge`]; checking whole VDIs is [`crate::vdi::check`].

use std::net::SocketAddr;

use bytes::Bytes;

use super::{answer, parse, unreachable, Answer, Client, ClientError};
use objstore_proto::api::{CopyCheck, EcCheckReport, RepairReply, RepairRequest, CHECK_STATE_ONLY};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::version::{ObjState, Version};

impl Client {
    /// What node `addr` holds of `oid`: its state, and unless `state_only` whether its bytes
    /// read back and their digest.
    pub async fn check_obj(
        &self,
        addr: SocketAddr,
        oid: ObjectId,
        state_only: bool,
    ) -> Result<CopyCheck, ClientError> {
        let mut h = Header::request(Opcode::CheckObj, 0, 0);
        h.oid = oid.0;
        if state_only {
            h.aux = CHECK_STATE_ONLY;
        }
        match answer(addr, self.call(addr, h, Bytes::new()).await) {
            Answer::Ok(f) => parse(addr, &f.payload),
            Answer::Fatal(e) => Err(e),
            Answer::NotFound => Err(unreachable(addr, "answered not found".into())),
            Answer::Retry(why) => Err(unreachable(addr, why)),
        }
    }

    /// Has node `addr` drop its copy of `oid` and restore it at `version` (or newer) from
    /// `source` (None: any other owner holding it). Returns the state restored. One request,
    /// bounded by the client's whole-operation timeout (a repair pulls a whole object).
    pub async fn repair_obj(
        &self,
        addr: SocketAddr,
        oid: ObjectId,
        version: Version,
        source: Option<SocketAddr>,
    ) -> Result<ObjState, ClientError> {
        let mut h = Header::request(Opcode::RepairObj, 0, 0);
        h.oid = oid.0;
        let body = serde_json::to_vec(&RepairRequest { version, source }).expect("serializable");
        let timeout = self.opts.timeout.max(self.opts.request_timeout);
        let conn = self
            .pool
            .get(addr, super::CONNECT_TIMEOUT.min(timeout))
            .await
            .map_err(|e| unreachable(addr, e.to_string()))?;
        let f = match conn.call(h, Bytes::from(body), timeout).await {
            Ok(f) => f,
            Err(e) => {
                self.pool.drop_conn(addr).await;
                return Err(unreachable(addr, e.to_string()));
            }
        };
        match f.header.result_code() {
            ResultCode::Ok => Ok(parse::<RepairReply>(addr, &f.payload)?.state),
            code => Err(ClientError::Refused {
                addr,
                code,
                message: f.message(),
            }),
        }
    }

    /// An erasure-coded object's strips read back and judged by its primary, and with
    /// `repair` the bad ones rebuilt from the others (`EcCheck`). Retried while the cluster
    /// asks (a new epoch, the primary busy) until the client's timeout.
    pub async fn ec_check_obj(
        &self,
        oid: ObjectId,
        scheme: Redundancy,
        repair: bool,
    ) -> Result<EcCheckReport, ClientError> {
        let mut h = Header::request(Opcode::EcCheck, 0, 0);
        h.oid = oid.0;
        h.offset = u64::from(repair);
        h.aux = objstore_proto::ec::wire::scheme_aux(scheme);
        self.retry(|v| async move {
            let primary = match super::targets(&v, oid) {
                Ok(t) => t[0],
                Err(step) => return step,
            };
            let mut h = h;
            h.epoch = v.epoch();
            match answer(primary, self.call(primary, h, Bytes::new()).await) {
                Answer::Ok(f) => match parse(primary, &f.payload) {
                    Ok(r) => super::Step::Done(r),
                    Err(e) => super::Step::Fatal(e),
                },
                Answer::Retry(why) => super::Step::Retry(why),
                Answer::NotFound => super::Step::Fatal(ClientError::NotFound(oid)),
                Answer::Fatal(e) => super::Step::Fatal(e),
            }
        })
        .await
    }
}
