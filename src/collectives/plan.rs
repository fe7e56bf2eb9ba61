//! Pure chunk arithmetic shared by the algorithms: how a buffer is split
//! into one chunk per rank, and a chunk into segments in flight. Everything
//! here is in elements unless a name says bytes.
#![forbid(unsafe_code)]

use std::ops::Range;

/// Splits `numel` elements into `n` contiguous chunks; the first
/// `numel % n` chunks hold one element more. Chunks may be empty.
pub fn even_chunks(numel: usize, n: usize) -> Vec<Range<usize>> {
    let base = numel / n;
    let extra = numel % n;
    let mut out = Vec::with_capacity(n);
    let mut start = 0;
    for i in 0..n {
        let len = base + usize::from(i < extra);
        out.push(start..start + len);
        start += len;
    }
    out
}

/// Chunks of the given lengths laid end to end.
pub fn chunks_of(lens: &[usize]) -> Vec<Range<usize>> {
    let mut start = 0;
    lens.iter()
        .map(|&l| {
            let r = start..start + l;
            start += l;
            r
        })
        .collect()
}

/// The segments of `chunk`: consecutive pieces of at most `seg` elements.
/// Both ends of a link derive the same segments from the same chunk.
pub fn segments(chunk: Range<usize>, seg: usize) -> impl Iterator<Item = Range<usize>> {
    let seg = seg.max(1);
    let start = chunk.start;
    let end = chunk.end;
    (start..end).step_by(seg).map(move |s| s..(s + seg).min(end))
}

/// Number of segments of a chunk of `len` elements.
pub fn segment_count(len: usize, seg: usize) -> usize {
    len.div_ceil(seg.max(1))
}

/// The element range `r` as a byte range for elements of `elem` bytes.
pub fn bytes(r: &Range<usize>, elem: usize) -> Range<usize> {
    r.start * elem..r.end * elem
}

/// Segment size in elements for a byte budget (at least one element).
pub fn seg_elems(segment_bytes: usize, elem: usize) -> usize {
    (segment_bytes / elem.max(1)).max(1)
}

/// Ring neighbours of `rank` in a ring of `n`: (left, right).
pub fn ring_neighbours(rank: usize, n: usize) -> (usize, usize) {
    ((rank + n - 1) % n, (rank + 1) % n)
}

/// `(a - b) mod n` without underflow.
pub fn sub_mod(a: usize, b: usize, n: usize) -> usize {
    (a + n - (b % n)) % n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_everything_once() {
        for numel in [0usize, 1, 2, 7, 100, 1001] {
            for n in 1..=6 {
                let c = even_chunks(numel, n);
                assert_eq!(c.len(), n);
                assert_eq!(c[0].start, 0);
                assert_eq!(c[n - 1].end, numel);
                for w in c.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
                }
            }
        }
    }

    #[test]
    fn segments_tile_a_chunk() {
        let s: Vec<_> = segments(3..13, 4).collect();
        assert_eq!(s, vec![3..7, 7..11, 11..13]);
        assert_eq!(segment_count(10, 4), 3);
        assert_eq!(segments(5..5, 4).count(), 0);
        assert_eq!(segment_count(0, 4), 0);
    }

    #[test]
    fn ring_math() {
        assert_eq!(ring_neighbours(0, 4), (3, 1));
        assert_eq!(ring_neighbours(3, 4), (2, 0));
        assert_eq!(sub_mod(1, 3, 4), 2);
        assert_eq!(chunks_of(&[2, 0, 3]), vec![0..2, 2..2, 2..5]);
    }
}
