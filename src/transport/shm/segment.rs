//! One rank's shared-memory segment: a file in /dev/shm mapped into every
//! local rank, its layout, and cross-process futex wake-ups.
//!
//! Layout (offsets in bytes; `n` local ranks):
//!
//! ```text
//! 0      magic, n, ring, small, seg        (written once, checked by mappers)
//! 40     pid, canary address, canary value (cross-memory attach, `remote.rs`)
//! 64     phase    AtomicU64  progress of this rank through direct collectives
//! 72     attach   AtomicU64  this rank's cross-memory attach threshold (the group takes the largest)
//! 80     single   AtomicU64  its smallest single-reader transfer read directly (the largest, too)
//! 88     bcast    AtomicU64  its smallest broadcast that reads the root's tensor (the largest, too)
//! 96     desc     AtomicU64  (seq, dtype, op) of the direct collective in progress, two
//! 104    len      AtomicU64  its byte count                                 (112, 120): by
//!                            the parity of the phase it started at, so a peer still verifying
//!                            the previous operation never sees the next one's
//! 128    signal   AtomicU32  futex word of the collective channel: bumped by whoever changes state this rank waits on
//! 144    stage    u64        size of the staging area (0 at creation, then `add_stage`'s, before any peer maps it)
//! 152    block    AtomicU64  this rank's block-read threshold setting (0: from the host; the group takes the largest)
//! 160    signal   AtomicU32  futex word of the point-to-point channel (its own thread waits on it)
//! 168    ar       AtomicU64  this rank's all_reduce attach threshold (the group takes the largest)
//! 176    arena    AtomicU64  base address of this rank's shared tensor arena (0: none; `arena.rs`), then
//!                            its length (184); its fd (208) and canary (216)
//! 192    sleepers AtomicU32  > 0 while this rank sleeps on the collective `signal`
//! 200    blocked  AtomicU64  what the collective thread sleeps waiting for ([`Blocked`](super::Blocked)), 0 otherwise
//! 224    sleepers AtomicU32  > 0 while this rank sleeps on the point-to-point `signal`
//! 232    reduce   AtomicU64  this rank's reduce attach threshold (the group takes the largest)
//! 240    gather   AtomicU64  this rank's all_gather attach threshold (the group takes the largest)
//! 248    rs       AtomicU64  this rank's reduce_scatter attach threshold (the group takes the largest)
//! 256+(c*n+i)*128            ring of channel c to local rank i: head (producer) at +0, tail (consumer) at +64
//! 256+2n*128 poller AtomicU64 CPU (+1) its polling thread was last seen on, and when (`place.rs`;
//!                            a cache line of its own: it changes while peers read the words above)
//! ctrl   2n rings of `ring` bytes (ring c*n+i carries this rank's bytes of channel c to local rank i)
//!        two small slots (`small` bytes each, by phase parity), input area (n x `seg`), output area (`seg`),
//!        table (2n x (address, length): the buffers a rank lets peers read),
//!        block flags: a ready flag per `BLOCK_CHUNK` of a block in the input area (one cache
//!        line each; `collectives::shm::blocks`),
//!        staging area: a ready flag per `STAGE_CHUNK` (one cache line each), then `stage` bytes
//!        (the owner's staged point-to-point send, `stage.rs`)
//!
//! Channels: 0 carries the collectives' framed messages (worker thread),
//! 1 the point-to-point messages (the p2p engine's thread), so the two
//! threads never share a ring or a futex word.
//! ```

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use memmap2::MmapRaw;

const MAGIC: u64 = 0x384d_4853_4c43_4352; // "RCCLSHM8"

/// Which pair of rings and futex word: collectives or point-to-point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Coll = 0,
    P2p = 1,
}

fn round_up(x: usize, to: usize) -> usize {
    x.div_ceil(to) * to
}

/// Where everything lives in a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub n: usize,
    pub ring: usize,
    pub small: usize,
    pub seg: usize,
    pub ctrl: usize,
    pub small_off: usize,
    pub in_off: usize,
    pub out_off: usize,
    pub table_off: usize,
    /// The input area's block flags ([`Layout::block_flags`] of them).
    pub flags_off: usize,
    pub stage: usize,
    /// The staging area's ready flags (`stage_data_off - stage_off` bytes).
    pub stage_off: usize,
    pub stage_data_off: usize,
    pub total: usize,
}

/// Bytes of the staging area covered by one ready flag: the receiver of a
/// staged send copies a chunk out as soon as the sender's flag says it is
/// in (`stage.rs`).
pub const STAGE_CHUNK: usize = 64 << 10;

/// Bytes of a block in the input area covered by one block flag: the
/// receiver of a block a sender copies there takes each such chunk as
/// soon as its flag says it is in (`collectives::shm::blocks`).
/// Smaller than a worker's piece of a 512 KiB block (64 KiB with 8
/// threads), so that each receiving thread starts while the sending
/// thread of the same piece still copies.
pub const BLOCK_CHUNK: usize = 16 << 10;

impl Layout {
    /// `ring` is rounded up to a power of two.
    pub fn new(n: usize, ring: usize, small: usize, seg: usize) -> Layout {
        let ring = ring.max(4096).next_power_of_two();
        let small = round_up(small.max(64), 64);
        let seg = round_up(seg.max(64), 64);
        let ctrl = round_up(Layout::poller_off_for(n) + 64, 4096);
        let small_off = ctrl + 2 * n * ring;
        let in_off = small_off + 2 * small;
        let out_off = in_off + n * seg;
        let table_off = out_off + seg;
        let flags_off = round_up(table_off + Layout::table_entries(n) * 16, 64);
        let stage_off = round_up(flags_off + Layout::block_flags(n, seg) * 64, 4096);
        Layout {
            n,
            ring,
            small,
            seg,
            ctrl,
            small_off,
            in_off,
            out_off,
            table_off,
            flags_off,
            stage: 0,
            stage_off,
            stage_data_off: stage_off,
            total: stage_off,
        }
    }

    /// Block flags of the input area: one per [`BLOCK_CHUNK`] of every
    /// block packed there, counted from each block's start (so blocks
    /// never share one), which is at most one per chunk of the area and
    /// one more per block (a block per local rank).
    pub fn block_flags(n: usize, seg: usize) -> usize {
        (n * seg).div_ceil(BLOCK_CHUNK) + n
    }

    /// The same layout with a staging area of `stage` bytes (rounded up to
    /// whole cache lines) at its end, after its ready flags.
    pub fn with_stage(self, stage: usize) -> Layout {
        let stage = round_up(stage, 64);
        let stage_data_off = self.stage_off + stage.div_ceil(STAGE_CHUNK) * 64;
        Layout { stage, stage_data_off, total: round_up(stage_data_off + stage, 4096), ..self }
    }

    /// Entries of the table: an input and an output span per local rank.
    pub fn table_entries(n: usize) -> usize {
        2 * n
    }

    fn poller_off_for(n: usize) -> usize {
        256 + 2 * n * 128
    }

    /// The poller word (`Segment::poller`), after the rings' heads and tails.
    pub fn poller_off(&self) -> usize {
        Layout::poller_off_for(self.n)
    }

    pub fn ring_off(&self, c: Channel, to: usize) -> usize {
        self.ctrl + (c as usize * self.n + to) * self.ring
    }

    pub fn head_off(&self, c: Channel, to: usize) -> usize {
        256 + (c as usize * self.n + to) * 128
    }

    pub fn tail_off(&self, c: Channel, to: usize) -> usize {
        self.head_off(c, to) + 64
    }
}

/// A mapped segment (ours, created; or a peer's, opened).
pub struct Segment {
    map: MmapRaw,
    file: File,
    path: PathBuf,
    owner: bool,
    unlinked: AtomicBool,
    pub layout: Layout,
}

// SAFETY: the mapping is plain shared memory; every access goes through
// atomics or through raw copies ordered by the protocol in this module.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates `path` (must not exist, mode 0600) and maps it.
    pub fn create(path: &Path, layout: Layout) -> io::Result<Segment> {
        let file = OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).open(path)?;
        let seg = (|| {
            file.set_len(layout.total as u64)?;
            reserve(&file, 0, layout.total)?;
            let map = MmapRaw::map_raw(&file)?;
            Ok::<_, io::Error>(Segment { map, file, path: path.to_path_buf(), owner: true, unlinked: AtomicBool::new(false), layout })
        })();
        match seg {
            Ok(s) => {
                s.write_header();
                Ok(s)
            }
            Err(e) => {
                let _ = std::fs::remove_file(path);
                Err(e)
            }
        }
    }

    /// Grows this rank's own segment (not yet mapped by any peer) by a
    /// staging area of `stage` bytes, reserving its pages now; where that
    /// fails the segment is left as it was and the error says why.
    pub fn add_stage(&mut self, stage: usize) -> io::Result<()> {
        assert!(self.owner && self.layout.stage == 0, "add_stage on a segment that is not ours or already has one");
        let base = self.layout;
        let full = base.with_stage(stage);
        let grown = (|| {
            self.file.set_len(full.total as u64)?;
            reserve(&self.file, base.total, full.total - base.total)?;
            MmapRaw::map_raw(&self.file)
        })();
        match grown {
            Ok(map) => {
                self.map = map;
                self.layout = full;
                self.u64_at(144).store(full.stage as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // Truncating frees whatever part of the range was reserved.
                let _ = self.file.set_len(base.total as u64);
                Err(e)
            }
        }
    }

    /// Maps a peer's segment and checks it was made for the same layout,
    /// but for its staging area, whose size the owner chose (it may have
    /// had no room for one): that is read from the header.
    pub fn open(path: &Path, layout: Layout) -> io::Result<Segment> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        let too_small = || io::Error::new(io::ErrorKind::InvalidData, "segment too small");
        let base = layout.with_stage(0);
        if len < base.total as u64 {
            return Err(too_small());
        }
        let map = MmapRaw::map_raw(&file)?;
        let mut s = Segment { map, file, path: path.to_path_buf(), owner: false, unlinked: AtomicBool::new(true), layout: base };
        if s.u64_at(0).load(Ordering::Acquire) != MAGIC
            || s.u64_at(8).load(Ordering::Relaxed) != layout.n as u64
            || s.u64_at(16).load(Ordering::Relaxed) != layout.ring as u64
            || s.u64_at(24).load(Ordering::Relaxed) != layout.small as u64
            || s.u64_at(32).load(Ordering::Relaxed) != layout.seg as u64
        {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "segment header mismatch (ranks of this host set RUSTCCL_SHM_RING_BYTES, RUSTCCL_SHM_SMALL_BYTES, RUSTCCL_SHM_SEGMENT_BYTES or RUSTCCL_SHM_THREADS differently?)"));
        }
        let stage = s.u64_at(144).load(Ordering::Relaxed);
        if stage > len {
            return Err(too_small());
        }
        s.layout = base.with_stage(stage as usize);
        if len < s.layout.total as u64 {
            return Err(too_small());
        }
        Ok(s)
    }

    fn write_header(&self) {
        let l = self.layout;
        self.u64_at(8).store(l.n as u64, Ordering::Relaxed);
        self.u64_at(16).store(l.ring as u64, Ordering::Relaxed);
        self.u64_at(24).store(l.small as u64, Ordering::Relaxed);
        self.u64_at(32).store(l.seg as u64, Ordering::Relaxed);
        self.u64_at(144).store(l.stage as u64, Ordering::Relaxed);
        self.u64_at(0).store(MAGIC, Ordering::Release);
    }

    /// Removes the name from /dev/shm (the memory lives on while mapped).
    pub fn unlink(&self) {
        if self.owner && !self.unlinked.swap(true, Ordering::AcqRel) {
            let _ = std::fs::remove_file(&self.path);
        }
    }

    pub fn base(&self) -> *mut u8 {
        self.map.as_mut_ptr()
    }

    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(off % 8 == 0 && off + 8 <= self.layout.ctrl, "u64_at({off}) outside the control area");
        // SAFETY: in bounds (asserted), 8-aligned (the mapping is page
        // aligned), valid for the life of `self`; AtomicU64 has the layout of
        // u64 and all cross-process access to these words is atomic.
        unsafe { &*(self.base().add(off) as *const AtomicU64) }
    }

    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(off % 4 == 0 && off + 4 <= self.layout.ctrl, "u32_at({off}) outside the control area");
        // SAFETY: as in `u64_at`.
        unsafe { &*(self.base().add(off) as *const AtomicU32) }
    }

    pub fn phase(&self) -> &AtomicU64 {
        self.u64_at(64)
    }

    /// Ready flag `k` of the staging area: the sequence number of the last
    /// staged send whose chunk `k` is written (`stage.rs`).
    pub fn stage_flag(&self, k: usize) -> &AtomicU64 {
        let off = self.layout.stage_off + 64 * k;
        assert!(off + 8 <= self.layout.stage_data_off, "stage_flag({k}) beyond the staging area's flags");
        self.flag_at(off)
    }

    /// The ready flag at `off` (a cache line of the flags past the control area).
    fn flag_at(&self, off: usize) -> &AtomicU64 {
        assert!(off % 64 == 0 && off + 8 <= self.layout.total, "flag at {off} outside the segment");
        // SAFETY: in bounds and 8-aligned (asserted; the mapping is page
        // aligned), valid for the life of `self`; every access to the
        // flags (block and staging) is atomic.
        unsafe { &*(self.base().add(off) as *const AtomicU64) }
    }

    /// Block flag `k` of the input area: the number of the last operation
    /// that wrote the chunk it covers (`collectives::shm::blocks`).
    pub fn block_flag(&self, k: usize) -> &AtomicU64 {
        let off = self.layout.flags_off + 64 * k;
        assert!(k < Layout::block_flags(self.layout.n, self.layout.seg), "block_flag({k}) beyond the input area's flags");
        self.flag_at(off)
    }

    /// The owner's process id, and the address and value of a canary in
    /// its memory (for the cross-memory attach probe).
    pub fn attach_info(&self) -> (&AtomicU64, &AtomicU64, &AtomicU64) {
        (self.u64_at(40), self.u64_at(48), self.u64_at(56))
    }

    /// The owner's cross-memory attach threshold setting.
    pub fn attach_min(&self) -> &AtomicU64 {
        self.u64_at(72)
    }

    /// The owner's smallest single-reader transfer read directly.
    pub fn single_min(&self) -> &AtomicU64 {
        self.u64_at(80)
    }

    /// The owner's smallest broadcast that reads the root's tensor.
    pub fn broadcast_min(&self) -> &AtomicU64 {
        self.u64_at(88)
    }

    /// Where the owner's shared tensor arena lies (`arena.rs`): base
    /// address (0: none), length, fd and canary.
    pub fn arena_info(&self) -> [&AtomicU64; 4] {
        [self.u64_at(176), self.u64_at(184), self.u64_at(208), self.u64_at(216)]
    }

    /// The owner's reduce attach threshold (`Attach::reduce_min`).
    pub fn reduce_min(&self) -> &AtomicU64 {
        self.u64_at(232)
    }

    /// The owner's all_gather attach threshold (`Attach::all_gather_min`).
    pub fn all_gather_min(&self) -> &AtomicU64 {
        self.u64_at(240)
    }

    /// The owner's reduce_scatter attach threshold
    /// (`Attach::reduce_scatter_min`).
    pub fn reduce_scatter_min(&self) -> &AtomicU64 {
        self.u64_at(248)
    }

    /// The owner's all_reduce attach threshold (`Attach::all_reduce_min`).
    pub fn all_reduce_min(&self) -> &AtomicU64 {
        self.u64_at(168)
    }

    /// Where and when this rank's polling thread last looked (`place.rs`).
    pub fn poller(&self) -> &AtomicU64 {
        self.u64_at(self.layout.poller_off())
    }

    /// The owner's block-read threshold setting (`Attach::block_min`).
    pub fn block_min(&self) -> &AtomicU64 {
        self.u64_at(152)
    }

    /// Descriptor of the direct collective this rank is in: (seq, dtype,
    /// op); `slot`: the parity of the phase it started at.
    pub fn desc(&self, slot: usize) -> &AtomicU64 {
        self.u64_at(96 + 16 * (slot & 1))
    }

    pub fn desc_len(&self, slot: usize) -> &AtomicU64 {
        self.u64_at(104 + 16 * (slot & 1))
    }

    pub fn signal(&self) -> &AtomicU32 {
        self.signal_of(Channel::Coll)
    }

    /// The futex word the owner's thread of channel `c` waits on.
    pub fn signal_of(&self, c: Channel) -> &AtomicU32 {
        self.u32_at(128 + 32 * c as usize)
    }

    /// What the owner's collective thread sleeps waiting for (written
    /// before it sleeps, cleared when its wait ends; [`Blocked`](super::Blocked)).
    pub fn blocked(&self) -> &AtomicU64 {
        self.u64_at(200)
    }

    fn sleepers(&self, c: Channel) -> &AtomicU32 {
        self.u32_at(192 + 32 * c as usize)
    }

    /// Tells the owner's thread of channel `c` that something it may wait
    /// on changed: bumps the word it watches while it polls, wakes it if it
    /// sleeps.
    pub fn notify_on(&self, c: Channel) {
        self.signal_of(c).fetch_add(1, Ordering::Release);
        if self.sleepers(c).load(Ordering::Acquire) > 0 {
            futex_wake(self.signal_of(c));
        }
    }

    /// Wakes the owner's collective thread if it sleeps in
    /// [`Segment::sleep_unless`], after a change (a published phase) that
    /// such a sleeper checks for itself. While it polls, nothing is
    /// written: a publish on 8 ranks otherwise made 7 atomic increments
    /// on lines their owners were reading.
    pub fn wake_if_asleep(&self) {
        self.wake_if_asleep_on(Channel::Coll)
    }

    /// As [`Segment::wake_if_asleep`], for sleepers of channel `c`
    /// ([`Segment::sleep_unless_on`]).
    pub fn wake_if_asleep_on(&self, c: Channel) {
        // Pairs with the fence in `sleep_unless_on`: either this load sees
        // the sleeper, or its check sees what was stored before this fence.
        fence(Ordering::SeqCst);
        if self.sleepers(c).load(Ordering::Relaxed) > 0 {
            self.notify_on(c);
        }
    }

    /// Sleeps (up to `timeout`) on channel `c`'s word unless it moved from
    /// `seen` or `ready()`, checked once this thread counts as a sleeper
    /// (see [`Segment::wake_if_asleep_on`]); returns early on any wake-up.
    pub fn sleep_unless_on(&self, c: Channel, seen: u32, timeout: Duration, ready: impl FnOnce() -> bool) {
        let (sig, sleepers) = (self.signal_of(c), self.sleepers(c));
        sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        if !ready() {
            futex_wait(sig, seen, timeout);
        }
        sleepers.fetch_sub(1, Ordering::AcqRel);
    }

    /// Sleeps (up to `timeout`) on the collective thread's word unless
    /// `ready()`, checked once this thread counts as a sleeper (see
    /// [`Segment::wake_if_asleep`]); returns early on any wake-up.
    pub fn sleep_unless(&self, timeout: Duration, ready: impl FnOnce() -> bool) {
        let seen = self.signal_of(Channel::Coll).load(Ordering::Acquire);
        self.sleep_unless_on(Channel::Coll, seen, timeout, ready)
    }

    /// Sleeps (up to `timeout`) until the collective thread's word differs
    /// from `seen` (ring pushes bump it: [`Segment::notify_on`]).
    pub fn sleep(&self, seen: u32, timeout: Duration) {
        self.sleep_on(Channel::Coll, seen, timeout)
    }

    /// As `sleep`, on channel `c`'s word.
    pub fn sleep_on(&self, c: Channel, seen: u32, timeout: Duration) {
        let (sig, sleepers) = (self.signal_of(c), self.sleepers(c));
        sleepers.fetch_add(1, Ordering::AcqRel);
        if sig.load(Ordering::Acquire) == seen {
            futex_wait(sig, seen, timeout);
        }
        sleepers.fetch_sub(1, Ordering::AcqRel);
    }

    /// Copies `src` into the segment at `off`.
    ///
    /// # Safety
    /// No other process reads or writes `off..off+len` until the writer
    /// publishes it (a release store that readers acquire).
    pub unsafe fn write(&self, off: usize, src: &[u8]) {
        assert!(off + src.len() <= self.layout.total, "shm write out of bounds");
        std::ptr::copy_nonoverlapping(src.as_ptr(), self.base().add(off), src.len());
    }

    /// Copies out of the segment at `off` into `dst`.
    ///
    /// # Safety
    /// The range was published to this reader and nobody writes it until
    /// the reader signals it is done.
    pub unsafe fn read(&self, off: usize, dst: &mut [u8]) {
        assert!(off + dst.len() <= self.layout.total, "shm read out of bounds");
        std::ptr::copy_nonoverlapping(self.base().add(off), dst.as_mut_ptr(), dst.len());
    }

    /// A borrowed view of `off..off+len`.
    ///
    /// # Safety
    /// As for `read`, for as long as the slice lives.
    pub unsafe fn view(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.layout.total, "shm view out of bounds");
        std::slice::from_raw_parts(self.base().add(off), len)
    }

    /// A mutable view of `off..off+len` of our own segment.
    ///
    /// # Safety
    /// As for `write`, for as long as the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn view_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.layout.total, "shm view out of bounds");
        std::slice::from_raw_parts_mut(self.base().add(off), len)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Allocates the file's pages now: /dev/shm (tmpfs) otherwise allocates
/// them when first touched, and a touch beyond its size (Docker's default
/// is 64 MiB) kills the process with SIGBUS instead of failing here, where
/// the group falls back to TCP. `len` bytes from `off` (within the file's
/// length).
fn reserve(file: &File, off: usize, len: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fallocate on a file descriptor we own, for a range
    // within the length just set; it touches no memory of ours.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), off as libc::off_t, len as libc::off_t) };
    let what = if off == 0 { format!("this rank's {len}-byte segment") } else { format!("{len} more bytes of this rank's segment") };
    match rc {
        0 => Ok(()),
        // a file system that cannot reserve: keep the lazy allocation
        libc::EOPNOTSUPP | libc::EINVAL => Ok(()),
        // (io::ErrorKind::StorageFull needs Rust 1.83; the MSRV is 1.82)
        libc::ENOSPC => Err(io::Error::other(format!(
            "/dev/shm has no room for {what} (mount it larger, e.g. docker run --shm-size=1g, or make RUSTCCL_SHM_RING_BYTES / RUSTCCL_SHM_STAGED_SEND_MAX_BYTES smaller)"
        ))),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: FUTEX_WAIT (shared, not PRIVATE: the word lives in memory
    // mapped by several processes) on a valid, aligned u32 with a timeout;
    // spurious returns are handled by the callers' loops.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, &ts as *const libc::timespec, 0usize, 0u32);
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE on a valid, aligned u32 in shared memory.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0usize, 0usize, 0u32);
    }
}

#[cfg(test)]
#[path = "segment_tests.rs"]
mod tests;
