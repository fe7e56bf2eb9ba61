//! rustccl: the engine of a `torch.distributed` backend.
//!
//! Layers, bottom up; a module uses only its own layer and those below
//! (`tests/python/test_layout.py` checks it):
//!
//! 1. [`error`], [`types`]: vocabulary shared by everything.
//! 2. [`config`] (the `RUSTCCL_*` settings), [`profile`] (where the CPU
//!    time of a call goes).
//! 3. [`tuning`]: the rules that choose sizes, threads and thresholds
//!    where the settings leave them to rustccl (pure functions of the
//!    settings, the group and the host).
//! 4. [`tensor`]: borrowed views of caller memory (DLPack), the only place
//!    DLPack pointers are dereferenced; [`cuda`]: the CUDA driver, loaded
//!    at run time; [`work`]: the async handle of every operation;
//!    [`bootstrap`]: rendezvous through a key-value [`bootstrap::Store`],
//!    handing back connected links; [`tls`]: TLS sessions for TCP links
//!    (`RUSTCCL_TLS`) and the non-blocking socket, plain or encrypted, that
//!    links read and write.
//! 5. [`transport`]: moves bytes between ranks. [`transport::mesh`] drives
//!    sets of sends and receives ([`transport::Xfer`]) over shared memory
//!    within a host and TCP between hosts; `loopback` is an in-process one
//!    for tests.
//! 6. [`collectives`]: the algorithms written against
//!    [`transport::Transport`]: `net` over links (ring, recursive doubling,
//!    trees, chain, direct), `shm` among the ranks of one host, `compress`
//!    the codecs between hosts; `plan` holds the chunk arithmetic and
//!    `kernels` the element-wise reductions.
//! 7. [`comm`]: the `Communicator` that owns a group's transport, CPU
//!    engine (`comm::cpu`), point-to-point engine and sequence numbers;
//!    `comm::nccl` runs CUDA collectives through NCCL and rustccl's
//!    kernels.
//! 8. `capi` (extern "C", used by the C++ c10d shim) and 9. `py` (PyO3
//!    module), both only with the `python` feature.
// These docs are for the engine's developers: they link private items
// (helpers, constants) on purpose.
#![allow(rustdoc::private_intra_doc_links)]

pub mod bootstrap;
pub mod collectives;
pub mod comm;
pub mod config;
pub mod cuda;
pub mod error;
pub mod profile;
pub mod tensor;
pub mod tls;
pub mod transport;
pub mod tuning;
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
