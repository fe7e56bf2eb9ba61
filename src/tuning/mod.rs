//! Policy: which algorithm and which sizes, threads and thresholds the
//! engine uses where the settings leave them to rustccl. Pure functions of
//! the settings, the group (ranks, threads) and the host ([`HostFacts`]),
//! unit-tested without shared memory; the transport takes their results
//! and keeps only what it can do. Each rule's evidence:
//! `docs/decisions/0004`.
#![forbid(unsafe_code)]

pub mod reads;
pub mod shm;

/// What the rules read of the host this process runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostFacts {
    /// The cores this process may run on.
    pub cores: usize,
    /// One core's L2 cache (bytes).
    pub l2_bytes: usize,
}

impl HostFacts {
    pub fn detect() -> HostFacts {
        HostFacts { cores: std::thread::available_parallelism().map_or(1, |n| n.get()), l2_bytes: l2_bytes() }
    }
}

/// L2 cache of one core (sysfs), 1 MiB when unknown.
fn l2_bytes() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/cpu0/cache/index2/size").unwrap_or_default();
    parse_cache_size(text.trim()).filter(|&v| v >= 64 << 10).unwrap_or(1 << 20)
}

/// sysfs's cache size ("2048K", "1M", "512").
fn parse_cache_size(t: &str) -> Option<usize> {
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        _ => (t, 1),
    };
    num.parse::<usize>().ok().map(|v| v * mult)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(super::parse_cache_size("2048K"), Some(2 << 20));
        assert_eq!(super::parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(super::parse_cache_size("65536"), Some(64 << 10));
        assert_eq!(super::parse_cache_size(""), None);
    }
}
