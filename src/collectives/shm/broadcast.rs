//! Broadcast among the ranks of one host through their shared segments,
//! pipelined: the buffer goes in steps, each at most half the root's input
//! area. In step k the root copies piece k into half k % 2 of its area
//! while every other rank copies piece k - 1 out of the other half
//! straight into its buffer; then all publish and wait. One copy in, one
//! copy out per byte, the two side by side: a buffer of s steps takes
//! about (s + 1) / s of one copy where copying in and then out took two.
//! Phases as in `transport::shm::window`.
#![forbid(unsafe_code)]

use crate::collectives::plan::segments;
use crate::error::{Error, Result};
use crate::transport::shm::{Area, Desc, PhaseWait, Window};
use crate::types::{DType, ReduceOp};

/// Steps a buffer is cut into, when each still gives every worker thread
/// a piece and two fit the root's area: the receivers copy one step out
/// while the root copies the next in (`docs/decisions/0004`).
const STEPS: usize = 4;

/// Bytes of one step for a buffer of `len` bytes: at least a piece for
/// every thread. A buffer of at most two pieces, which that floor would
/// leave a single step (the root's copy in, then the receivers' copy out,
/// nothing side by side), goes in steps of one piece each; larger buffers
/// keep pieces for every thread (`docs/decisions/0004`).
fn step_bytes(win: &Window, len: usize) -> usize {
    let wk = win.workers();
    step_len(len, wk.threads(), wk.min_piece(), (win.inputs_capacity() / 2).max(1))
}

/// [`step_bytes`] for `threads` threads splitting work into pieces of at
/// least `min_piece`, steps of at most `half`.
fn step_len(len: usize, threads: usize, min_piece: usize, half: usize) -> usize {
    let floor = if len <= 2 * min_piece { min_piece } else { threads * min_piece };
    len.div_ceil(STEPS).div_ceil(64).saturating_mul(64).max(floor).min(half)
}

/// `root`: local index of the root.
pub fn broadcast(win: &Window, w: &mut dyn PhaseWait, buf: &mut [u8], root: usize) -> Result<()> {
    let me = win.me();
    let desc = Desc { name: "broadcast", dtype: DType::U8, op: ReduceOp::Sum, len: buf.len(), root: Some(root) };
    let step = step_bytes(win, buf.len());
    let half = |k: usize| (k % 2) * step;
    let segs: Vec<_> = segments(0..buf.len(), step).collect();
    let wk = win.workers();
    let p = win.phase();
    w.wait_phase(p)?; // every rank finished reading the root's area of the last operation
    win.announce(w, &desc);
    for k in 0..=segs.len() {
        if let (true, Some(g)) = (me == root, segs.get(k)) {
            // The others read this half last in step k - 1 (piece k - 2)
            // and published that before our wait at its end.
            let src = &buf[g.clone()];
            wk.for_pieces(src.len(), |r| {
                win.put(Area::Inputs, half(k) + r.start, &src[r]);
                Ok::<(), Error>(())
            })?;
        }
        if let (false, Some(g)) = (me == root, k.checked_sub(1).and_then(|j| segs.get(j))) {
            // The root wrote piece k - 1 in step k - 1, before its publish
            // we waited for; it rewrites that half only after our next one.
            wk.for_pieces_mut(&mut buf[g.clone()], |off, piece| {
                win.get(root, Area::Inputs, half(k - 1) + off, piece);
                Ok::<(), Error>(())
            })?;
        }
        win.publish(p + 1 + k as u64);
        // The last step's reads end the operation: the next one's first
        // wait covers them.
        if k < segs.len() || k == 0 {
            w.wait_phase(p + 1 + k as u64)?;
        }
        if k == 0 {
            win.verify(w, &desc)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::step_len;

    const K: usize = 1 << 10;

    #[test]
    fn a_buffer_of_two_pieces_or_less_goes_in_one_piece_steps() {
        // 4 threads, 256 KiB pieces: 512 KiB in two one-piece steps.
        assert_eq!(step_len(512 * K, 4, 256 * K, 4096 * K), 256 * K);
        assert_eq!(step_len(512 * K, 2, 256 * K, 4096 * K), 256 * K);
        // Above it, a piece for every thread a step, 4 steps from 4 MiB.
        assert_eq!(step_len(1024 * K, 4, 256 * K, 4096 * K), 1024 * K);
        assert_eq!(step_len(2048 * K, 4, 256 * K, 4096 * K), 1024 * K);
        assert_eq!(step_len(16384 * K, 4, 256 * K, 4096 * K), 4096 * K);
        // 2 threads: 1 MiB in two steps of two pieces.
        assert_eq!(step_len(1024 * K, 2, 256 * K, 4096 * K), 512 * K);
        // One thread: steps of at least a piece, at most half the area.
        assert_eq!(step_len(300 * K, 1, 256 * K, 4096 * K), 256 * K);
        assert_eq!(step_len(512 * K, 4, 256 * K, 128 * K), 128 * K);
    }
}
