//! Request counts for remote completion (the runtime's `wait_all`): per peer, the request AMs
//! this process sent to it (every path: the world's and every endpoint slot's) and the ones
//! from it whose handlers have returned. A count that one writer at a time updates (under the
//! lock of its ring, or by the slot's owner) uses a plain load and store: no locked
//! instruction on the message path.

use crate::Rank;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Adds `n` to a count that only the caller writes now.
#[inline(always)]
pub(crate) fn add_single(c: &AtomicU64, n: u64) {
    c.store(c.load(Ordering::Relaxed) + n, Ordering::Release);
}

/// One count per peer.
pub(crate) type PerPeer = Arc<[AtomicU64]>;

/// A fresh set of counts for `size` peers.
pub(crate) fn per_peer(size: u32) -> PerPeer {
    (0..size).map(|_| AtomicU64::new(0)).collect()
}

/// The counts of one fabric.
pub(crate) struct RequestCounts {
    /// Requests sent on the fabric's own paths, per destination.
    pub sent: PerPeer,
    /// Requests handled, per source (fabrics that count deliveries in one place: libfabric;
    /// shared memory counts per ring).
    #[cfg_attr(not(feature = "ofi"), allow(dead_code))]
    pub handled: PerPeer,
    /// Each endpoint slot's requests sent, per destination (kept after the slot closes: its
    /// requests were sent all the same).
    slots: Mutex<Vec<PerPeer>>,
}

impl RequestCounts {
    pub fn new(size: u32) -> Self {
        RequestCounts { sent: per_peer(size), handled: per_peer(size), slots: Mutex::new(Vec::new()) }
    }

    /// Counts for a new endpoint slot.
    pub fn slot(&self) -> PerPeer {
        let c = per_peer(self.sent.len() as u32);
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).push(c.clone());
        c
    }

    /// Requests sent to `dst` on every path.
    pub fn sent_to(&self, dst: Rank) -> u64 {
        let own = self.sent.get(dst as usize).map_or(0, |c| c.load(Ordering::Acquire));
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        own + slots.iter().filter_map(|s| s.get(dst as usize)).map(|c| c.load(Ordering::Acquire)).sum::<u64>()
    }
}
