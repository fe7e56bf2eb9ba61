//! The cargo integration tests, one binary (one link): ranks as threads over
//! the real transports, each module one part of the engine.

mod caller_runs;
mod collectives;
#[allow(dead_code)] // helpers some modules use
mod common;
mod compression;
mod p2p_and_faults;
mod p2p_rendezvous;
mod p2p_shm;
mod regroup;
mod shm_attach;
mod shm_attach_push;
mod shm_blocks;
mod shm_direct;
mod shm_host_rule;
mod shm_one_round;
mod tls;
