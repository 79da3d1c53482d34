//! What the peers hold of this node's objects, for a plan ([`super::plan`]): each peer's
//! listing as `PeerList` would answer it, fetched by ring arc where the peers agree.
//!
//! The invariant: the listing this gives for a peer is, arc by arc, a listing that peer
//! answered in this epoch, never another node's copies standing in for copies it does not
//! hold. A plan reads each peer's listing as what that peer holds; if a list stood for a peer
//! whose copies differ, the plan would pull from a node without the version, or miss the
//! newest copy of an object.
//!
//! How it is kept: every peer first answers a digest of each arc it holds copies of
//! ([`objstore_proto::arcs`]; an arc's objects share their holders). Peers whose digest of an
//! arc equals this node's own listing of that arc (what it would answer a peer) get that
//! listing, the same entries; each other group of equal digests has the arc fetched
//! from one member, and the entries fetched stand for the group only if their digest is still
//! the group's. Otherwise each member's own entries are fetched. Fetched at different times,
//! the arcs of one peer's listing are each a listing it answered in the epoch, as the pages of
//! a `PeerList` split in parts are. A peer that does not know these requests (an older
//! version), or a plan that must also ask about lost copies, gets the whole `PeerList`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use objstore_client::conn::ConnError;
use objstore_proto::arcs::{arc_digest, ArcsRequest};
use objstore_proto::arcs::{decode_arcs, decode_digests, digest_of, ArcDigest, ArcList};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::version::{decode_list, ListRequest};

use super::{LIST_BEHIND_WAIT, LIST_TIMEOUT, PAGE_ENTRIES};
use crate::node::ringorder::{Arcs, For};
use crate::node::{Epoch, Node};
use crate::store::ObjState;

/// A peer's answer to one listing request.
enum Page {
    Entries(Vec<(ObjectId, ObjState)>),
    /// Too many for one page: ask in this many parts.
    Split(u32),
}

/// How a request to a peer ended.
enum Asked {
    /// Its payload and `aux`.
    Ok(Bytes, u32),
    /// The peer does not know the request (it closed the connection, or answered
    /// `InvalidRequest`): an older version.
    Unknown,
    Failed,
}

/// What [`Node::list_peers`] gave.
pub(super) struct Listed {
    /// Each source's listing, in the order asked; None for a peer that did not answer.
    pub(super) lists: Vec<Option<Vec<(ObjectId, ObjState)>>>,
    /// Listing entries fetched (17 bytes each), arc digests fetched (24 bytes each), and
    /// requests sent.
    pub(super) entries: u64,
    pub(super) digests: u64,
    pub(super) requests: u64,
}

/// What is known of a peer's arc after its digest: the same entries as this node's, or only
/// their digest.
enum Known {
    List(Arc<ArcList>),
    Digest(ArcDigest),
}

impl Known {
    fn count(&self) -> u32 {
        match self {
            Known::List(l) => l.len() as u32,
            Known::Digest(d) => d.count,
        }
    }
}

/// A peer's answer to `PeerDigest`.
enum Digests {
    Arcs(Vec<ArcDigest>),
    /// Ask it for its whole listing.
    Whole,
    Down,
}

impl Node {
    /// One request to `addr` at `epoch`, retried while the peer has not reached the epoch or
    /// finished the changes of earlier ones (for [`LIST_BEHIND_WAIT`]).
    async fn ask_peer(&self, addr: SocketAddr, op: Opcode, epoch: u32, req: Bytes) -> Asked {
        let deadline = tokio::time::Instant::now() + LIST_BEHIND_WAIT;
        loop {
            let h = Header::request(op, 0, epoch);
            let Ok(conn) = self.peers.get(addr, LIST_TIMEOUT).await else {
                return Asked::Failed;
            };
            match conn.call(h, req.clone(), LIST_TIMEOUT).await {
                Ok(f) if f.header.result_code() == ResultCode::Ok => {
                    return Asked::Ok(f.payload, f.header.aux)
                }
                Ok(f)
                    if matches!(
                        f.header.result_code(),
                        ResultCode::NodeBehind | ResultCode::Busy
                    ) && tokio::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(f) if f.header.result_code() == ResultCode::InvalidRequest => {
                    return Asked::Unknown
                }
                Ok(_) => return Asked::Failed,
                Err(e) => {
                    self.peers.drop_conn(addr).await;
                    return match e {
                        ConnError::Closed(_) => Asked::Unknown,
                        _ => Asked::Failed,
                    };
                }
            }
        }
    }

    /// Lists `(oid, state)` from a peer: what `req` asks for (the objects this node holds in
    /// `epoch`, and its lost copies it no longer holds). Asked whole first; a peer with more
    /// than a page of them answers how many parts to ask, each then its own request. With the
    /// number of requests sent. None if the peer did not answer (not up, or hanging).
    async fn list_peer(
        &self,
        addr: SocketAddr,
        epoch: u32,
        req: &ListRequest,
    ) -> Option<(Vec<(ObjectId, ObjState)>, u64)> {
        let whole = ListRequest {
            part: 0,
            parts: 1,
            ..req.clone()
        };
        let parts = match self.list_page(addr, epoch, whole.encode()).await? {
            Page::Entries(all) => return Some((all, 1)),
            Page::Split(parts) => parts,
        };
        let mut all = Vec::new();
        for part in 0..parts {
            let req = ListRequest {
                part,
                parts,
                ..req.clone()
            };
            match self.list_page(addr, epoch, req.encode()).await? {
                Page::Entries(page) => all.extend(page),
                Page::Split(_) => return None,
            }
        }
        Some((all, 1 + u64::from(parts)))
    }

    /// One page of [`Node::list_peer`].
    async fn list_page(&self, addr: SocketAddr, epoch: u32, req: Bytes) -> Option<Page> {
        match self.ask_peer(addr, Opcode::PeerList, epoch, req).await {
            Asked::Ok(_, aux) if aux > 0 => Some(Page::Split(aux)),
            Asked::Ok(payload, _) => decode_list(&payload).map(Page::Entries),
            Asked::Unknown | Asked::Failed => None,
        }
    }

    /// The digests of the arcs `addr` holds copies of, of those this node holds in `epoch`.
    /// A peer with more than `ringorder::DIGEST_ENTRIES` such entries is listed whole (in parts past a
    /// page) instead ([`Digests::Whole`]): its arcs hold hundreds of thousands of entries each
    /// (a cluster of few nodes of millions of objects), so one changed object costs a whole
    /// arc to fetch, and digests on top cost more than they save (a node of 5 million objects
    /// planned in 5.6 s with them, 2.9 s without).
    async fn peer_digests(&self, addr: SocketAddr, epoch: u32, req: &ListRequest) -> Digests {
        match self
            .ask_peer(addr, Opcode::PeerDigest, epoch, req.encode())
            .await
        {
            Asked::Ok(payload, 0) => match decode_digests(&payload) {
                Some(ds) => Digests::Arcs(ds),
                None => Digests::Whole,
            },
            Asked::Ok(..) | Asked::Unknown => Digests::Whole,
            Asked::Failed => Digests::Down,
        }
    }

    /// `addr`'s entries in `arcs` (with the count each was said to have), about half a page
    /// at a time (as the parts of a `PeerList`).
    /// With the requests sent; None if the peer did not answer or answered other arcs.
    async fn peer_arcs(
        &self,
        addr: SocketAddr,
        epoch: u32,
        req: &ListRequest,
        arcs: &[(u32, u32)],
    ) -> (Option<HashMap<u32, ArcList>>, u64) {
        let mut out = HashMap::new();
        let mut requests = 0;
        let mut rest = arcs;
        while !rest.is_empty() {
            let mut n = 0;
            let mut sum = 0usize;
            while n < rest.len() && (n == 0 || sum + rest[n].1 as usize <= PAGE_ENTRIES / 2) {
                sum += rest[n].1 as usize;
                n += 1;
            }
            let (batch, next) = rest.split_at(n);
            rest = next;
            let ask = ArcsRequest {
                owner: req.owner,
                copies: req.copies,
                arcs: batch.iter().map(|(a, _)| *a).collect(),
            };
            requests += 1;
            let answer = match self
                .ask_peer(addr, Opcode::PeerArcs, epoch, ask.encode())
                .await
            {
                Asked::Ok(payload, _) => decode_arcs(&payload),
                Asked::Unknown | Asked::Failed => None,
            };
            match answer {
                Some(got) if got.iter().map(|(a, _)| *a).eq(ask.arcs.iter().copied()) => {
                    out.extend(got)
                }
                _ => return (None, requests),
            }
        }
        (Some(out), requests)
    }

    /// Each of `sources`' listing for `req` (see the module's doc), with what it cost.
    pub(super) async fn list_peers(
        &self,
        ep: &Arc<Epoch>,
        sources: &[SocketAddr],
        req: &ListRequest,
    ) -> Listed {
        let e = ep.view.epoch;
        if !req.extra.is_empty() {
            return self.list_whole(sources, e, req).await;
        }
        // The peers' digests first, then this node's own: building both at once on a node of
        // millions of objects starved its peers' requests past their timeout.
        let digests =
            futures::future::join_all(sources.iter().map(|&a| self.peer_digests(a, e, req))).await;
        // Nothing to compare with when no peer answered digests.
        let any = digests.iter().any(|d| matches!(d, Digests::Arcs(_)));
        let mine = match any {
            true => self.own_arcs(ep, req).await,
            false => Some(HashMap::new()),
        };
        let Some(mine) = mine else {
            return self.list_whole(sources, e, req).await;
        };
        let mut listed = Listed {
            lists: Vec::new(),
            entries: 0,
            digests: 0,
            requests: sources.len() as u64,
        };
        // For each peer: its arcs, each with its entries where known (this node's, the same)
        // or the digest they must have.
        let mut arcs: Vec<Option<BTreeMap<u32, Known>>> = Vec::with_capacity(sources.len());
        let mut whole = Vec::new();
        for (i, d) in digests.into_iter().enumerate() {
            let Digests::Arcs(ds) = d else {
                if matches!(d, Digests::Whole) {
                    whole.push(i);
                }
                arcs.push(None);
                continue;
            };
            listed.digests += ds.len() as u64;
            let known = (ds.into_iter()).map(|d| match mine.get(&d.arc) {
                Some((m, list)) if m.digest == d.digest => (d.arc, Known::List(list.clone())),
                _ => (d.arc, Known::Digest(d)),
            });
            arcs.push(Some(known.collect()));
        }
        // Groups that agree on an arc: one member, in turn by arc, is asked for it.
        let mut groups: BTreeMap<(u32, [u8; 16]), Vec<usize>> = BTreeMap::new();
        for (i, a) in arcs.iter().enumerate() {
            for k in a.iter().flat_map(|a| a.values()) {
                if let Known::Digest(d) = k {
                    groups.entry((d.arc, d.digest)).or_default().push(i);
                }
            }
        }
        let asked = |arc: u32, members: &[usize]| members[arc as usize % members.len()];
        // Peer `i`'s arc, with the entries its digest says it has.
        let ask = |i: usize, arc: u32| (arc, arcs[i].as_ref().map_or(0, |a| a[&arc].count()));
        let mut asks: BTreeMap<usize, Vec<(u32, u32)>> = BTreeMap::new();
        for ((arc, _), members) in &groups {
            let who = asked(*arc, members);
            asks.entry(who).or_default().push(ask(who, *arc));
        }
        let whole_lists =
            futures::future::join_all(whole.iter().map(|&i| self.list_peer(sources[i], e, req)));
        let (mut fetched, whole_lists) =
            futures::join!(self.fetch_arcs(sources, e, req, &asks), whole_lists);
        // What a group's member answered stands for the others only if it still has the
        // group's digest; else each is asked for its own.
        let mut own: HashMap<(usize, u32), Arc<ArcList>> = HashMap::new();
        let mut again: BTreeMap<usize, Vec<(u32, u32)>> = BTreeMap::new();
        let mut down = vec![false; sources.len()];
        for ((arc, digest), members) in &groups {
            let who = asked(*arc, members);
            let got = fetched[who].0.as_mut().and_then(|l| l.remove(arc));
            let got = got.map(Arc::new);
            if got.is_none() {
                down[who] = true;
            }
            if let Some(got) = &got {
                listed.entries += got.len() as u64;
            }
            let stands = got.as_ref().is_some_and(|l| digest_of(l) == *digest);
            for &m in members {
                match &got {
                    Some(l) if stands || m == who => {
                        own.insert((m, *arc), l.clone());
                    }
                    _ if m == who => {}
                    _ => again.entry(m).or_default().push(ask(m, *arc)),
                }
            }
        }
        listed.requests += fetched.iter().map(|(_, n)| n).sum::<u64>();
        for (m, (lists, n)) in self
            .fetch_arcs(sources, e, req, &again)
            .await
            .into_iter()
            .enumerate()
        {
            listed.requests += n;
            match lists {
                Some(lists) => {
                    for (arc, l) in lists {
                        listed.entries += l.len() as u64;
                        own.insert((m, arc), Arc::new(l));
                    }
                }
                None if again.contains_key(&m) => down[m] = true,
                None => {}
            }
        }
        let mut whole_lists = whole_lists.into_iter();
        for (i, a) in arcs.into_iter().enumerate() {
            let list = match a {
                None if whole.contains(&i) => {
                    let got = whole_lists.next().flatten();
                    if let Some((l, n)) = &got {
                        listed.entries += l.len() as u64;
                        listed.requests += n;
                    }
                    got.map(|(l, _)| l)
                }
                None => None,
                Some(_) if down[i] => None,
                Some(a) => {
                    let mut l = Vec::new();
                    for (arc, k) in a {
                        match k {
                            Known::List(list) => l.extend_from_slice(&list),
                            Known::Digest(_) => l.extend_from_slice(&own[&(i, arc)]),
                        }
                    }
                    l.sort_unstable_by_key(|(o, _)| *o);
                    Some(l)
                }
            };
            listed.lists.push(list);
        }
        listed
    }

    /// This node's own listing of each arc it holds (what it would answer a peer), with its
    /// digest. None if it could not be read.
    async fn own_arcs(
        &self,
        ep: &Arc<Epoch>,
        req: &ListRequest,
    ) -> Option<HashMap<u32, (ArcDigest, Arc<ArcList>)>> {
        let lists = self
            .arc_lists(
                For::Me,
                ep.clone(),
                req.owner,
                req.copies as usize,
                Arcs::All,
            )
            .await
            .ok()?
            .ok()?;
        self.low_priority(move || {
            (lists.into_iter())
                .map(|(a, l)| (a, (arc_digest(a, &l), Arc::new(l))))
                .collect()
        })
        .await
        .ok()
    }

    /// For each source with arcs in `asks`: its entries of those arcs (None if it did not
    /// answer or was not asked), and the requests sent.
    async fn fetch_arcs(
        &self,
        sources: &[SocketAddr],
        e: u32,
        req: &ListRequest,
        asks: &BTreeMap<usize, Vec<(u32, u32)>>,
    ) -> Vec<(Option<HashMap<u32, ArcList>>, u64)> {
        let each = (0..sources.len()).map(|i| async move {
            match asks.get(&i) {
                Some(arcs) => self.peer_arcs(sources[i], e, req, arcs).await,
                None => (None, 0),
            }
        });
        futures::future::join_all(each).await
    }

    /// Every source's whole `PeerList`.
    async fn list_whole(&self, sources: &[SocketAddr], e: u32, req: &ListRequest) -> Listed {
        let all =
            futures::future::join_all(sources.iter().map(|&a| self.list_peer(a, e, req))).await;
        let entries = all.iter().flatten().map(|(l, _)| l.len() as u64).sum();
        let requests = all.iter().flatten().map(|(_, r)| r).sum();
        Listed {
            lists: all.into_iter().map(|l| l.map(|(l, _)| l)).collect(),
            entries,
            digests: 0,
            requests,
        }
    }
}
