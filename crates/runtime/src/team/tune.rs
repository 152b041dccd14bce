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
//! over recent calls) and every [`EXPLORE`]th call takes the other, so a change of machine
//! is noticed.
//! Calls come in the same order on every member, so members try the same way on the same
//! call. The receiver follows whatever the sender announced, so members that end up choosing
//! differently still move the right bytes.

use std::collections::HashMap;

/// Smallest collective (bytes per member) whose way is chosen by measurement.
pub const TUNE_MIN: usize = 64 << 10;
/// Smallest message read directly while a call tries the direct way (a ring's or a pairwise
/// exchange's messages are a part of the call's bytes).
pub const DIRECT_MIN: usize = 32 << 10;
/// Calls of a class that try each way before the faster is chosen.
const TRIES: u32 = 2;
/// Every this many calls of a class take the way that looks slower.
const EXPLORE: u64 = 32;
/// Weight of the newest call in a way's running average.
const WEIGHT: f64 = 0.25;

/// How long messages travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    /// Through the slots.
    Slots,
    /// Read from the sender's buffer.
    Direct,
}

/// A collective's kind and size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub coll: u64,
    pub class: u32,
}

impl Key {
    pub fn new(coll: u64, bytes: usize) -> Key {
        Key { coll, class: usize::BITS - bytes.leading_zeros() }
    }
}

#[derive(Default)]
struct Class {
    calls: u64,
    /// Running average of ns per call, and calls measured, by way (slots, direct).
    avg: [f64; 2],
    seen: [u32; 2],
}

/// The measurements of one team.
#[derive(Default)]
pub struct Tuner {
    classes: HashMap<Key, Class>,
}

fn index(w: Way) -> usize {
    match w {
        Way::Slots => 0,
        Way::Direct => 1,
    }
}

impl Tuner {
    /// The way the next call of `key` takes.
    pub fn choose(&mut self, key: Key) -> Way {
        let c = self.classes.entry(key).or_default();
        let call = c.calls;
        c.calls += 1;
        match call {
            // The tries alternate, so that neither way gets all of the first, coldest calls.
            n if n < 2 * TRIES as u64 && n % 2 == 0 => Way::Slots,
            n if n < 2 * TRIES as u64 => Way::Direct,
            _ => {
                let best = if c.avg[0] <= c.avg[1] { Way::Slots } else { Way::Direct };
                let other = if best == Way::Slots { Way::Direct } else { Way::Slots };
                if call.is_multiple_of(EXPLORE) {
                    other
                } else {
                    best
                }
            }
        }
    }

    /// Records that a call of `key` took `ns` going `way`. A way's first calls (its tries)
    /// count by their fastest, the later ones into a running average: the very first call
    /// of a class also pays for touching its buffers for the first time (page faults: 5.5 ms
    /// against 1.1 ms for a 4 MiB alltoall), and averaging that in kept the slots looking
    /// slower for hundreds of calls.
    pub fn record(&mut self, key: Key, way: Way, ns: f64) {
        let c = self.classes.entry(key).or_default();
        let i = index(way);
        c.avg[i] = match c.seen[i] {
            0 => ns,
            seen if seen < TRIES => c.avg[i].min(ns),
            _ => c.avg[i] + WEIGHT * (ns - c.avg[i]),
        };
        c.seen[i] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::{Key, Tuner, Way, EXPLORE};

    /// `calls` calls of `k`, each taking what `cost` says for its way: the ways chosen.
    fn calls(t: &mut Tuner, k: Key, calls: u64, cost: impl Fn(Way) -> f64) -> Vec<Way> {
        (0..calls)
            .map(|_| {
                let w = t.choose(k);
                t.record(k, w, cost(w));
                w
            })
            .collect()
    }

    #[test]
    fn tries_both_then_keeps_the_faster_and_explores() {
        let mut t = Tuner::default();
        let k = Key::new(1, 1 << 20);
        let ways = calls(&mut t, k, 3 * EXPLORE, |w| if w == Way::Direct { 100.0 } else { 300.0 });
        assert_eq!(&ways[..4], &[Way::Slots, Way::Direct, Way::Slots, Way::Direct]);
        let slots_later = ways[4..].iter().filter(|&&w| w == Way::Slots).count();
        assert_eq!(slots_later, 2, "only the exploring calls go the slower way: {ways:?}");
        // The machine changes: the direct read becomes slower; exploration notices.
        let last = calls(&mut t, k, 4 * EXPLORE, |w| if w == Way::Direct { 500.0 } else { 300.0 });
        let direct_late = last[2 * EXPLORE as usize..].iter().filter(|&&w| w == Way::Direct).count();
        assert_eq!(direct_late, 2, "back to the slots but for the exploring calls: {last:?}");
    }

    #[test]
    fn a_cold_first_call_does_not_decide() {
        let mut t = Tuner::default();
        let k = Key::new(1, 4 << 20);
        let first = std::cell::Cell::new(true);
        let ways = calls(&mut t, k, EXPLORE, |w| {
            // The first call faults its buffers in: five times a warm call.
            let cold = first.replace(false);
            match w {
                Way::Slots if cold => 5500.0,
                Way::Slots => 700.0,
                Way::Direct => 1000.0,
            }
        });
        assert!(ways[4..].iter().all(|&w| w == Way::Slots), "{ways:?}");
    }

    #[test]
    fn classes_are_apart() {
        let mut t = Tuner::default();
        let (a, b) = (Key::new(1, 1 << 20), Key::new(1, 1 << 16));
        assert_ne!(a, b);
        for _ in 0..4 {
            t.choose(a);
        }
        assert_eq!(t.choose(b), Way::Slots, "a fresh class starts with the slots");
    }
}
