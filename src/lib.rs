//! rustccl: the engine of a `torch.distributed` backend.
//!
//! Layers, bottom up (each only uses the ones above it in this list):
//!
//! - [`error`], [`types`], [`config`]: vocabulary shared by everything.
//! - [`tensor`]: borrowed views of caller memory (DLPack); the only place
//!   DLPack pointers are dereferenced.
//! - [`transport`]: moves bytes between ranks. A [`transport::Transport`]
//!   drives sets of sends and receives ([`transport::Xfer`]) to completion;
//!   `tcp` is the real one, `loopback` an in-process one for tests.
//! - [`tls`]: TLS sessions for TCP links (`RUSTCCL_TLS`), and the
//!   non-blocking connection, plain or encrypted, that links read and write.
//! - [`bootstrap`]: rendezvous through a key-value [`bootstrap::Store`],
//!   hands back connected links.
//! - [`collectives`] holds the algorithms (ring, recursive doubling, trees, pairwise)
//!   written against `Transport`; `plan` holds the chunk arithmetic and
//!   `reduce` the element-wise kernels.
//! - [`work`]: the async handle returned for every submitted operation.
//! - [`cuda`]: the CUDA driver (streams, events, contexts), loaded at run
//!   time; `comm::nccl` runs CUDA collectives through NCCL on top of it.
//! - [`comm`]: the `Communicator` that owns a group's transport, worker
//!   thread, point-to-point engine and sequence numbers.
//! - `capi` (extern "C", used by the C++ c10d shim) and `py` (PyO3 module),
//!   both only with the `python` feature.
// These docs are for the engine's developers: they link private items
// (helpers, constants) on purpose.
#![allow(rustdoc::private_intra_doc_links)]

pub mod bootstrap;
pub mod collectives;
pub mod comm;
pub mod config;
pub mod cuda;
pub mod error;
pub mod hostprof;
pub mod tensor;
pub mod tls;
pub mod transport;
pub mod types;
pub mod work;

#[cfg(feature = "python")]
mod capi;
#[cfg(feature = "python")]
mod py;

pub use comm::Communicator;
pub use error::{Error, Result};
pub use types::{DType, Device, OpKind, Rank, ReduceOp};
pub use work::Work;
