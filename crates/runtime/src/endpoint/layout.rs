//! What each endpoint category allocates and how threads map onto it (pure bookkeeping, the
//! same on every fabric), and what that costs.

use super::{CqSharing, EndpointPolicy};

/// How `threads` endpoints of one rank map onto contexts, slots, queues and completion
/// structures under one policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The category (never [`EndpointPolicy::Auto`]).
    pub policy: EndpointPolicy,
    /// Completion-structure sharing.
    pub cq: CqSharing,
    /// Endpoints (threads).
    pub threads: usize,
    /// Fabric contexts (shared memory: slot inbox files; libfabric: domains).
    pub contexts: usize,
    /// Transmit slots allocated, per context.
    pub slots_per_context: Vec<usize>,
    /// Per endpoint: (context, slot within it).
    pub slot_of: Vec<(usize, usize)>,
    /// Software queues (posting lists); `Shared` has one for all.
    pub queues: usize,
    /// Completion structures (counters).
    pub cqs: usize,
    /// Per endpoint: its completion structure.
    pub cq_of: Vec<usize>,
}

impl Layout {
    /// The layout of `policy` for `threads` endpoints; `static_slots` is the pool size of
    /// [`EndpointPolicy::Static`].
    pub fn new(policy: EndpointPolicy, threads: usize, cq: CqSharing, static_slots: usize) -> Self {
        let t = threads.max(1);
        let (contexts, slots_per_context, slot_of): (usize, Vec<usize>, Vec<(usize, usize)>) = match policy {
            EndpointPolicy::Dedicated => (t, vec![1; t], (0..t).map(|i| (i, 0)).collect()),
            EndpointPolicy::TwoXDynamic => (1, vec![2 * t], (0..t).map(|i| (0, 2 * i)).collect()),
            EndpointPolicy::Dynamic | EndpointPolicy::Auto => (1, vec![t], (0..t).map(|i| (0, i)).collect()),
            EndpointPolicy::SharedDynamic => (1, vec![t.div_ceil(2)], (0..t).map(|i| (0, i / 2)).collect()),
            EndpointPolicy::Static => {
                let pool = static_slots.clamp(1, t);
                (1, vec![pool], (0..t).map(|i| (0, i % pool)).collect())
            }
            EndpointPolicy::Shared => (1, vec![1], vec![(0, 0); t]),
        };
        // One queue and one completion structure for everything is what `Shared` means.
        let cq = if policy == EndpointPolicy::Shared { CqSharing::All } else { cq };
        let cq_of: Vec<usize> = (0..t)
            .map(|i| match cq {
                CqSharing::PerThread => i,
                CqSharing::PerPair => i / 2,
                CqSharing::All => 0,
            })
            .collect();
        Layout {
            policy,
            cq,
            threads: t,
            contexts,
            slots_per_context,
            slot_of,
            queues: if policy == EndpointPolicy::Shared { 1 } else { t },
            cqs: cq_of.iter().max().map_or(0, |m| m + 1),
            cq_of,
        }
    }

    /// Slots allocated in all contexts.
    pub fn slots(&self) -> usize {
        self.slots_per_context.iter().sum()
    }

    /// Endpoints that post through slot `(context, slot)`.
    pub fn users_of(&self, at: (usize, usize)) -> usize {
        self.slot_of.iter().filter(|&&s| s == at).count()
    }

    /// Slots that more than one queue posts through (each needs a lock).
    pub fn locked_slots(&self) -> usize {
        if self.policy == EndpointPolicy::Shared {
            return 0; // the queue's lock covers its slot
        }
        (0..self.contexts)
            .flat_map(|c| (0..self.slots_per_context[c]).map(move |s| (c, s)))
            .filter(|&at| self.users_of(at) > 1)
            .count()
    }

    /// Locks on the posting path: shared slots, or the one shared queue.
    pub fn locks(&self) -> usize {
        if self.policy == EndpointPolicy::Shared {
            1
        } else {
            self.locked_slots()
        }
    }

    /// Slots allocated that no endpoint uses (`TwoXDynamic` leaves every other one idle).
    pub fn idle_slots(&self) -> usize {
        (0..self.contexts)
            .flat_map(|c| (0..self.slots_per_context[c]).map(move |s| (c, s)))
            .filter(|&at| self.users_of(at) == 0)
            .count()
    }

    /// Memory the layout costs this rank and its peers, in bytes, for a job of `ranks` ranks
    /// whose slot rings are `ring_bytes` each, with `queue_bytes` per software queue:
    /// every slot holds one ring in every rank's inbox; each context is a separate region
    /// rounded up to pages; each completion structure is a cache line.
    pub fn bytes(&self, ranks: usize, ring_bytes: usize, queue_bytes: usize) -> u64 {
        const PAGE: usize = 4096;
        let rings: usize =
            self.slots_per_context.iter().map(|&s| (s * ring_bytes).next_multiple_of(PAGE)).sum::<usize>()
                * ranks;
        rings as u64 + self.software_bytes(queue_bytes)
    }

    /// Bytes of the posting lists and completion lines alone (no slots).
    pub fn software_bytes(&self, queue_bytes: usize) -> u64 {
        (self.queues * queue_bytes + self.cqs * 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_allocate_what_the_paper_says() {
        let l = |p| Layout::new(p, 4, CqSharing::PerThread, 2);
        let d = l(EndpointPolicy::Dedicated);
        assert_eq!((d.contexts, d.slots(), d.queues, d.cqs, d.locks()), (4, 4, 4, 4, 0));
        let x = l(EndpointPolicy::TwoXDynamic);
        assert_eq!((x.contexts, x.slots(), x.idle_slots(), x.locks()), (1, 8, 4, 0));
        let y = l(EndpointPolicy::Dynamic);
        assert_eq!((y.contexts, y.slots(), y.locks()), (1, 4, 0));
        let sd = l(EndpointPolicy::SharedDynamic);
        assert_eq!((sd.slots(), sd.locked_slots(), sd.queues), (2, 2, 4));
        let st = l(EndpointPolicy::Static);
        assert_eq!((st.slots(), st.locked_slots(), st.slot_of[2]), (2, 2, (0, 0)));
        let sh = l(EndpointPolicy::Shared);
        assert_eq!((sh.slots(), sh.queues, sh.cqs, sh.locks()), (1, 1, 1, 1));
        let pair = Layout::new(EndpointPolicy::Dynamic, 5, CqSharing::PerPair, 4);
        assert_eq!((pair.cqs, pair.cq_of[4]), (3, 2));
        // Dedicated pays a page per context; Dynamic packs its rings into one region.
        assert!(d.bytes(2, 16 * 1024 + 64, 4096) > y.bytes(2, 16 * 1024 + 64, 4096));
        assert!(x.bytes(2, 16 * 1024, 4096) > y.bytes(2, 16 * 1024, 4096));
    }
}
