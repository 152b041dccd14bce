//! Choosing, by measurement, how a blocking collective's long messages travel: through the
//! channels' slots (two copies, pipelined: the sender copies in, the receiver copies out) or
//! read straight from the sender's buffer (one copy, a system call that pins its pages).
//!
//! Which is faster depends on where the two processes run, and on this machine that changes
//! within minutes: with the cache-line round trip between its cores at ~430 ns the slots took
//! 0.5–0.9x Open MPI's time for 256 KiB – 4 MiB, with it at ~130 ns 1.2–2.3x, while the direct
//! read stayed at 0.9–1.2x in both. So each team times its blocking collectives from
//! [`TUNE_MIN`] bytes up, per collective and power-of-two size class, both ways: the first
//! calls of a class try each way twice, in turns (the faster try counts: the first calls
//! also fault the buffers in and warm the caches), later calls take the faster (an average
//! over recent calls) and every [`EXPLORE`]th call takes the other ([`SPARSE`] times less
//! often where it looked much slower), so a change of machine is noticed.
//! Calls come in the same order on every member, so members try the same way on the same
//! call. The receiver follows whatever the sender announced, so members that end up choosing
//! differently still move the right bytes.
//!
//! An alltoall whose blocks are large enough has a second choice, made the same way: whether
//! a member copies its own block with cache-bypassing stores ([`Way::streaming`]). That pays
//! where the call's data does not stay in the last-level cache anyway and costs where it
//! does, and this machine has been both: on one host 4 MiB blocks on 2 ranks took 1258 µs
//! with `memcpy` and 1140 µs streaming (means of 5 alternating runs), on a later one (32 MiB
//! of L3) 314-320 µs with `memcpy` and 358-405 µs streaming. Those calls then try the four
//! combinations.

use std::collections::HashMap;

/// Smallest collective (bytes per member) whose way is chosen by measurement.
pub const TUNE_MIN: usize = 64 << 10;
/// Smallest message read directly while a call tries the direct way (a ring's or a pairwise
/// exchange's messages are a part of the call's bytes).
pub const DIRECT_MIN: usize = 32 << 10;
/// Calls of a class that try each way before the faster is chosen.
const TRIES: u32 = 2;
/// Every this many calls of a class take the way that looks slower…
const EXPLORE: u64 = 32;
/// …but only every this many such rounds where it looked more than [`FAR`] times slower: a
/// 4 MiB broadcast took 8% longer, exploring the direct read (2–3x the slots' time on this
/// machine) every 32 calls, than with the slots alone.
const SPARSE: u64 = 4;
const FAR: f64 = 1.5;
/// Weight of the newest call in a way's running average.
const WEIGHT: f64 = 0.25;
/// A call counts into its way's running average as at most this many times the average.
const OUTLIER: f64 = 2.0;

/// How a tuned call goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Way {
    /// Long messages are read from the sender's buffer (else through the slots).
    pub direct: bool,
    /// A member copies its own alltoall block with cache-bypassing stores.
    pub streaming: bool,
}

impl Way {
    /// Through the slots, the own block copied with `memcpy`.
    #[cfg(test)]
    pub const SLOTS: Way = Way { direct: false, streaming: false };
    /// Read from the sender's buffer, the own block copied with `memcpy`.
    #[cfg(test)]
    pub const DIRECT: Way = Way { direct: true, streaming: false };

    /// The way numbered `i` (`0..4`): bit 0 direct, bit 1 streaming.
    fn from_index(i: usize) -> Way {
        Way { direct: i & 1 != 0, streaming: i & 2 != 0 }
    }
    fn index(self) -> usize {
        self.direct as usize | (self.streaming as usize) << 1
    }
}

/// A collective's kind and size class, and whether this member's data lies in a segment (then
/// long messages from it are read in place whichever way is chosen, at another cost than
/// through the slots: timing those calls into the same class made a way look faster for the
/// program's other buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub coll: u64,
    pub class: u32,
    pub in_segment: bool,
}

impl Key {
    pub fn new(coll: u64, bytes: usize, in_segment: bool) -> Key {
        Key { coll, class: usize::BITS - bytes.leading_zeros(), in_segment }
    }
}

/// Most ways a call may choose between.
const WAYS: usize = 4;

#[derive(Default)]
struct Class {
    calls: u64,
    /// Running average of ns per call, and calls measured, by way ([`Way::index`]).
    avg: [f64; WAYS],
    seen: [u32; WAYS],
}

/// The measurements of one team.
#[derive(Default)]
pub struct Tuner {
    classes: HashMap<Key, Class>,
}

impl Tuner {
    /// The way the next call of `key` takes. With `streaming`, it chooses among all four
    /// ways, else between [`Way::SLOTS`] and [`Way::DIRECT`].
    pub fn choose(&mut self, key: Key, streaming: bool) -> Way {
        let ways = if streaming { WAYS } else { 2 };
        let c = self.classes.entry(key).or_default();
        let call = c.calls;
        c.calls += 1;
        // The tries go round the ways, so that none gets all of the first, coldest calls.
        if call < TRIES as u64 * ways as u64 {
            return Way::from_index(call as usize % ways);
        }
        let best = (1..ways).fold(0, |b, i| if c.avg[i] < c.avg[b] { i } else { b });
        if !call.is_multiple_of(EXPLORE) {
            return Way::from_index(best);
        }
        // Exploring: the other ways in turn; one more than FAR times slower than the fastest
        // only every SPARSE-th round.
        let round = call / EXPLORE;
        let turn = round as usize % (ways - 1);
        let other = (0..ways).filter(|&i| i != best).nth(turn).unwrap_or(best);
        if c.avg[other] > FAR * c.avg[best] && !round.is_multiple_of(SPARSE) {
            return Way::from_index(best);
        }
        Way::from_index(other)
    }

    /// Records that a call of `key` took `ns` going `way`. A way's first calls (its tries)
    /// count by their fastest, the later ones into a running average: the very first call
    /// of a class also pays for touching its buffers for the first time (page faults: 5.5 ms
    /// against 1.1 ms for a 4 MiB alltoall), and averaging that in kept the slots looking
    /// slower for hundreds of calls. Later calls count as at most [`OUTLIER`] times their way's
    /// average, for the same reason: the first call on a program's fresh buffers, or one
    /// preempted, took 2 ms where the slots take 70 µs, and so handed a 1 MiB alltoall to the
    /// direct read (90–120 µs) for hundreds of calls. A way that really became slower still
    /// rises by up to a quarter per call.
    pub fn record(&mut self, key: Key, way: Way, ns: f64) {
        let c = self.classes.entry(key).or_default();
        let i = way.index();
        c.avg[i] = match c.seen[i] {
            0 => ns,
            seen if seen < TRIES => c.avg[i].min(ns),
            _ => c.avg[i] + WEIGHT * (ns.min(OUTLIER * c.avg[i]) - c.avg[i]),
        };
        c.seen[i] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::{Key, Tuner, Way, EXPLORE};

    /// `calls` calls of `k`, each taking what `cost` says for its way: the ways chosen.
    fn calls(t: &mut Tuner, k: Key, streaming: bool, calls: u64, cost: impl Fn(Way) -> f64) -> Vec<Way> {
        (0..calls)
            .map(|_| {
                let w = t.choose(k, streaming);
                t.record(k, w, cost(w));
                w
            })
            .collect()
    }

    #[test]
    fn tries_both_then_keeps_the_faster_and_explores() {
        let mut t = Tuner::default();
        let k = Key::new(1, 1 << 20, false);
        let ways = calls(&mut t, k, false, 8 * EXPLORE, |w| if w == Way::DIRECT { 100.0 } else { 300.0 });
        assert_eq!(&ways[..4], &[Way::SLOTS, Way::DIRECT, Way::SLOTS, Way::DIRECT]);
        let slots_later = ways[4..].iter().filter(|&&w| w == Way::SLOTS).count();
        // Rounds 1..8 explore; the slots, 3x slower, only in round 4.
        assert_eq!(slots_later, 1, "only the sparse exploring calls go the far slower way: {ways:?}");
        // The machine changes: the direct read becomes slower; exploration notices.
        let last = calls(&mut t, k, false, 4 * EXPLORE, |w| if w == Way::DIRECT { 500.0 } else { 300.0 });
        let direct_late = last[2 * EXPLORE as usize..].iter().filter(|&&w| w == Way::DIRECT).count();
        assert_eq!(direct_late, 2, "back to the slots but for the exploring calls: {last:?}");
    }

    #[test]
    fn a_near_way_is_explored_every_round() {
        let mut t = Tuner::default();
        let k = Key::new(1, 1 << 20, false);
        let ways = calls(&mut t, k, false, 8 * EXPLORE, |w| if w == Way::DIRECT { 100.0 } else { 120.0 });
        let slots_later = ways[4..].iter().filter(|&&w| w == Way::SLOTS).count();
        assert_eq!(slots_later, 7, "rounds 1..8 each explore the slots: {ways:?}");
    }

    #[test]
    fn a_cold_first_call_does_not_decide() {
        let mut t = Tuner::default();
        let k = Key::new(1, 4 << 20, false);
        let first = std::cell::Cell::new(true);
        let ways = calls(&mut t, k, false, EXPLORE, |w| {
            // The first call faults its buffers in: five times a warm call.
            let cold = first.replace(false);
            match w {
                Way::SLOTS if cold => 5500.0,
                Way::SLOTS => 700.0,
                _ => 1000.0,
            }
        });
        assert!(ways[4..].iter().all(|&w| w == Way::SLOTS), "{ways:?}");
    }

    #[test]
    fn a_stray_slow_call_does_not_hand_over_the_class() {
        let mut t = Tuner::default();
        let k = Key::new(1, 1 << 20, false);
        let cost = |w| if w == Way::DIRECT { 100.0 } else { 70.0 };
        calls(&mut t, k, false, 2 * EXPLORE + 1, cost); // the next call does not explore
                                                        // One slots call on fresh buffers pays its page faults: thirty times a warm one.
        let w = t.choose(k, false);
        assert_eq!(w, Way::SLOTS);
        t.record(k, w, 2100.0);
        let after = calls(&mut t, k, false, EXPLORE, cost);
        let direct = after.iter().filter(|&&w| w == Way::DIRECT).count();
        assert!(direct <= 1, "only an exploring call may go the slower way: {after:?}");
    }

    #[test]
    fn classes_are_apart() {
        let mut t = Tuner::default();
        let (a, b) = (Key::new(1, 1 << 20, false), Key::new(1, 1 << 16, false));
        assert_ne!(a, b);
        assert_ne!(a, Key::new(1, 1 << 20, true), "data in a segment is a class of its own");
        for _ in 0..4 {
            t.choose(a, false);
        }
        assert_eq!(t.choose(b, false), Way::SLOTS, "a fresh class starts with the slots");
    }

    #[test]
    fn streaming_tries_all_four_and_explores_each() {
        let mut t = Tuner::default();
        let k = Key::new(3, 4 << 20, false);
        let fast = Way { direct: false, streaming: true };
        let ways = calls(&mut t, k, true, 4 * EXPLORE, |w| if w == fast { 300.0 } else { 400.0 });
        let all: Vec<Way> = (0..4).map(Way::from_index).collect();
        assert_eq!(&ways[..4], &all[..], "one try of each in turn");
        assert_eq!(&ways[4..8], &all[..]);
        let others: Vec<Way> = ways[8..].iter().copied().filter(|&w| w != fast).collect();
        assert_eq!(others.len(), 3, "only the exploring calls leave the fastest: {ways:?}");
        assert!(all.iter().filter(|&&w| w != fast).all(|w| others.contains(w)), "{others:?}");
        // Without the streaming choice the same class never streams.
        let k2 = Key::new(3, 1 << 20, false);
        assert!(calls(&mut t, k2, false, 2 * EXPLORE, |_| 1.0).iter().all(|w| !w.streaming));
    }
}
