//! A rank's staging area: the end of its segment, where a point-to-point
//! send of a few MiB to a rank of this host is copied by the sender's
//! worker threads and copied out by the receiver's (`comm::p2p`'s staged
//! sends), both in user space: reading a few MiB out of another process
//! through the kernel (`remote`, the rendezvous path) costs a fixed time
//! well above what the same threads need to copy it twice in user space
//! (`docs/decisions/0004`).
//!
//! The two copies overlap: the sender sends its message first and then
//! copies, chunk by chunk (`STAGE_CHUNK`), storing the send's sequence
//! number in the chunk's ready flag as each lands; a receiver that already
//! matched the message copies each chunk out once its flag says so. The
//! numbers only grow, so flags left by earlier sends never read as ready.
//!
//! Who may touch it (the rule `comm::p2p` keeps): its owner writes it only
//! while no staged send of its own is outstanding, i.e. after the receiver
//! of the last one acked it (or was lost); a receiver reads a peer's area
//! only between that peer's staged message and its own ack, and each chunk
//! only after its flag holds the message's number. The ack travels through
//! the point-to-point ring, whose release and acquire order the receiver's
//! reads before the sender's next writes.
#![allow(unsafe_code)]

use std::convert::Infallible;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::segment::STAGE_CHUNK;
use super::ShmLocal;

/// Says whether a staged chunk a receiver waits for may still come: Err
/// (the sender died, the receive timed out) ends the wait with that text.
pub type StillComing<'a> = &'a (dyn Fn() -> Result<(), String> + Sync);

/// Looks at a flag before a waiting thread starts yielding its core.
const SPINS: u32 = 2000;
/// How often a waiting thread asks whether the chunk may still come.
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// The chunks of `r` (whose start is a multiple of `STAGE_CHUNK`).
fn chunks(r: Range<usize>) -> impl Iterator<Item = Range<usize>> {
    let end = r.end;
    r.step_by(STAGE_CHUNK).map(move |s| s..(s + STAGE_CHUNK).min(end))
}

/// Waits, spinning then yielding, until `flag` holds `seq`, asking
/// `coming` every `every` whether it may still come. Staged chunks ask
/// every `CHECK_EVERY`; a streamed block's chunks
/// (`Window::wait_block_flag`) give up after their patience.
pub(super) fn wait_ready(flag: &AtomicU64, seq: u64, every: Duration, coming: StillComing) -> Result<(), String> {
    let mut looks = 0u32;
    let mut checked = Instant::now();
    while flag.load(Ordering::Acquire) != seq {
        looks = looks.saturating_add(1);
        if looks < SPINS {
            std::hint::spin_loop();
            continue;
        }
        std::thread::yield_now();
        if checked.elapsed() >= every {
            coming()?;
            checked = Instant::now();
        }
    }
    Ok(())
}

impl ShmLocal {
    /// Bytes a staged send can hold (0: no staging area).
    pub fn stage_capacity(&self) -> usize {
        self.mine().layout.stage
    }

    /// Copies `src` into this rank's staging area on the worker threads,
    /// marking each chunk ready with `seq` (this send's number, larger than
    /// any earlier staged send's) as it lands. None when it does not fit.
    pub fn stage_in(&self, src: &[u8], seq: u64) -> Option<()> {
        let seg = self.mine();
        if src.len() > seg.layout.stage {
            return None;
        }
        let off = seg.layout.stage_data_off;
        let ranges = self.workers.ranges_aligned(src.len(), STAGE_CHUNK);
        let Ok(()) = self.workers.for_each(ranges, src.len(), |r| {
            for c in chunks(r) {
                // SAFETY: in bounds (checked above, and `write` asserts);
                // a receiver reads this chunk only after the flag below
                // holds `seq`, and we write the area only when no staged
                // send of ours is outstanding (module rule).
                unsafe { seg.write(off + c.start, &src[c.clone()]) };
                seg.stage_flag(c.start / STAGE_CHUNK).store(seq, Ordering::Release);
            }
            Ok::<(), Infallible>(())
        });
        Some(())
    }

    /// Copies `dst.len()` bytes of staged send `seq` out of local rank
    /// `peer`'s staging area on the worker threads, each chunk once the
    /// sender marked it ready; `coming` ends a wait for a chunk that will
    /// not come. Err also when the area is not that large (a peer that
    /// claims more than it could have staged).
    pub fn stage_out(&self, peer: usize, dst: &mut [u8], seq: u64, coming: StillComing) -> Result<(), String> {
        let seg = self.segs.get(peer).ok_or_else(|| format!("no local rank {peer}"))?;
        let len = dst.len();
        if len > seg.layout.stage {
            return Err(format!("its staging area holds {} bytes, fewer than {len}", seg.layout.stage));
        }
        let off = seg.layout.stage_data_off;
        let pieces: Vec<_> = self.workers.pieces_aligned_mut(dst, STAGE_CHUNK).collect();
        self.workers.for_each(pieces, len, |(at, piece)| {
            for c in chunks(at..at + piece.len()) {
                wait_ready(seg.stage_flag(c.start / STAGE_CHUNK), seq, CHECK_EVERY, coming)?;
                // SAFETY: in bounds (checked above, and `read` asserts);
                // the flag says the peer wrote this chunk for the message
                // we matched, and it leaves the area alone until our ack
                // (module rule).
                unsafe { seg.read(off + c.start, &mut piece[c.start - at..c.end - at]) };
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_when_the_chunk_lands_or_cannot_come() {
        let flag = AtomicU64::new(3);
        // an earlier send's number: not ready; the wait asks and stops
        assert_eq!(wait_ready(&flag, 4, CHECK_EVERY, &|| Err("sender gone".to_string())), Err("sender gone".to_string()));
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(50));
                flag.store(4, Ordering::Release);
            });
            let asked = std::sync::atomic::AtomicUsize::new(0);
            wait_ready(&flag, 4, CHECK_EVERY, &|| {
                asked.fetch_add(1, Ordering::Relaxed);
                Ok(())
            })
            .unwrap();
            assert!(asked.load(Ordering::Relaxed) >= 1, "a long wait asks whether the chunk may still come");
        });
        let ranges: Vec<_> = chunks(2 * STAGE_CHUNK..4 * STAGE_CHUNK + 5).collect();
        assert_eq!(ranges, vec![2 * STAGE_CHUNK..3 * STAGE_CHUNK, 3 * STAGE_CHUNK..4 * STAGE_CHUNK, 4 * STAGE_CHUNK..4 * STAGE_CHUNK + 5]);
    }
}
