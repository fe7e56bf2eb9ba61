//! Algorithms over links between ranks (TCP, or the shared-memory rings
//! used as links): each moves bytes with sends and receives only.
#![forbid(unsafe_code)]

pub mod chain;
pub mod direct;
pub mod recursive_doubling;
pub mod ring;
pub mod tree;
