//! The delta stream of `dog vdi backup` / `dog vdi restore`, byte by byte in
//! `docs/backup.md`: a header, records in increasing offset order, a trailer.
//!
//! ```text
//! header   "DOGDELTA" version:u16 flags:u16 object_size:u32 size:u64 from_size:u64
//!          from_time:u64 to_time:u64 name:(u16 len, bytes) from_tag:(..) to_tag:(..) crc:u32
//! record   kind:u8 ('D' data | 'Z' zeros) offset:u64 len:u64 [len bytes, 'D' only] crc:u32
//! trailer  'E' records:u64 data_bytes:u64 stream_crc:u32
//! ```
//!
//! All integers big-endian; every checksum is crc32c. A record's covers its own bytes from the
//! kind on; the header's covers the header; the trailer's covers every byte of the stream
//! before it. The decoder ([`DeltaReader`]) checks everything it can before it hands a record
//! on: a record it returns passed its checksum, lies inside the VDI, after the previous one,
//! and (data) inside one object. The stream as a whole is only known good once
//! [`DeltaReader::next`] has returned `Ok(None)` (trailer checked, nothing after it). Bad input
//! is a [`DeltaError`] naming the byte offset and the record; never a panic, and no
//! allocation larger than what was actually read.

use std::io::{self, Read, Write};

use bytes::Bytes;
use crc_fast::CrcAlgorithm;
use objstore_proto::name::{validate_name, validate_tag};
use objstore_proto::view::{MAX_OBJECT_SIZE, MIN_OBJECT_SIZE};
use thiserror::Error;

/// crc32c of the bytes whose crc32c is `crc` followed by `b`.
fn crc_append(crc: u32, b: &[u8]) -> u32 {
    // crc-fast's state is the running register, before the final inversion.
    let mut d = crc_fast::Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(b);
    d.finalize() as u32
}

pub const MAGIC: &[u8; 8] = b"DOGDELTA";
/// The version this code writes and reads.
pub const VERSION: u16 = 1;
/// Flags bit: the delta holds the changes since FROM (else the whole of TO).
pub const FLAG_INCREMENTAL: u16 = 1;
/// Bytes of the header before the names.
const FIXED_HEADER: usize = 8 + 2 + 2 + 4 + 8 * 4;
const KIND_DATA: u8 = b'D';
const KIND_ZERO: u8 = b'Z';
const KIND_END: u8 = b'E';
/// Bytes of a record before its payload (kind, offset, length).
pub const RECORD_HEAD: usize = 17;

/// What a delta is of: VDI `name` at snapshot `to_tag`, as changes since `from_tag` when that
/// is set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub object_size: u32,
    /// TO's size in bytes.
    pub size: u64,
    /// FROM's size in bytes (0 for a full delta).
    pub from_size: u64,
    /// Snapshot times, Unix seconds (0: not known; FROM's is 0 in a full delta).
    pub from_time: u64,
    pub to_time: u64,
    pub name: String,
    pub from_tag: Option<String>,
    pub to_tag: String,
}

impl Header {
    pub fn incremental(&self) -> bool {
        self.from_tag.is_some()
    }

    /// The header's bytes, checksum included.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(FIXED_HEADER + 3 * 2 + 64);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_be_bytes());
        let flags = if self.incremental() {
            FLAG_INCREMENTAL
        } else {
            0
        };
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(&self.object_size.to_be_bytes());
        for v in [self.size, self.from_size, self.from_time, self.to_time] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        for s in [
            self.name.as_str(),
            self.from_tag.as_deref().unwrap_or(""),
            self.to_tag.as_str(),
        ] {
            b.extend_from_slice(&(s.len() as u16).to_be_bytes());
            b.extend_from_slice(s.as_bytes());
        }
        let crc = crc_fast::crc32_iscsi(&b);
        b.extend_from_slice(&crc.to_be_bytes());
        b
    }

    /// Checks what the bytes cannot: sizes and names.
    fn validate(&self) -> Result<(), String> {
        let os = self.object_size;
        if !os.is_power_of_two() || !(MIN_OBJECT_SIZE..=MAX_OBJECT_SIZE).contains(&os) {
            return Err(format!(
                "object size {os} is not a power of two from 1 MiB to 64 MiB"
            ));
        }
        let max = crate::vdi::max_size(os);
        if self.size > max || self.from_size > max {
            return Err(format!(
                "VDI size {} (FROM {}) is over the limit of {max} bytes",
                self.size, self.from_size
            ));
        }
        validate_name(&self.name).map_err(|e| e.to_string())?;
        validate_tag(&self.to_tag).map_err(|e| e.to_string())?;
        match &self.from_tag {
            Some(t) => validate_tag(t).map_err(|e| e.to_string())?,
            None if self.from_size != 0 || self.from_time != 0 => {
                return Err("a full delta with a FROM size or time".into())
            }
            None => {}
        }
        Ok(())
    }
}

/// One change: `data` at `offset`, or `len` bytes of zeros (a hole) at `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Data { offset: u64, data: Bytes },
    Zero { offset: u64, len: u64 },
}

impl Record {
    pub fn offset(&self) -> u64 {
        match self {
            Record::Data { offset, .. } | Record::Zero { offset, .. } => *offset,
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            Record::Data { data, .. } => data.len() as u64,
            Record::Zero { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn end(&self) -> u64 {
        self.offset() + self.len()
    }

    /// The record's bytes before its payload.
    fn head(&self) -> [u8; RECORD_HEAD] {
        let mut h = [0u8; RECORD_HEAD];
        h[0] = match self {
            Record::Data { .. } => KIND_DATA,
            Record::Zero { .. } => KIND_ZERO,
        };
        h[1..9].copy_from_slice(&self.offset().to_be_bytes());
        h[9..17].copy_from_slice(&self.len().to_be_bytes());
        h
    }
}

/// What a finished stream held.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Data and zero records.
    pub records: u64,
    /// Bytes of data in data records.
    pub data_bytes: u64,
    /// Bytes covered by zero records.
    pub zero_bytes: u64,
    /// Bytes of the whole stream.
    pub stream_bytes: u64,
}

/// Why a delta was refused: where (byte offset, record number from 1) and what.
#[derive(Debug, Error)]
#[error("delta byte {at}{}: {kind}", record.map(|r| format!(" (record {r})")).unwrap_or_default())]
pub struct DeltaError {
    pub at: u64,
    pub record: Option<u64>,
    #[source]
    pub kind: DeltaErrorKind,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DeltaErrorKind {
    #[error("the delta ends early: expected {0}")]
    Truncated(&'static str),
    #[error("not a delta made by 'dog vdi backup' (no DOGDELTA magic)")]
    NotDelta,
    #[error("delta format version {0} is not supported (this dog reads version {VERSION})")]
    Version(u16),
    #[error("{0}")]
    Corrupt(String),
    #[error("reading the delta: {0}")]
    Io(#[source] io::Error),
}

/// Writes a delta: [`DeltaWriter::new`] writes the header, [`DeltaWriter::record`] each record
/// (in increasing offset order, not overlapping), [`DeltaWriter::finish`] the trailer.
pub struct DeltaWriter<W: Write> {
    w: W,
    header: Header,
    crc: u32,
    sum: Summary,
    end: u64,
}

impl<W: Write> DeltaWriter<W> {
    pub fn new(mut w: W, header: &Header) -> io::Result<Self> {
        header
            .validate()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let b = header.encode();
        w.write_all(&b)?;
        Ok(DeltaWriter {
            w,
            header: header.clone(),
            crc: crc_fast::crc32_iscsi(&b),
            sum: Summary {
                stream_bytes: b.len() as u64,
                ..Summary::default()
            },
            end: 0,
        })
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.w.write_all(b)?;
        self.crc = crc_append(self.crc, b);
        self.sum.stream_bytes += b.len() as u64;
        Ok(())
    }

    /// Writes one record; one out of order, empty, past the end or (data) across objects is
    /// refused with `InvalidInput`.
    pub fn record(&mut self, r: &Record) -> io::Result<()> {
        if let Err(e) = check_record(&self.header, self.end, r.offset(), r.len(), r) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
        }
        let head = r.head();
        let mut crc = crc_fast::crc32_iscsi(&head);
        self.put(&head)?;
        match r {
            Record::Data { data, .. } => {
                crc = crc_append(crc, data);
                self.put(data)?;
                self.sum.data_bytes += data.len() as u64;
            }
            Record::Zero { len, .. } => self.sum.zero_bytes += len,
        }
        self.put(&crc.to_be_bytes())?;
        self.sum.records += 1;
        self.end = r.end();
        Ok(())
    }

    /// Writes the trailer and flushes; what the stream held.
    pub fn finish(mut self) -> io::Result<Summary> {
        let mut t = [0u8; RECORD_HEAD];
        t[0] = KIND_END;
        t[1..9].copy_from_slice(&self.sum.records.to_be_bytes());
        t[9..17].copy_from_slice(&self.sum.data_bytes.to_be_bytes());
        self.put(&t)?;
        let crc = self.crc;
        self.put(&crc.to_be_bytes())?;
        self.w.flush()?;
        Ok(self.sum)
    }
}

/// What a record of `r`'s kind at `offset`, `len` must be, after one ending at `prev_end`.
fn check_record(
    h: &Header,
    prev_end: u64,
    offset: u64,
    len: u64,
    r: &Record,
) -> Result<(), String> {
    if len == 0 {
        return Err("a record of length 0".into());
    }
    let end = offset
        .checked_add(len)
        .filter(|&e| e <= h.size)
        .ok_or_else(|| {
            format!(
                "record {offset}+{len} is past the end of the VDI ({} bytes)",
                h.size
            )
        })?;
    if offset < prev_end {
        return Err(format!(
            "record at {offset} overlaps or precedes the one before (which ends at {prev_end})"
        ));
    }
    let os = h.object_size as u64;
    if matches!(r, Record::Data { .. }) && offset / os != (end - 1) / os {
        return Err(format!(
            "data record {offset}+{len} crosses an object boundary (objects of {os} bytes)"
        ));
    }
    Ok(())
}

/// Reads a delta: [`DeltaReader::new`] reads and checks the header, [`DeltaReader::next`] each
/// record, then `None` once the trailer checked out and nothing follows it.
pub struct DeltaReader<R: Read> {
    r: R,
    header: Header,
    /// Bytes read so far.
    at: u64,
    crc: u32,
    sum: Summary,
    end: u64,
    done: bool,
}

impl<R: Read> DeltaReader<R> {
    pub fn new(mut r: R) -> Result<Self, DeltaError> {
        let mut buf = Vec::with_capacity(FIXED_HEADER + 64);
        let err = |at: u64, kind| DeltaError {
            at,
            record: None,
            kind,
        };
        read_into(&mut r, &mut buf, 8, "the header's magic")?;
        if &buf[..] != MAGIC {
            return Err(err(0, DeltaErrorKind::NotDelta));
        }
        read_into(&mut r, &mut buf, FIXED_HEADER - 8, "the header")?;
        let version = u16::from_be_bytes([buf[8], buf[9]]);
        if version != VERSION {
            return Err(err(8, DeltaErrorKind::Version(version)));
        }
        let flags = u16::from_be_bytes([buf[10], buf[11]]);
        let mut names = Vec::with_capacity(3);
        for what in ["the VDI name", "FROM's tag", "TO's tag"] {
            let at = buf.len();
            read_into(&mut r, &mut buf, 2, what)?;
            let n = u16::from_be_bytes([buf[at], buf[at + 1]]) as usize;
            if n > 255 {
                return Err(err(
                    at as u64,
                    DeltaErrorKind::Corrupt(format!("{what} is {n} bytes long (at most 255)")),
                ));
            }
            read_into(&mut r, &mut buf, n, what)?;
            let s = std::str::from_utf8(&buf[at + 2..]).map_err(|_| {
                err(
                    at as u64 + 2,
                    DeltaErrorKind::Corrupt(format!("{what} is not UTF-8")),
                )
            })?;
            names.push(s.to_string());
        }
        let crc_at = buf.len() as u64;
        let mut crc = [0u8; 4];
        read_exact(&mut r, &mut crc, crc_at, None, "the header's checksum")?;
        if u32::from_be_bytes(crc) != crc_fast::crc32_iscsi(&buf) {
            return Err(err(
                crc_at,
                DeltaErrorKind::Corrupt("the header fails its checksum".into()),
            ));
        }
        let u64_at = |i: usize| u64::from_be_bytes(buf[i..i + 8].try_into().expect("8 bytes"));
        let to_tag = names.pop().expect("three names");
        let from_tag = names.pop().expect("three names");
        let header = Header {
            object_size: u32::from_be_bytes(buf[12..16].try_into().expect("4 bytes")),
            size: u64_at(16),
            from_size: u64_at(24),
            from_time: u64_at(32),
            to_time: u64_at(40),
            name: names.pop().expect("three names"),
            from_tag: (!from_tag.is_empty()).then_some(from_tag),
            to_tag,
        };
        if flags & !FLAG_INCREMENTAL != 0 {
            return Err(err(
                10,
                DeltaErrorKind::Corrupt(format!("unknown header flags {flags:#06x}")),
            ));
        }
        if (flags & FLAG_INCREMENTAL != 0) != header.incremental() {
            return Err(err(
                10,
                DeltaErrorKind::Corrupt("the incremental flag and FROM's tag disagree".into()),
            ));
        }
        header
            .validate()
            .map_err(|e| err(0, DeltaErrorKind::Corrupt(format!("bad header: {e}"))))?;
        let at = crc_at + 4;
        let mut all = buf;
        all.extend_from_slice(&crc);
        Ok(DeltaReader {
            r,
            header,
            at,
            crc: crc_fast::crc32_iscsi(&all),
            sum: Summary {
                stream_bytes: at,
                ..Summary::default()
            },
            end: 0,
            done: false,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Bytes read so far.
    pub fn position(&self) -> u64 {
        self.at
    }

    /// What the stream held (complete once [`DeltaReader::next`] returned `Ok(None)`).
    pub fn summary(&self) -> Summary {
        self.sum
    }

    fn error(&self, at: u64, kind: DeltaErrorKind) -> DeltaError {
        DeltaError {
            at,
            record: Some(self.sum.records + 1),
            kind,
        }
    }

    /// Reads `n` bytes (fewer allocated up front when `n` is large), adding them to the
    /// stream checksum.
    fn take(&mut self, n: usize, what: &'static str) -> Result<Vec<u8>, DeltaError> {
        let mut buf = Vec::with_capacity(n.min(1 << 20));
        let rec = Some(self.sum.records + 1);
        let got = (&mut self.r)
            .take(n as u64)
            .read_to_end(&mut buf)
            .map_err(|e| DeltaError {
                at: self.at,
                record: rec,
                kind: DeltaErrorKind::Io(e),
            })?;
        self.crc = crc_append(self.crc, &buf);
        if got < n {
            return Err(DeltaError {
                at: self.at + got as u64,
                record: rec,
                kind: DeltaErrorKind::Truncated(what),
            });
        }
        self.at += n as u64;
        Ok(buf)
    }

    /// The next record, or `None` at the (checked) end of the stream.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Record>, DeltaError> {
        if self.done {
            return Ok(None);
        }
        let start = self.at;
        let head = self.take(RECORD_HEAD, "a record or the trailer")?;
        let a = u64::from_be_bytes(head[1..9].try_into().expect("8 bytes"));
        let b = u64::from_be_bytes(head[9..17].try_into().expect("8 bytes"));
        let corrupt = |s: String| DeltaErrorKind::Corrupt(s);
        match head[0] {
            KIND_END => return self.trailer(start, a, b).map(|()| None),
            KIND_DATA | KIND_ZERO => {}
            k => return Err(self.error(start, corrupt(format!("unknown record kind {k:#04x}")))),
        }
        let probe = if head[0] == KIND_DATA {
            Record::Data {
                offset: a,
                data: Bytes::new(),
            }
        } else {
            Record::Zero { offset: a, len: b }
        };
        check_record(&self.header, self.end, a, b, &probe)
            .map_err(|e| self.error(start, corrupt(e)))?;
        let mut crc = crc_fast::crc32_iscsi(&head);
        let record = if head[0] == KIND_DATA {
            // Within one object (checked above), so at most 64 MiB.
            let data = self.take(b as usize, "the record's data")?;
            crc = crc_append(crc, &data);
            Record::Data {
                offset: a,
                data: Bytes::from(data),
            }
        } else {
            probe
        };
        let crc_at = self.at;
        let got = self.take(4, "the record's checksum")?;
        if u32::from_be_bytes(got[..].try_into().expect("4 bytes")) != crc {
            return Err(self.error(
                crc_at,
                corrupt(format!("the record at byte {start} fails its checksum")),
            ));
        }
        self.end = record.end();
        self.sum.records += 1;
        match &record {
            Record::Data { data, .. } => self.sum.data_bytes += data.len() as u64,
            Record::Zero { len, .. } => self.sum.zero_bytes += len,
        }
        self.sum.stream_bytes = self.at;
        Ok(Some(record))
    }

    fn trailer(&mut self, start: u64, records: u64, data_bytes: u64) -> Result<(), DeltaError> {
        let expect = self.crc;
        let crc_at = self.at;
        let got = self.take(4, "the trailer's checksum")?;
        let trailer_err = |kind| DeltaError {
            at: start,
            record: None,
            kind,
        };
        if records != self.sum.records || data_bytes != self.sum.data_bytes {
            return Err(trailer_err(DeltaErrorKind::Corrupt(format!(
                "the trailer says {records} records of {data_bytes} data bytes, the stream held {} of {}",
                self.sum.records, self.sum.data_bytes
            ))));
        }
        if u32::from_be_bytes(got[..].try_into().expect("4 bytes")) != expect {
            return Err(DeltaError {
                at: crc_at,
                record: None,
                kind: DeltaErrorKind::Corrupt("the stream fails its checksum".into()),
            });
        }
        let mut one = [0u8; 1];
        loop {
            match self.r.read(&mut one) {
                Ok(0) => break,
                Ok(_) => {
                    return Err(DeltaError {
                        at: self.at,
                        record: None,
                        kind: DeltaErrorKind::Corrupt("bytes after the end of the delta".into()),
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(DeltaError {
                        at: self.at,
                        record: None,
                        kind: DeltaErrorKind::Io(e),
                    })
                }
            }
        }
        self.sum.stream_bytes = self.at;
        self.done = true;
        Ok(())
    }
}

/// Appends `n` bytes read from `r` to `buf` (the header, so `buf.len()` is the offset).
fn read_into(
    r: &mut impl Read,
    buf: &mut Vec<u8>,
    n: usize,
    what: &'static str,
) -> Result<(), DeltaError> {
    let at = buf.len();
    buf.resize(at + n, 0);
    read_exact(r, &mut buf[at..], at as u64, None, what)
}

fn read_exact(
    r: &mut impl Read,
    buf: &mut [u8],
    at: u64,
    record: Option<u64>,
    what: &'static str,
) -> Result<(), DeltaError> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => {
                return Err(DeltaError {
                    at: at + got as u64,
                    record,
                    kind: DeltaErrorKind::Truncated(what),
                })
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(DeltaError {
                    at: at + got as u64,
                    record,
                    kind: DeltaErrorKind::Io(e),
                })
            }
        }
    }
    Ok(())
}

/// Decodes a whole delta held in memory: its header, records and summary.
pub fn decode_all(bytes: &[u8]) -> Result<(Header, Vec<Record>, Summary), DeltaError> {
    let mut r = DeltaReader::new(bytes)?;
    let mut out = Vec::new();
    while let Some(rec) = r.next()? {
        out.push(rec);
    }
    Ok((r.header().clone(), out, r.summary()))
}

/// Encodes a whole delta in memory.
pub fn encode_all(header: &Header, records: &[Record]) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut w = DeltaWriter::new(&mut out, header)?;
    for r in records {
        w.record(r)?;
    }
    w.finish()?;
    Ok(out)
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
