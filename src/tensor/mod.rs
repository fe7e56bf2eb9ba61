//! Tensors as rustccl sees them: DLPack exports with their metadata
//! (`dlpack.rs`), numpy arrays read in place (`ndarray.rs`), and safe
//! helpers over byte slices.

mod dlpack;
#[cfg(feature = "python")]
mod ndarray;

#[cfg(feature = "python")]
pub use dlpack::PyHold;
pub use dlpack::{copy_region, CpuTensor, SharedBuf, Tensor};

use std::ops::Range;

/// True when two byte spans `[a0, a1)` and `[b0, b1)` share a byte.
pub fn overlaps(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < a.1 && b.0 < b.1 && a.0 < b.1 && b.0 < a.1
}

/// Index pairs `(i, j)` of spans that overlap.
pub fn first_overlap(spans: &[(usize, usize)]) -> Option<(usize, usize)> {
    for i in 0..spans.len() {
        for j in i + 1..spans.len() {
            if overlaps(spans[i], spans[j]) {
                return Some((i, j));
            }
        }
    }
    None
}

/// Borrows `read` immutably and `write` mutably from one buffer; the ranges
/// must not overlap (callers use disjoint chunks).
pub fn split_rw(buf: &mut [u8], read: Range<usize>, write: Range<usize>) -> (&[u8], &mut [u8]) {
    assert!(read.end <= write.start || write.end <= read.start, "split_rw: {read:?} overlaps {write:?}");
    if read.start < write.start {
        let (lo, hi) = buf.split_at_mut(write.start);
        (&lo[read], &mut hi[..write.end - write.start])
    } else {
        let (lo, hi) = buf.split_at_mut(read.start);
        (&hi[..read.end - read.start], &mut lo[write])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_detection() {
        assert!(overlaps((0, 10), (9, 12)));
        assert!(!overlaps((0, 10), (10, 12)));
        assert!(!overlaps((5, 5), (0, 10))); // empty spans never overlap
        assert_eq!(first_overlap(&[(0, 4), (4, 8), (6, 9)]), Some((1, 2)));
    }

    #[test]
    fn split_rw_both_orders() {
        let mut b: Vec<u8> = (0..10).collect();
        let (r, w) = split_rw(&mut b, 0..3, 5..8);
        assert_eq!(r, &[0, 1, 2]);
        w.copy_from_slice(&[9, 9, 9]);
        let (r, w) = split_rw(&mut b, 5..8, 0..2);
        assert_eq!(r, &[9, 9, 9]);
        w.copy_from_slice(&[7, 7]);
        assert_eq!(b, vec![7, 7, 2, 3, 4, 9, 9, 9, 8, 9]);
    }
}
