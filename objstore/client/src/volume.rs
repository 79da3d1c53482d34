//! The volume trait: what a layer above the cluster (sheepfs, its cache) needs of a VDI, so
//! that it can run over a real [`Vdi`] or, in tests, over [`MemVolume`] without processes,
//! sockets or root.

use std::future::Future;
use std::sync::Mutex;

use bytes::Bytes;
use objstore_proto::extent::extents;

use crate::vdi::{Vdi, VdiError};

/// A virtual disk: byte-addressed I/O cut into objects of [`Volume::object_size`] bytes.
pub trait Volume: Send + Sync + 'static {
    /// The VDI's name.
    fn name(&self) -> String;
    /// The VDI's id.
    fn vid(&self) -> u32;
    /// Its size in bytes.
    fn size(&self) -> u64;
    /// Its object size in bytes.
    fn object_size(&self) -> u32;
    /// Whether object `index` holds data (false: a hole, which reads as zeros).
    fn is_allocated(&self, index: u64) -> bool;
    /// Reads `len` bytes at `offset`.
    fn read_at(
        &self,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Bytes, VdiError>> + Send;
    /// Writes `data` at `offset`.
    fn write_at(
        &self,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = Result<(), VdiError>> + Send;
    /// Makes `[offset, offset+len)` read as zeros.
    fn discard(&self, offset: u64, len: u64) -> impl Future<Output = Result<(), VdiError>> + Send;
    /// Makes every earlier write durable.
    fn flush(&self) -> impl Future<Output = Result<(), VdiError>> + Send;
    /// Picks up changes made through another handle (size, allocation).
    fn refresh(&self) -> impl Future<Output = Result<(), VdiError>> + Send;
}

impl Volume for Vdi {
    fn name(&self) -> String {
        self.header().name
    }
    fn vid(&self) -> u32 {
        self.header().vid
    }
    fn size(&self) -> u64 {
        Vdi::size(self)
    }
    fn object_size(&self) -> u32 {
        Vdi::object_size(self)
    }
    fn is_allocated(&self, index: u64) -> bool {
        self.object(index).is_some()
    }
    async fn read_at(&self, offset: u64, len: u64) -> Result<Bytes, VdiError> {
        Vdi::read_at(self, offset, len).await
    }
    async fn write_at(&self, offset: u64, data: Bytes) -> Result<(), VdiError> {
        Vdi::write_at(self, offset, data).await
    }
    async fn discard(&self, offset: u64, len: u64) -> Result<(), VdiError> {
        Vdi::discard(self, offset, len).await
    }
    async fn flush(&self) -> Result<(), VdiError> {
        Vdi::flush(self).await
    }
    async fn refresh(&self) -> Result<(), VdiError> {
        Vdi::refresh(self).await
    }
}

/// A volume in memory, for tests of the layers above the cluster. It counts requests so a
/// test can tell what reached the "cluster", and can be told to fail.
pub struct MemVolume {
    name: String,
    vid: u32,
    object_size: u32,
    state: Mutex<MemState>,
}

#[derive(Default)]
struct MemState {
    size: u64,
    /// Object index → its bytes (absent: a hole).
    objects: std::collections::BTreeMap<u64, Vec<u8>>,
    stats: MemStats,
    fail: bool,
}

/// What reached a [`MemVolume`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemStats {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub discards: u64,
    pub flushes: u64,
}

impl MemVolume {
    pub fn new(name: &str, vid: u32, size: u64, object_size: u32) -> MemVolume {
        MemVolume {
            name: name.into(),
            vid,
            object_size,
            state: Mutex::new(MemState {
                size,
                ..MemState::default()
            }),
        }
    }

    /// Requests so far.
    pub fn stats(&self) -> MemStats {
        self.state.lock().unwrap().stats
    }

    /// Makes every later request fail with [`VdiError::Unavailable`] (`true`) or succeed again.
    pub fn set_failing(&self, fail: bool) {
        self.state.lock().unwrap().fail = fail;
    }

    /// Changes the size, as another client's resize would (seen after [`Volume::refresh`]).
    pub fn set_size(&self, size: u64) {
        self.state.lock().unwrap().size = size;
    }

    /// The bytes as a reader of the durable state would see them.
    pub fn contents(&self) -> Vec<u8> {
        let st = self.state.lock().unwrap();
        let mut out = vec![0u8; st.size as usize];
        let os = self.object_size as u64;
        for (&idx, data) in &st.objects {
            let start = (idx * os) as usize;
            let end = (start + data.len()).min(out.len());
            out[start..end].copy_from_slice(&data[..end - start]);
        }
        out
    }

    fn check(&self, st: &MemState, offset: u64, len: u64) -> Result<(), VdiError> {
        if st.fail {
            return Err(VdiError::Unavailable {
                name: self.name.clone(),
                reason: "the in-memory volume was told to fail".into(),
            });
        }
        match offset.checked_add(len) {
            Some(end) if end <= st.size => Ok(()),
            _ => Err(VdiError::OutOfRange {
                name: self.name.clone(),
                offset,
                len,
                size: st.size,
            }),
        }
    }

    fn apply(&self, st: &mut MemState, offset: u64, data: Option<&[u8]>, len: u64) {
        let os = self.object_size as u64;
        for e in extents(offset, len, os) {
            let whole = e.offset == 0 && e.len == os;
            match data {
                None if whole => {
                    st.objects.remove(&e.index);
                }
                None => {
                    if let Some(obj) = st.objects.get_mut(&e.index) {
                        obj[e.offset as usize..(e.offset + e.len) as usize].fill(0);
                    }
                }
                Some(d) => {
                    let obj = st
                        .objects
                        .entry(e.index)
                        .or_insert_with(|| vec![0u8; os as usize]);
                    obj[e.offset as usize..(e.offset + e.len) as usize]
                        .copy_from_slice(&d[e.at..e.at + e.len as usize]);
                }
            }
        }
    }
}

impl Volume for MemVolume {
    fn name(&self) -> String {
        self.name.clone()
    }
    fn vid(&self) -> u32 {
        self.vid
    }
    fn size(&self) -> u64 {
        self.state.lock().unwrap().size
    }
    fn object_size(&self) -> u32 {
        self.object_size
    }
    fn is_allocated(&self, index: u64) -> bool {
        self.state.lock().unwrap().objects.contains_key(&index)
    }
    async fn read_at(&self, offset: u64, len: u64) -> Result<Bytes, VdiError> {
        let mut st = self.state.lock().unwrap();
        self.check(&st, offset, len)?;
        st.stats.reads += 1;
        st.stats.read_bytes += len;
        let os = self.object_size as u64;
        let mut out = vec![0u8; len as usize];
        for e in extents(offset, len, os) {
            if let Some(obj) = st.objects.get(&e.index) {
                out[e.at..e.at + e.len as usize]
                    .copy_from_slice(&obj[e.offset as usize..(e.offset + e.len) as usize]);
            }
        }
        Ok(Bytes::from(out))
    }
    async fn write_at(&self, offset: u64, data: Bytes) -> Result<(), VdiError> {
        let mut st = self.state.lock().unwrap();
        self.check(&st, offset, data.len() as u64)?;
        st.stats.writes += 1;
        st.stats.write_bytes += data.len() as u64;
        self.apply(&mut st, offset, Some(&data), data.len() as u64);
        Ok(())
    }
    async fn discard(&self, offset: u64, len: u64) -> Result<(), VdiError> {
        let mut st = self.state.lock().unwrap();
        self.check(&st, offset, len)?;
        st.stats.discards += 1;
        self.apply(&mut st, offset, None, len);
        Ok(())
    }
    async fn flush(&self) -> Result<(), VdiError> {
        let mut st = self.state.lock().unwrap();
        self.check(&st, 0, 0)?;
        st.stats.flushes += 1;
        Ok(())
    }
    async fn refresh(&self) -> Result<(), VdiError> {
        let st = self.state.lock().unwrap();
        self.check(&st, 0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn mem_volume_reads_what_was_written() {
        let v = MemVolume::new("m", 7, 64, 16);
        v.write_at(10, Bytes::from_static(b"hello world!"))
            .await
            .unwrap();
        assert_eq!(&v.read_at(10, 12).await.unwrap()[..], b"hello world!");
        assert!(v.is_allocated(0) && v.is_allocated(1) && !v.is_allocated(2));
        v.discard(16, 16).await.unwrap();
        assert!(!v.is_allocated(1));
        assert_eq!(&v.read_at(10, 12).await.unwrap()[..], b"hello \0\0\0\0\0\0");
        assert!(matches!(
            v.read_at(60, 8).await,
            Err(VdiError::OutOfRange { .. })
        ));
        v.set_failing(true);
        assert!(v.flush().await.is_err());
        assert_eq!(v.stats().writes, 1);
    }
}
