//! A rank's staging area: the end of its segment, where a point-to-point
//! send of a few MiB to a rank of this host is copied by the sender's
//! worker threads and copied out by the receiver's (`comm::p2p`'s staged
//! sends), both in user space. On the 16-core host, 8 threads read 2-8 MiB
//! out of another process through the kernel (`remote`, the rendezvous
//! path) in ~250 us whatever the size, where the same threads copied 2 MiB
//! in ~50 us and 4 MiB in ~70 us
//! (`benchmarks/results/2026-11-26-h100host-p2p-staged/`).
//!
//! Who may touch it (the rule `comm::p2p` keeps): its owner writes it only
//! while no staged send of its own is outstanding, i.e. after the receiver
//! of the last one acked it (or was lost); a receiver reads a peer's area
//! only between that peer's staged message and its own ack. The message
//! and the ack travel through the point-to-point rings, whose release and
//! acquire order the copies on either side.
#![allow(unsafe_code)]

use std::convert::Infallible;

use super::ShmLocal;

impl ShmLocal {
    /// Bytes a staged send can hold (0: no staging area).
    pub fn stage_capacity(&self) -> usize {
        self.mine().layout.stage
    }

    /// Copies `src` into this rank's staging area on the worker threads.
    /// None when it does not fit.
    pub fn stage_in(&self, src: &[u8]) -> Option<()> {
        let seg = self.mine();
        if src.len() > seg.layout.stage {
            return None;
        }
        let off = seg.layout.stage_off;
        let Ok(()) = self.workers.for_pieces(src.len(), |r| {
            // SAFETY: in bounds (checked above, and `write` asserts);
            // nobody reads our staging area until the message that this
            // copy precedes is in the ring, and we write it only when no
            // staged send of ours is outstanding (module rule).
            unsafe { seg.write(off + r.start, &src[r]) };
            Ok::<(), Infallible>(())
        });
        Some(())
    }

    /// Copies `dst.len()` bytes out of local rank `peer`'s staging area on
    /// the worker threads. None when the area is not that large (a peer
    /// that claims more than it could have staged).
    pub fn stage_out(&self, peer: usize, dst: &mut [u8]) -> Option<()> {
        let seg = self.segs.get(peer)?;
        if dst.len() > seg.layout.stage {
            return None;
        }
        let off = seg.layout.stage_off;
        let Ok(()) = self.workers.for_pieces_mut(dst, |o, piece| {
            // SAFETY: in bounds (checked above, and `read` asserts); the
            // peer staged these bytes before sending the message we
            // matched and leaves them alone until our ack (module rule).
            unsafe { seg.read(off + o, piece) };
            Ok::<(), Infallible>(())
        });
        Some(())
    }
}
