//! The erasure code of `x:y` objects: how an object is cut into x data strips and y parity
//! strips, and how any x of them give back the rest (Reed-Solomon over GF(2^16),
//! `reed-solomon-simd`). The protocol that keeps strips consistent is in docs/architecture.md
//! ("Erasure-coded objects"); [`resolve`] is its rule for a stripe a crash left mixed.
//!
//! ```text
//!  object:  [ strip 0: bytes 0..L | strip 1: L..2L | ... | strip x-1 (zero padded) ]
//!  parity:  strip x .. x+y-1, each L bytes; bytes a..b of each depend only on bytes a..b
//!           of the data strips (64-byte columns), and linearly (XOR is addition)
//! ```
//! `L` is `object_size / x` rounded up to [`COLUMN`]. Because parity is column-local and linear,
//! a write of a few bytes of one data strip changes parity only over the columns it touches,
//! by [`Codec::parity_delta`] of the old and new bytes there, and a range of an object can be
//! decoded from the same range of any x strips ([`Codec::reconstruct`] on sub-slices).

pub mod resolve;
pub mod wire;

use std::cell::RefCell;
use std::ops::Range;

use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};

use crate::redundancy::Redundancy;

/// Strips are cut and coded in columns of this many bytes (the code's own unit: 32 symbols of
/// GF(2^16)); a range that is coded alone starts and ends on a column.
pub const COLUMN: usize = 64;

/// Why strips could not be coded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EcError {
    /// Fewer than x strips of the stripe are at hand.
    #[error("only {have} of the {need} strips needed to decode are available")]
    TooFew { have: usize, need: usize },
    /// Strips given to the codec do not fit its scheme (a bug in the caller).
    #[error("strips do not fit the code: {0}")]
    Shape(String),
}

/// The code of one scheme and object size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Codec {
    data: usize,
    parity: usize,
    strip_len: usize,
    object_size: usize,
}

/// One piece of an object range that lies in one data strip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub strip: usize,
    /// Where the piece starts in its strip.
    pub strip_offset: usize,
    /// Where the piece starts in the range asked for.
    pub at: usize,
    pub len: usize,
}

impl Codec {
    /// The code of `scheme` (an `x:y` one) for objects of `object_size` bytes.
    pub fn new(scheme: Redundancy, object_size: u64) -> Result<Codec, String> {
        let Redundancy::Ec { data, parity } = scheme else {
            return Err(format!("{scheme} copies is not an erasure code"));
        };
        scheme.validate(0, usize::MAX)?;
        let data = data as usize;
        let object_size =
            usize::try_from(object_size).map_err(|_| format!("object size {object_size}"))?;
        if object_size == 0 {
            return Err("object size 0".into());
        }
        let strip_len = object_size.div_ceil(data).div_ceil(COLUMN) * COLUMN;
        Ok(Codec {
            data,
            parity: parity as usize,
            strip_len,
            object_size,
        })
    }

    pub fn data(&self) -> usize {
        self.data
    }

    pub fn parity(&self) -> usize {
        self.parity
    }

    /// Strips of a stripe, data and parity.
    pub fn strips(&self) -> usize {
        self.data + self.parity
    }

    /// Bytes of each strip.
    pub fn strip_len(&self) -> usize {
        self.strip_len
    }

    /// The pieces of object bytes `offset .. offset + len`, one per data strip it crosses.
    pub fn locate(&self, offset: usize, len: usize) -> Vec<Piece> {
        let end = (offset + len).min(self.object_size);
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            let strip = at / self.strip_len;
            let strip_offset = at % self.strip_len;
            let n = (self.strip_len - strip_offset).min(end - at);
            out.push(Piece {
                strip,
                strip_offset,
                at: at - offset,
                len: n,
            });
            at += n;
        }
        out
    }

    /// `start .. end` of a strip widened to whole columns (what a partial write recodes).
    pub fn columns(&self, strip_offset: usize, len: usize) -> Range<usize> {
        let start = strip_offset / COLUMN * COLUMN;
        let end = ((strip_offset + len).div_ceil(COLUMN) * COLUMN).min(self.strip_len);
        start..end
    }

    /// The x data strips of `object` (shorter than the object size: the rest is zeros).
    pub fn split(&self, object: &[u8]) -> Vec<Vec<u8>> {
        (0..self.data)
            .map(|i| {
                let mut s = vec![0u8; self.strip_len];
                let from = (i * self.strip_len).min(object.len());
                let to = ((i + 1) * self.strip_len).min(object.len());
                s[..to - from].copy_from_slice(&object[from..to]);
                s
            })
            .collect()
    }

    /// The object the x data strips hold.
    pub fn join(&self, data: &[impl AsRef<[u8]>]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.data * self.strip_len);
        for d in &data[..self.data] {
            out.extend_from_slice(d.as_ref());
        }
        out.truncate(self.object_size);
        out
    }

    /// The y parity strips (or parity ranges) of x data strips (or the same range of each).
    pub fn parity_of(&self, data: &[impl AsRef<[u8]>]) -> Result<Vec<Vec<u8>>, EcError> {
        let len = self.shape(data.iter().map(|d| d.as_ref().len()), data.len(), self.data)?;
        with_encoder(self.data, self.parity, len, |enc| {
            for d in data {
                enc.add_original_shard(d).map_err(shape)?;
            }
            let r = enc.encode().map_err(shape)?;
            Ok(r.recovery_iter().map(|p| p.to_vec()).collect())
        })
    }

    /// Every strip of `object`: its x data strips, then its y parity strips.
    pub fn encode(&self, object: &[u8]) -> Vec<Vec<u8>> {
        let mut strips = self.split(object);
        let parity = self
            .parity_of(&strips)
            .expect("strips of the codec's own shape");
        strips.extend(parity);
        strips
    }

    /// Fills in every missing strip (or the same range of each) from any x present ones.
    /// With fewer than x present nothing is changed and the error says how many there are.
    pub fn reconstruct(&self, strips: &mut [Option<Vec<u8>>]) -> Result<(), EcError> {
        let len = self.shape(
            strips.iter().flatten().map(|s| s.len()),
            strips.len(),
            self.strips(),
        )?;
        let have = strips.iter().flatten().count();
        if have < self.data {
            return Err(EcError::TooFew {
                have,
                need: self.data,
            });
        }
        if have == strips.len() {
            return Ok(());
        }
        if strips[..self.data].iter().any(Option::is_none) {
            let restored: Vec<(usize, Vec<u8>)> =
                with_decoder(self.data, self.parity, len, |dec| {
                    for (i, s) in strips.iter().enumerate() {
                        if let Some(s) = s {
                            if i < self.data {
                                dec.add_original_shard(i, s).map_err(shape)?;
                            } else {
                                dec.add_recovery_shard(i - self.data, s).map_err(shape)?;
                            }
                        }
                    }
                    let r = dec.decode().map_err(shape)?;
                    Ok(r.restored_original_iter()
                        .map(|(i, s)| (i, s.to_vec()))
                        .collect())
                })?;
            for (i, s) in restored {
                strips[i] = Some(s);
            }
        }
        if strips[self.data..].iter().any(Option::is_none) {
            let data: Vec<&[u8]> = strips[..self.data]
                .iter()
                .map(|s| s.as_deref().expect("data restored"))
                .collect();
            let parity = self.parity_of(&data)?;
            for (j, p) in parity.into_iter().enumerate() {
                strips[self.data + j].get_or_insert(p);
            }
        }
        Ok(())
    }

    /// What to XOR into each parity strip when bytes of data strip `strip` change from `old`
    /// to `new` (the same whole columns of the strip: see [`Codec::columns`]).
    pub fn parity_delta(
        &self,
        strip: usize,
        old: &[u8],
        new: &[u8],
    ) -> Result<Vec<Vec<u8>>, EcError> {
        if strip >= self.data || old.len() != new.len() {
            return Err(EcError::Shape(format!(
                "a delta of data strip {strip} of {} from {} bytes to {}",
                self.data,
                old.len(),
                new.len()
            )));
        }
        let zero = vec![0u8; old.len()];
        let mut diff = old.to_vec();
        xor_into(&mut diff, new);
        let data: Vec<&[u8]> = (0..self.data)
            .map(|i| if i == strip { &diff[..] } else { &zero[..] })
            .collect();
        self.parity_of(&data)
    }

    /// The common length of `count` strips (of `want`), a whole number of columns.
    fn shape(
        &self,
        lens: impl Iterator<Item = usize>,
        count: usize,
        want: usize,
    ) -> Result<usize, EcError> {
        if count != want {
            return Err(EcError::Shape(format!("{count} strips, not {want}")));
        }
        let mut len = None;
        for l in lens {
            if *len.get_or_insert(l) != l {
                return Err(EcError::Shape(format!(
                    "strips of {l} and {} bytes",
                    len.unwrap()
                )));
            }
        }
        match len {
            Some(l) if l > 0 && l.is_multiple_of(COLUMN) && l <= self.strip_len => Ok(l),
            Some(l) => Err(EcError::Shape(format!(
                "strips of {l} bytes (whole columns of {COLUMN} up to {})",
                self.strip_len
            ))),
            None => Err(EcError::TooFew {
                have: 0,
                need: self.data,
            }),
        }
    }
}

/// `dst ^= src`, byte by byte (the two of one length).
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (a, b) in (&mut d).zip(&mut s) {
        let v =
            u64::from_ne_bytes(a.try_into().unwrap()) ^ u64::from_ne_bytes(b.try_into().unwrap());
        a.copy_from_slice(&v.to_ne_bytes());
    }
    for (a, b) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *a ^= b;
    }
}

fn shape(e: reed_solomon_simd::Error) -> EcError {
    EcError::Shape(e.to_string())
}

/// A coder kept with the shape (data, parity, bytes) it was made for.
type Cached<T> = RefCell<Option<((usize, usize, usize), T)>>;

thread_local! {
    /// The last encoder and decoder of this thread: their work space is reused while the shape
    /// stays the same (one scheme, one strip length).
    static ENCODER: Cached<ReedSolomonEncoder> = const { RefCell::new(None) };
    static DECODER: Cached<ReedSolomonDecoder> = const { RefCell::new(None) };
}

fn with_encoder<T>(
    data: usize,
    parity: usize,
    len: usize,
    f: impl FnOnce(&mut ReedSolomonEncoder) -> Result<T, EcError>,
) -> Result<T, EcError> {
    ENCODER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let key = (data, parity, len);
        match slot.as_mut() {
            Some((k, _)) if *k == key => {}
            Some((k, enc)) => {
                enc.reset(data, parity, len).map_err(shape)?;
                *k = key;
            }
            None => {
                *slot = Some((
                    key,
                    ReedSolomonEncoder::new(data, parity, len).map_err(shape)?,
                ))
            }
        }
        let (_, enc) = slot.as_mut().expect("set above");
        let out = f(enc);
        if out.is_err() {
            *slot = None;
        }
        out
    })
}

fn with_decoder<T>(
    data: usize,
    parity: usize,
    len: usize,
    f: impl FnOnce(&mut ReedSolomonDecoder) -> Result<T, EcError>,
) -> Result<T, EcError> {
    DECODER.with(|cell| {
        let mut slot = cell.borrow_mut();
        let key = (data, parity, len);
        match slot.as_mut() {
            Some((k, dec)) if *k == key => dec.reset(data, parity, len).map_err(shape)?,
            Some((k, dec)) => {
                dec.reset(data, parity, len).map_err(shape)?;
                *k = key;
            }
            None => {
                *slot = Some((
                    key,
                    ReedSolomonDecoder::new(data, parity, len).map_err(shape)?,
                ))
            }
        }
        let (_, dec) = slot.as_mut().expect("set above");
        let out = f(dec);
        if out.is_err() {
            *slot = None;
        }
        out
    })
}

#[cfg(test)]
mod tests;
