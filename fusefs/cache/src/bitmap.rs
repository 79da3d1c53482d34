//! A fixed-size bitmap, one bit per cache block, stored as little-endian u64 words.

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    bits: usize,
}

impl Bitmap {
    pub fn new(bits: usize) -> Bitmap {
        Bitmap {
            words: vec![0; bits.div_ceil(64)],
            bits,
        }
    }

    pub fn bits(&self) -> usize {
        self.bits
    }

    pub fn get(&self, i: usize) -> bool {
        self.words[i / 64] & (1 << (i % 64)) != 0
    }

    pub fn set_range(&mut self, from: usize, to: usize, on: bool) {
        for i in from..to.min(self.bits) {
            if on {
                self.words[i / 64] |= 1 << (i % 64);
            } else {
                self.words[i / 64] &= !(1 << (i % 64));
            }
        }
    }

    pub fn all(&self, from: usize, to: usize) -> bool {
        (from..to.min(self.bits)).all(|i| self.get(i))
    }

    /// Whether any bit in `from..to` is set.
    pub fn any(&self, from: usize, to: usize) -> bool {
        (from..to.min(self.bits)).any(|i| self.get(i))
    }

    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// `self & !other`.
    pub fn minus(&self, other: &Bitmap) -> Bitmap {
        Bitmap {
            words: self
                .words
                .iter()
                .zip(&other.words)
                .map(|(a, b)| a & !b)
                .collect(),
            bits: self.bits,
        }
    }

    /// Maximal runs of set bits as `[start, end)`.
    pub fn runs(&self) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.bits {
            if self.get(i) {
                let s = i;
                while i < self.bits && self.get(i) {
                    i += 1;
                }
                out.push((s, i));
            } else {
                i += 1;
            }
        }
        out
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    pub fn byte_len(bits: usize) -> usize {
        bits.div_ceil(64) * 8
    }

    pub fn from_bytes(b: &[u8], bits: usize) -> Option<Bitmap> {
        if b.len() != Self::byte_len(bits) {
            return None;
        }
        let words = b
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let m = Bitmap { words, bits };
        // No bits beyond `bits` may be set.
        (bits..m.words.len() * 64)
            .all(|i| m.words[i / 64] & (1 << (i % 64)) == 0)
            .then_some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops() {
        let mut b = Bitmap::new(100);
        b.set_range(3, 7, true);
        b.set_range(64, 70, true);
        assert!(b.all(3, 7) && !b.all(2, 7));
        assert_eq!(b.count(), 10);
        assert_eq!(b.runs(), vec![(3, 7), (64, 70)]);
        let mut c = Bitmap::new(100);
        c.set_range(4, 66, true);
        assert_eq!(b.minus(&c).runs(), vec![(3, 4), (66, 70)]);
        let round = Bitmap::from_bytes(&b.to_bytes(), 100).unwrap();
        assert_eq!(round, b);
        assert!(
            Bitmap::from_bytes(&[0xff; 16], 100).is_none(),
            "bits past the end"
        );
        assert!(Bitmap::from_bytes(&[0; 8], 100).is_none(), "wrong length");
    }
}
