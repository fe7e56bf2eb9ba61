//! NCCL unique ids: how ranks agree on one (over rustccl's CPU links) and
//! their byte form.
#![forbid(unsafe_code)]

use cudarc::nccl::sys::ncclUniqueId;

use crate::error::Result;
use crate::types::Rank;

/// How a new NCCL communicator gets its unique id across ranks.
pub trait IdExchange {
    /// Rank 0's id to every rank of the group (a collective over the CPU links).
    fn broadcast(&self, id: &mut [u8; 128]) -> Result<()>;
    /// The lower rank's id to `peer` (point-to-point over the CPU links).
    fn pair(&self, peer: Rank, id: &mut [u8; 128], i_send: bool) -> Result<()>;
    /// Every rank's `mine` (the same length on every rank), concatenated in
    /// rank order (a collective over the CPU links).
    fn all_gather(&self, mine: &[u8]) -> Result<Vec<u8>>;
    /// True when every rank of the group runs on this host.
    fn single_host(&self) -> bool;
}

pub(super) fn id_from(bytes: &[u8; 128]) -> ncclUniqueId {
    let mut id = ncclUniqueId { internal: [0; 128] };
    for (d, s) in id.internal.iter_mut().zip(bytes) {
        *d = *s as _;
    }
    id
}

pub(super) fn id_bytes(id: &ncclUniqueId) -> [u8; 128] {
    let mut b = [0u8; 128];
    for (d, s) in b.iter_mut().zip(id.internal.iter()) {
        *d = *s as u8;
    }
    b
}
