//! The word in each rank's segment that says what its collective thread
//! waits for ([`Blocked`]), read by its local peers before they sleep
//! (`transport::mesh`).
#![forbid(unsafe_code)]

/// What a rank's collective thread sleeps waiting for, in one word of its
/// segment: the operation (its wire sequence number) and how it waits. Two
/// ranks that wait for each other the two ways at the same operation wait
/// forever: one runs a shared-memory step for it, the other sends or
/// receives its messages, so they picked different algorithms (ranks that
/// passed sizes on both sides of a threshold; no algorithm exchanges
/// messages with a peer and then waits for it in a step of the same
/// operation). `Failed` marks a rank that found that out, so that its
/// other peers of the same operation stop waiting for it too; `Gone` one
/// that will take no further step in the group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocked {
    /// In a shared-memory step, for every local rank whose phase is below
    /// `target` (its low 29 bits): a stale word names a phase the peer
    /// may since have published, so the reader compares its own.
    Phase { seq: u32, target: u32 },
    /// For messages to or from the local ranks of the mask `on` (the first 29).
    Message { seq: u32, on: u32 },
    /// Gave up this operation: peers waited for it the other way.
    Failed { seq: u32 },
    /// Gave the group up for good at this operation (an error poisoned it,
    /// or it was aborted): it will publish no phase again. `failed`: it
    /// had marked this operation `Failed` (the cause its peers then name).
    Gone { seq: u32, failed: bool },
}

/// Bits of a [`Blocked`] word's mask or phase.
const BLOCKED_BITS: u32 = 29;
/// Local ranks a [`Blocked`] word can name.
pub const BLOCKED_RANKS: usize = BLOCKED_BITS as usize;

impl Blocked {
    /// The mask of local ranks `on`, or None if one is beyond [`BLOCKED_RANKS`].
    pub fn mask(on: impl IntoIterator<Item = usize>) -> Option<u32> {
        on.into_iter().try_fold(0u32, |m, i| (i < BLOCKED_RANKS).then(|| m | 1 << i))
    }

    /// A wait in a step for phase `target`.
    pub fn phase(seq: u32, target: u64) -> Blocked {
        Blocked::Phase { seq, target: target as u32 & LOW }
    }

    pub fn encode(self) -> u64 {
        let (seq, kind, payload) = match self {
            Blocked::Phase { seq, target } => (seq, 1u64, target),
            Blocked::Message { seq, on } => (seq, 2, on),
            Blocked::Failed { seq } => (seq, 3, 0),
            Blocked::Gone { seq, failed } => (seq, 4, failed as u32),
        };
        (seq as u64) << 32 | kind << BLOCKED_BITS | (payload & LOW) as u64
    }

    /// None for 0 (not blocked).
    pub fn decode(w: u64) -> Option<Blocked> {
        let (seq, payload) = ((w >> 32) as u32, w as u32 & LOW);
        match (w >> BLOCKED_BITS) & 7 {
            1 => Some(Blocked::Phase { seq, target: payload }),
            2 => Some(Blocked::Message { seq, on: payload }),
            3 => Some(Blocked::Failed { seq }),
            4 => Some(Blocked::Gone { seq, failed: payload & 1 != 0 }),
            _ => None,
        }
    }

    /// Whether a peer (local index `peer`) blocked as `self` and this rank
    /// (local index `me`, at phase `my_phase`), blocked as `mine` and
    /// waiting for the peer, can never wake each other: the peer waits for
    /// this rank the other way at the same operation, or gave it up.
    pub fn stuck_with(self, mine: Blocked, me: usize, my_phase: u64, peer: usize) -> bool {
        match (mine, self) {
            // the peer waits for our messages (we lag in its step's phase: we
            // wait for it, so it has not published ours)
            (Blocked::Phase { seq, .. }, Blocked::Message { seq: s, on }) => seq == s && on & (1 << me) != 0,
            // the peer waits in a step for a phase we have not published
            (Blocked::Message { seq, on }, Blocked::Phase { seq: s, target }) => {
                let behind = target.wrapping_sub(my_phase as u32) & LOW;
                seq == s && on & (1 << peer) != 0 && behind != 0 && behind < 1 << (BLOCKED_BITS - 1)
            }
            (Blocked::Phase { seq, .. } | Blocked::Message { seq, .. }, Blocked::Failed { seq: s }) => seq == s,
            _ => false,
        }
    }
}

const LOW: u32 = (1 << BLOCKED_BITS) - 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocked_words_round_trip_and_find_ranks_waiting_for_each_other() {
        let phase = Blocked::phase(7, 12);
        let message = Blocked::Message { seq: 7, on: Blocked::mask([0]).unwrap() };
        for b in [
            phase,
            message,
            Blocked::Failed { seq: u32::MAX },
            Blocked::Gone { seq: u32::MAX, failed: true },
            Blocked::Gone { seq: 0, failed: false },
            Blocked::phase(1, u64::MAX),
        ] {
            assert_eq!(Blocked::decode(b.encode()), Some(b));
        }
        assert_eq!(Blocked::decode(0), None);
        assert_eq!(Blocked::mask([BLOCKED_RANKS]), None);
        // rank 0 waits in a step for rank 1 (at phase 11, below 12); rank 1
        // waits for rank 0's message
        assert!(message.stuck_with(phase, 0, 11, 1));
        assert!(phase.stuck_with(message, 1, 11, 0));
        // not once rank 1 published phase 12 (rank 0's word is stale)
        assert!(!phase.stuck_with(message, 1, 12, 0));
        assert!(!phase.stuck_with(message, 1, 13, 0));
        // wrapping phases
        assert!(Blocked::phase(7, 1 << 29).stuck_with(message, 1, (1 << 29) - 1, 0));
        // not: another operation, the same way, or not waiting for us
        assert!(!Blocked::Message { seq: 8, on: 1 }.stuck_with(phase, 0, 11, 1));
        assert!(!Blocked::phase(7, 12).stuck_with(phase, 0, 11, 1));
        assert!(!Blocked::Message { seq: 7, on: 0b100 }.stuck_with(phase, 0, 11, 1));
        // a peer that gave the operation up, when we wait for it
        assert!(Blocked::Failed { seq: 7 }.stuck_with(phase, 0, 11, 2));
        assert!(!Blocked::Failed { seq: 8 }.stuck_with(message, 1, 11, 0));
    }
}
