//! Errors of the engine. Every variant carries what a user needs to act on
//! it: the collective, its sequence number, the peer rank and address.
//! They become Python / c10 exceptions only at the boundaries (`capi`, `py`),
//! through [`Error::code`].
#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use crate::types::Rank;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where an error happened: the collective and its per-communicator
/// sequence number. Kept small so it can be copied into every error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpSite {
    pub op: &'static str,
    pub seq: u64,
    pub group: Arc<str>,
}

impl std::fmt::Display for OpSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (seq {}, group '{}')", self.op, self.seq, self.group)
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The caller's input is wrong (sizes, ranks, layout). Nothing was sent;
    /// the communicator is unaffected.
    #[error("rustccl {op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },

    /// The input is well formed but this backend does not do it
    /// (a dtype / reduce-op pair, a device). Nothing was sent.
    #[error("rustccl {op}: {reason}")]
    Unsupported { op: &'static str, reason: String },

    /// A collective did not finish within the group's timeout.
    #[error("rustccl {site}: Timed out after {:.1} s waiting for rank(s) {waiting:?} (this process is rank {rank})", elapsed.as_secs_f64())]
    Timeout { site: OpSite, rank: Rank, waiting: Vec<Rank>, elapsed: Duration },

    /// The connection to a peer broke (closed, reset) during an operation.
    #[error("rustccl {site}: rank {rank} (this process) <-> rank {peer} {addr}: {detail}")]
    PeerLost { site: OpSite, rank: Rank, peer: Rank, addr: String, detail: String },

    /// A peer sent something the protocol did not expect: most often the
    /// ranks called different collectives or passed different sizes.
    #[error("rustccl {site}: rank {rank} (this process) <-> rank {peer} {addr}: {detail}")]
    Protocol { site: OpSite, rank: Rank, peer: Rank, addr: String, detail: String },

    /// The ranks disagree about this collective (dtype, size, reduce op,
    /// root), found before any rank used a peer's bytes: every rank of the
    /// call fails it, every frame of it is skipped, and the group goes on
    /// with the next call.
    #[error("rustccl {site}: rank {rank} (this process) <-> rank {peer} {addr}: {detail}; every rank of this call fails it and the group stays usable")]
    Mismatch { site: OpSite, rank: Rank, peer: Rank, addr: String, detail: String },

    /// A CUDA or NCCL call failed.
    #[error("rustccl {site}: rank {rank} (this process), cuda:{device}: {detail}")]
    Device { site: OpSite, rank: Rank, device: i32, detail: String },

    /// An earlier failure left the communicator unusable; later operations
    /// fail fast with its cause.
    #[error("rustccl {op}: the communicator is unusable after an earlier error: {cause}")]
    Poisoned { op: &'static str, cause: Box<Error> },

    /// Rendezvous or connection set-up failed.
    #[error("rustccl rendezvous (rank {rank}): {detail}")]
    Bootstrap { rank: Rank, detail: String },

    /// `wait(timeout)` gave up; the operation itself is still running.
    #[error("rustccl {op} (seq {seq}): Timed out after {:.3} s in wait(); the operation is still in flight", waited.as_secs_f64())]
    WaitTimeout { op: &'static str, seq: u64, waited: Duration },

    /// The communicator was shut down or aborted.
    #[error("rustccl {op}: the process group was {how}")]
    Closed { op: &'static str, how: &'static str },

    /// A monitored barrier found ranks that did not arrive in time (or, on
    /// the other ranks, rank 0 reported so).
    #[error("rustccl monitored_barrier (group '{group}'): {detail}")]
    Monitored { group: String, detail: String },

    /// Making a new group from this one (split, shrink) failed: the ranks
    /// disagree about it, or a peer was lost while they agreed.
    #[error("rustccl {op} (group '{group}', rank {rank} (this process)): {detail}")]
    Regroup { op: &'static str, group: String, rank: Rank, detail: String },

    /// A bug in rustccl; the message says where.
    #[error("rustccl internal error: {0}")]
    Internal(String),
}

/// Status codes of the C ABI; the shim maps them to c10 exception types.
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok = 0,
    /// -> RuntimeError (c10::Error)
    InvalidArgument = 1,
    /// -> RuntimeError (c10::Error)
    Unsupported = 2,
    /// -> torch.distributed.DistBackendError
    Timeout = 3,
    /// -> torch.distributed.DistNetworkError
    Network = 4,
    /// -> torch.distributed.DistBackendError
    Backend = 5,
    /// wait(timeout) expired; the work is still pending -> DistBackendError
    WaitTimeout = 6,
    /// -> RuntimeError
    Internal = 7,
}

impl Error {
    pub fn code(&self) -> Code {
        match self {
            Error::InvalidArgument { .. } => Code::InvalidArgument,
            Error::Unsupported { .. } => Code::Unsupported,
            Error::Timeout { .. } | Error::Monitored { .. } => Code::Timeout,
            Error::Regroup { .. } => Code::Backend,
            Error::PeerLost { .. } | Error::Bootstrap { .. } => Code::Network,
            Error::Protocol { .. } | Error::Mismatch { .. } | Error::Closed { .. } | Error::Device { .. } => Code::Backend,
            Error::Poisoned { cause, .. } => match cause.code() {
                Code::Timeout => Code::Timeout,
                Code::Network => Code::Network,
                _ => Code::Backend,
            },
            Error::WaitTimeout { .. } => Code::WaitTimeout,
            Error::Internal(_) => Code::Internal,
        }
    }

    pub fn invalid(op: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { op, reason: reason.into() }
    }

    pub fn unsupported(op: &'static str, reason: impl Into<String>) -> Self {
        Error::Unsupported { op, reason: reason.into() }
    }

    /// True for errors that leave the communicator's byte streams in an
    /// unknown state, so that later operations must not use them.
    pub fn poisons(&self) -> bool {
        matches!(self, Error::Timeout { .. } | Error::PeerLost { .. } | Error::Protocol { .. } | Error::Device { .. } | Error::Internal(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_rustccl_op_and_peer() {
        let site = OpSite { op: "all_reduce", seq: 7, group: "0".into() };
        let e = Error::PeerLost { site, rank: 1, peer: 3, addr: "10.0.0.2:4444".into(), detail: "connection reset".into() };
        let s = e.to_string();
        assert!(s.contains("rustccl all_reduce (seq 7"), "{s}");
        assert!(s.contains("rank 1 (this process) <-> rank 3 10.0.0.2:4444"), "{s}");
        assert_eq!(e.code(), Code::Network);
        assert!(e.poisons());
        assert!(!Error::invalid("broadcast", "root 5 out of range").poisons());
    }
}
