//! Shared tensors: a rank's CPU tensors allocated in memory that the other
//! ranks of its host map too, so a peer reads them with a plain copy in
//! user space instead of through the kernel (`remote.rs`, whose reads of a
//! few MiB do not get faster with more threads: every call pins the pages
//! it reads).
//!
//! Owner side ([`Arena`]): one `memfd` per process, sized once to the
//! host's memory (its pages cost nothing until touched) and mapped shared;
//! torch's CPU allocator (the shim's `SharedCpuAllocator`, installed by
//! `RUSTCCL_SHM_TENSORS=1`) takes tensors of `min_bytes` and more from it,
//! whole pages each, and the rest from torch's own allocator. Freed ranges
//! keep their pages up to `cache_bytes` (a peer that mapped them does not
//! fault again); beyond that they are given back (`PUNCH_HOLE`).
//!
//! Reader side ([`PeerArena`]): a peer's arena, mapped read-only through
//! `/proc/<pid>/fd/<fd>` (the same permission as cross-memory attach) and
//! checked against a random value the owner keeps in its first page.
//!
//! After `fork` the child must not share its parent's tensors: it maps the
//! arena privately (copy on write) and allocates from torch's allocator
//! from then on. Its view of pages the parent changes later is the file's
//! (a child only reads what it inherited, as DataLoader workers do).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use range_alloc::RangeAllocator;

/// Allocation granule: tensors never share a page, so a freed one's pages
/// can be given back.
const PAGE: u64 = 4096;

/// What an owner publishes for its peers (segment header words 176-216).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaInfo {
    pub base: u64,
    pub len: u64,
    pub fd: u64,
    pub canary: u64,
}

/// Bytes handed out and kept, for `rustccl.stats()`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArenaStats {
    pub in_use: u64,
    pub peak: u64,
    pub cached: u64,
    /// Allocations of `min_bytes` or more the arena could not hold.
    pub full: u64,
}

struct State {
    ranges: RangeAllocator<u64>,
    /// Offset -> length of every live allocation.
    live: HashMap<u64, u64>,
    stats: ArenaStats,
}

/// This process's shared tensor arena.
pub struct Arena {
    file: File,
    base: *mut u8,
    len: u64,
    canary: u64,
    pub min_bytes: usize,
    cache_bytes: u64,
    state: Mutex<State>,
}

// SAFETY: `base` points at a mapping that lives as long as the process
// (the arena is never dropped, see `Arena::enable`); every mutable piece
// of state is behind the mutex.
unsafe impl Send for Arena {}
unsafe impl Sync for Arena {}

static ARENA: OnceLock<Arena> = OnceLock::new();
/// Set in a child after `fork`: it allocates nothing more from the arena
/// and gives nothing back (the pages are its parent's).
static FORKED: AtomicBool = AtomicBool::new(false);

impl Arena {
    /// The arena, when enabled in this process (and not inherited by fork).
    pub fn get() -> Option<&'static Arena> {
        ARENA.get().filter(|_| !FORKED.load(Ordering::Relaxed))
    }

    /// Creates the arena (`len` bytes of address space, rounded up to
    /// pages) once per process; later calls return the first one.
    pub fn enable(len: u64, min_bytes: usize, cache_bytes: u64) -> io::Result<&'static Arena> {
        if let Some(a) = ARENA.get() {
            return Ok(a);
        }
        let a = Arena::create(len.div_ceil(PAGE) * PAGE, min_bytes, cache_bytes)?;
        // A racing caller's arena is dropped unused (unmapped below).
        let _ = ARENA.set(a);
        // SAFETY: registers a handler that only touches atomics and remaps
        // the arena (async-signal-safe calls), as `pthread_atfork` requires.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
        Ok(ARENA.get().expect("set above"))
    }

    fn create(len: u64, min_bytes: usize, cache_bytes: u64) -> io::Result<Arena> {
        // SAFETY: a NUL-terminated name and flags; the fd is ours.
        let fd = unsafe { libc::memfd_create(c"rustccl-tensors".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len)?;
        // SAFETY: maps the whole file shared; the mapping is checked below
        // and unmapped only by `Drop` (an arena that lost the race).
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Huge pages where the host gives them to shared memory
        // (`shmem_enabled` advise or always): fewer page faults and TLB
        // misses in the copies; elsewhere the advice changes nothing.
        // SAFETY: advice on our own mapping; failure is harmless.
        unsafe { libc::madvise(base, len as usize, libc::MADV_HUGEPAGE) };
        let canary = getrandom::u64().unwrap_or(0x9e37_79b9_7f4a_7c15) | 1;
        // SAFETY: the first page is mapped, writable and never handed out.
        unsafe { (base as *mut u64).write_volatile(canary) };
        let state = State { ranges: RangeAllocator::new(PAGE..len), live: HashMap::new(), stats: ArenaStats::default() };
        Ok(Arena { file, base: base.cast(), len, canary, min_bytes, cache_bytes, state: Mutex::new(state) })
    }

    pub fn info(&self) -> ArenaInfo {
        ArenaInfo { base: self.base as u64, len: self.len, fd: self.file.as_raw_fd() as u64, canary: self.canary }
    }

    pub fn stats(&self) -> ArenaStats {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).stats
    }

    /// `n` bytes (whole pages) from the arena; None below `min_bytes` or
    /// when it is full (the caller allocates elsewhere).
    pub fn alloc(&self, n: usize) -> Option<*mut u8> {
        if n < self.min_bytes || n == 0 {
            return None;
        }
        let len = (n as u64).div_ceil(PAGE) * PAGE;
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Ok(r) = s.ranges.allocate_range(len) else {
            s.stats.full += 1;
            return None;
        };
        s.live.insert(r.start, len);
        s.stats.in_use += len;
        s.stats.peak = s.stats.peak.max(s.stats.in_use);
        // Freed pages are reused first (an estimate: the ranges merge).
        s.stats.cached = s.stats.cached.saturating_sub(len);
        // SAFETY: r lies inside the mapping (the allocator's range).
        Some(unsafe { self.base.add(r.start as usize) })
    }

    /// Whether `p` was handed out by [`Arena::alloc`] (of this process,
    /// before any fork).
    pub fn owns(p: *const u8) -> bool {
        ARENA.get().is_some_and(|a| (p as u64).wrapping_sub(a.base as u64) < a.len)
    }

    /// Gives back an allocation of this process's arena; in a forked
    /// child it does nothing (the parent's allocator still owns the range).
    pub fn release(p: *mut u8) {
        if let (Some(a), false) = (ARENA.get(), FORKED.load(Ordering::Relaxed)) {
            a.free(p);
        }
    }

    /// Gives back an allocation of [`Arena::alloc`] (anything else is
    /// ignored).
    pub fn free(&self, p: *mut u8) {
        let off = (p as u64).wrapping_sub(self.base as u64);
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(len) = s.live.remove(&off) else { return };
        s.stats.in_use -= len;
        if s.stats.cached + len > self.cache_bytes {
            // SAFETY: the range is ours and no longer handed out; its pages
            // read as zeros afterwards (in peers' mappings too).
            unsafe {
                libc::fallocate(self.file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off as i64, len as i64);
            }
        } else {
            s.stats.cached += len;
        }
        s.ranges.free_range(off..off + len);
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: our own mapping, of `len` bytes; nothing was handed out
        // from an arena that is dropped (only one that lost `enable`'s race).
        unsafe { libc::munmap(self.base.cast(), self.len as usize) };
    }
}

/// `pthread_atfork` child handler: the child maps the arena privately at
/// the same address (its writes stay its own) and stops allocating from it.
extern "C" fn after_fork_in_child() {
    FORKED.store(true, Ordering::Relaxed);
    if let Some(a) = ARENA.get() {
        // SAFETY: replaces our own mapping of the arena in place (same
        // address and length, same file), so every pointer into it stays
        // valid; only the sharing changes. Where the kernel refuses (strict
        // overcommit charges a private writable mapping in full), the
        // shared mapping becomes read-only instead: a child that writes an
        // inherited tensor then faults rather than changing its parent's.
        unsafe {
            let flags = libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE;
            let got = libc::mmap(a.base.cast(), a.len as usize, libc::PROT_READ | libc::PROT_WRITE, flags, a.file.as_raw_fd(), 0);
            if got == libc::MAP_FAILED {
                libc::mprotect(a.base.cast(), a.len as usize, libc::PROT_READ);
            }
        }
    }
}

/// A local peer's arena, mapped read-only.
pub struct PeerArena {
    map: *const u8,
    base: u64,
    len: u64,
}

// SAFETY: a read-only mapping owned by this value; reads copy out of it.
unsafe impl Send for PeerArena {}
unsafe impl Sync for PeerArena {}

impl PeerArena {
    /// Maps the arena process `pid` published; an error when it cannot be
    /// opened or is not the one published (its first word is not the
    /// canary).
    pub fn open(pid: i32, info: ArenaInfo) -> io::Result<PeerArena> {
        let file = File::open(format!("/proc/{pid}/fd/{}", info.fd))?;
        let size = file.metadata()?.len();
        if size != info.len {
            return Err(io::Error::other(format!("process {pid}'s fd {} has {size} bytes, not the arena's {}", info.fd, info.len)));
        }
        // SAFETY: maps the whole file read-only and shared; it is never
        // truncated (the owner sizes it once), so every byte stays readable.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                info.len as usize,
                libc::PROT_READ,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let peer = PeerArena { map: map.cast(), base: info.base, len: info.len };
        // SAFETY: the first page is mapped (len >= PAGE, checked by size).
        let first = unsafe { (peer.map as *const u64).read_volatile() };
        if first != info.canary {
            return Err(io::Error::other(format!("process {pid}'s fd {} is not its arena", info.fd)));
        }
        Ok(peer)
    }

    /// The `len` bytes at the peer's address `addr`, when they lie in its
    /// arena. The caller must only look at them while the owner keeps them
    /// unchanged (the protocols of `Window::pull` and the rendezvous: until
    /// this rank says it is done).
    pub fn slice(&self, addr: u64, len: usize) -> Option<&[u8]> {
        let off = addr.wrapping_sub(self.base);
        if off >= self.len || self.len - off < len as u64 {
            return None;
        }
        // SAFETY: the range was checked to lie inside the read-only
        // mapping, which lives as long as `self`; the owner does not write
        // it meanwhile (the caller's protocol, above).
        Some(unsafe { std::slice::from_raw_parts(self.map.add(off as usize), len) })
    }

    /// Copies `dst.len()` bytes at the peer's address `addr` into `dst`
    /// when they lie in its arena (as [`PeerArena::slice`]); false
    /// (nothing copied) otherwise.
    pub fn read(&self, addr: u64, dst: &mut [u8]) -> bool {
        self.slice(addr, dst.len()).map(|s| dst.copy_from_slice(s)).is_some()
    }
}

impl Drop for PeerArena {
    fn drop(&mut self) {
        // SAFETY: our own mapping, of `len` bytes.
        unsafe { libc::munmap(self.map as *mut libc::c_void, self.len as usize) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_pages_reuses_them_and_peers_read_them() {
        let a = Arena::create(64 << 20, 4096, 8 << 20).expect("memfd");
        assert!(a.alloc(100).is_none(), "below min_bytes");
        let p = a.alloc(5000).expect("room");
        let q = a.alloc(3 << 20).expect("room");
        assert_eq!((q as u64 - p as u64) % PAGE, 0);
        assert!(q as u64 >= p as u64 + 2 * PAGE, "whole pages each");
        // SAFETY (test): q has 3 MiB of ours.
        let qs = unsafe { std::slice::from_raw_parts_mut(q, 3 << 20) };
        for (i, b) in qs.iter_mut().enumerate() {
            *b = (i * 31) as u8;
        }
        let peer = PeerArena::open(std::process::id() as i32, a.info()).expect("own fd");
        let mut got = vec![0u8; 1 << 20];
        assert!(peer.read(q as u64 + 4096, &mut got));
        assert_eq!(&got[..], &qs[4096..4096 + (1 << 20)]);
        assert!(!peer.read(a.base as u64 + a.len - 10, &mut got), "past the end");
        assert!(!peer.read(8, &mut got), "outside");
        assert!(a.alloc(128 << 20).is_none() && a.stats().full == 1, "full: the caller allocates elsewhere");
        a.free(p);
        a.free(q);
        assert_eq!(a.stats().in_use, 0);
        assert_eq!(a.stats().cached, 2 * PAGE + (3 << 20), "kept under the cache bound");
        let r = a.alloc(3 << 20).expect("reused");
        assert!(r == p || r == q, "a freed range is handed out again");
        a.free(r);
        let big = a.alloc(16 << 20).expect("room");
        a.free(big);
        assert!(a.stats().cached <= 8 << 20, "over the bound: given back, {}", a.stats().cached);
        let bad = ArenaInfo { canary: a.canary ^ 2, ..a.info() };
        assert!(PeerArena::open(std::process::id() as i32, bad).is_err(), "canary checked");
    }
}
