//! Threads that split one rank's memory work (copies into and out of
//! shared memory, reductions) in the direct algorithms, so that a rank on a
//! many-core host is not limited to one core's memory bandwidth.
#![allow(unsafe_code)]

use std::io;
use std::ops::Range;

use rayon::prelude::*;

/// Below this many bytes per thread the pool is not woken: waking sleeping
/// threads costs tens of microseconds, more than one core needs for the
/// copy (with 8 ranks x 8 threads on a 64-core host, waking the pools for
/// 8 KiB pieces made a 512 KiB all-reduce 8x slower than a 128 KiB one).
pub const MIN_PIECE: usize = 64 << 10;

pub struct Workers {
    pool: Option<rayon::ThreadPool>,
    threads: usize,
}

impl Workers {
    /// `threads` <= 1: everything runs on the caller's thread.
    pub fn new(threads: usize, rank: usize) -> io::Result<Workers> {
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(move |i| format!("rustccl-shm-r{rank}-{i}"))
                    .build()
                    .map_err(io::Error::other)?,
            )
        } else {
            None
        };
        Ok(Workers { pool, threads: threads.max(1) })
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Piece length for `len` bytes: one per thread, whole cache lines,
    /// at least `MIN_PIECE` (so small work stays on the caller's thread).
    fn piece(&self, len: usize) -> usize {
        let used = self.threads.min(len / MIN_PIECE).max(1);
        len.div_ceil(used).div_ceil(64).max(1) * 64
    }

    /// Calls `f(range)` for consecutive pieces of `0..len`, in parallel.
    pub fn for_pieces<E: Send>(&self, len: usize, f: impl Fn(Range<usize>) -> Result<(), E> + Sync) -> Result<(), E> {
        let piece = self.piece(len);
        let ranges = || (0..len).step_by(piece.max(1)).map(move |s| s..(s + piece).min(len));
        match &self.pool {
            Some(p) if len > piece => p.install(|| ranges().collect::<Vec<_>>().into_par_iter().try_for_each(&f)),
            _ => ranges().try_for_each(&f),
        }
    }

    /// Calls `f(offset, piece)` for disjoint mutable pieces of `buf`, in
    /// parallel.
    pub fn for_pieces_mut<E: Send>(&self, buf: &mut [u8], f: impl Fn(usize, &mut [u8]) -> Result<(), E> + Sync) -> Result<(), E> {
        let piece = self.piece(buf.len());
        match &self.pool {
            Some(p) if buf.len() > piece => p.install(|| buf.par_chunks_mut(piece).enumerate().try_for_each(|(i, c)| f(i * piece, c))),
            _ => buf.chunks_mut(piece).enumerate().try_for_each(|(i, c)| f(i * piece, c)),
        }
    }
}
