//! Algorithms among the ranks of one host over their shared memory
//! (`transport::shm::Window`): the copies through the shared slots, and
//! in [`attach`] the single-copy ones that read the peers' tensors.
#![forbid(unsafe_code)]

pub mod all_gather;
pub mod attach;
pub mod blocks;
pub mod broadcast;
pub mod one_round;
pub mod pipelined;
pub mod reduce_scatter;
