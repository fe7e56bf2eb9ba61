//! Tests of `segment.rs`: segment files, sleeping on phases.

use super::*;
use std::os::unix::fs::PermissionsExt;
use std::time::Instant;

#[test]
fn segments_are_private_exclusive_and_unlinked() {
    let path =
        PathBuf::from(format!("/dev/shm/rustccl-test-{}-{:?}", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""));
    let layout = Layout::new(2, 4096, 256, 256);
    let seg = Segment::create(&path, layout).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(Segment::create(&path, layout).is_err(), "a second job cannot take the same name");
    let peer = Segment::open(&path, layout).unwrap();
    seg.phase().store(7, Ordering::Release);
    assert_eq!(peer.phase().load(Ordering::Acquire), 7, "both mappings see one memory");
    seg.unlink();
    assert!(!path.exists());
    assert!(Segment::open(&path, Layout::new(3, 4096, 256, 256)).is_err());
    drop(peer);
}

/// A peer given smaller rings or small slots than the owner (other
/// settings) would find every offset elsewhere: it must not map the
/// segment, although the file is long enough for its layout.
#[test]
fn segments_made_with_other_ring_or_slot_sizes_are_refused() {
    let path = PathBuf::from(format!("/dev/shm/rustccl-test-sizes-{}", std::process::id()));
    let layout = Layout::new(2, 8192, 512, 256);
    let seg = Segment::create(&path, layout).unwrap();
    assert!(Segment::open(&path, layout).is_ok());
    for other in [Layout::new(2, 4096, 512, 256), Layout::new(2, 8192, 256, 256)] {
        let e = Segment::open(&path, other).err().expect("refused");
        assert!(e.to_string().contains("RUSTCCL_SHM_RING_BYTES"), "{e}");
    }
    seg.unlink();
}

/// A staging area added after the segment was made (once every local
/// rank's segment has its room) keeps what the segment held, and a peer
/// that maps it afterwards takes its size from the header.
#[test]
fn a_staging_area_grows_the_segment_for_later_mappers() {
    let path = PathBuf::from(format!("/dev/shm/rustccl-test-stage-{}", std::process::id()));
    let layout = Layout::new(2, 4096, 256, 256);
    let mut seg = Segment::create(&path, layout).unwrap();
    seg.phase().store(5, Ordering::Release);
    assert_eq!(Segment::open(&path, layout).unwrap().layout.stage, 0);
    seg.add_stage(100_000).unwrap();
    let full = layout.with_stage(100_000);
    assert_eq!(seg.layout, full);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), full.total as u64);
    let peer = Segment::open(&path, layout).unwrap();
    assert_eq!(peer.layout, full);
    assert_eq!(peer.phase().load(Ordering::Acquire), 5, "the grown mapping keeps the segment's contents");
    let last = (full.stage_data_off - full.stage_off) / 64 - 1;
    seg.stage_flag(last).store(0xfeed, Ordering::Release);
    assert_eq!(peer.stage_flag(last).load(Ordering::Acquire), 0xfeed, "both see the staging area's memory");
    seg.unlink();
    drop(peer);
}

/// A phase waiter that sleeps is woken by the publisher's
/// `wake_if_asleep` (which writes nothing while nobody sleeps), also when
/// the publish races with the waiter going to sleep: 2000 rounds whose
/// sleeps would each last 20 s if a wake-up were lost.
#[test]
fn sleepers_on_phases_are_never_missed() {
    let path = PathBuf::from(format!("/dev/shm/rustccl-test-sleep-{}", std::process::id()));
    let layout = Layout::new(2, 4096, 256, 256);
    let owner = std::sync::Arc::new(Segment::create(&path, layout).unwrap());
    // The publisher's mapping of the waiter's segment.
    let peer = Segment::open(&path, layout).unwrap();
    owner.unlink();
    let waiter = {
        let owner = owner.clone();
        std::thread::spawn(move || {
            let t0 = Instant::now();
            for round in 1..=2000u64 {
                // (A publisher's phase lives in its own segment; the
                // waiter's phase word stands in for it here.)
                while owner.phase().load(Ordering::Acquire) < round {
                    owner.sleep_unless(Duration::from_secs(20), || owner.phase().load(Ordering::Acquire) >= round);
                }
            }
            t0.elapsed()
        })
    };
    for round in 1..=2000u64 {
        if round % 3 == 0 {
            std::thread::sleep(Duration::from_micros(50)); // let the waiter fall asleep
        }
        peer.phase().store(round, Ordering::Release);
        peer.wake_if_asleep();
    }
    let took = waiter.join().unwrap();
    assert!(took < Duration::from_secs(20), "a sleeping waiter missed a publish ({took:?} for 2000 rounds)");
    // Nobody sleeps: a publish leaves the word alone.
    let word = owner.signal().load(Ordering::Relaxed);
    peer.wake_if_asleep();
    assert_eq!(owner.signal().load(Ordering::Relaxed), word);
}
