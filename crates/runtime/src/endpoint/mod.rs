//! Scalable endpoints: every thread communicates through its own [`Endpoint`], and the
//! program (or weft, with [`EndpointPolicy::Auto`]) chooses how much the endpoints share,
//! after Zambre, Chandramowliswaran and Balaji, "Scalable Communication Endpoints for
//! MPI+Threads Applications" (ICPADS 2018).
//!
//! An endpoint is a *queue* (the thread's posting list), a *transmit slot* it publishes to
//! (shared memory: one ring per destination; libfabric: an endpoint or a scalable endpoint's
//! transmit context), a *completion structure* (a counter) and the *context* they live in
//! (shared memory: a slot inbox file per peer; libfabric: a domain). The six categories of
//! the paper are the [`EndpointPolicy`] variants; completion sharing is [`CqSharing`]; the
//! per-endpoint features are the paper's Postlist, Unsignaled completions and Inline.
//!
//! ```no_run
//! # use weft_runtime as weft;
//! use weft::{EndpointConfig, EndpointPolicy, World};
//! let world = World::init()?;
//! let seg = world.alloc_segment::<u64>(64)?;
//! let mut set = world.endpoints(&EndpointConfig::new(EndpointPolicy::Dynamic, 2))?;
//! println!("{}", set.resources());
//! std::thread::scope(|s| {
//!     for mut ep in set.endpoints() {
//!         let seg = &seg;
//!         s.spawn(move || -> weft::Result<()> {
//!             let i = ep.index();
//!             ep.put_nbi(seg.at(0, i * 8), &[i as u64])?;
//!             ep.sync_nbi()
//!         });
//!     }
//! });
//! set.close()?; // collective: every rank's endpoints are done
//! # Ok::<(), weft_runtime::Error>(())
//! ```

mod auto;
mod ep;
mod layout;
mod queue;
mod set;

pub use ep::Endpoint;
pub use layout::Layout;
pub use set::{EndpointResources, EndpointSet};

/// How much the endpoints of one rank share: the six categories of Zambre et al., from
/// everything private to one locked queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EndpointPolicy {
    /// A separate context per thread, nothing shared (the paper's "MPI everywhere").
    Dedicated,
    /// One context, twice as many transmit slots as threads, each thread using every other
    /// one (the paper's 2xDynamic).
    TwoXDynamic,
    /// One context, one transmit slot per thread.
    Dynamic,
    /// One context; pairs of threads keep separate queues but share a transmit slot, which
    /// they publish to under a lock.
    SharedDynamic,
    /// One context; queues are assigned round-robin to a fixed pool of slots
    /// ([`EndpointConfig::static_slots`]), slots with several queues used under a lock.
    Static,
    /// One queue, one slot and one completion structure for all threads, under one lock
    /// (the paper's "MPI+threads").
    Shared,
    /// weft measures the categories at creation and takes the cheapest one within
    /// [`EndpointConfig::tolerance`] of the fastest.
    Auto,
}

impl EndpointPolicy {
    /// The six concrete categories, from least to most sharing.
    pub const CATEGORIES: [EndpointPolicy; 6] = [
        EndpointPolicy::Dedicated,
        EndpointPolicy::TwoXDynamic,
        EndpointPolicy::Dynamic,
        EndpointPolicy::SharedDynamic,
        EndpointPolicy::Static,
        EndpointPolicy::Shared,
    ];

    /// Short name, as used by the benchmarks and `WEFT_ENDPOINTS`.
    pub fn name(self) -> &'static str {
        match self {
            EndpointPolicy::Dedicated => "dedicated",
            EndpointPolicy::TwoXDynamic => "2xdynamic",
            EndpointPolicy::Dynamic => "dynamic",
            EndpointPolicy::SharedDynamic => "shared-dynamic",
            EndpointPolicy::Static => "static",
            EndpointPolicy::Shared => "shared",
            EndpointPolicy::Auto => "auto",
        }
    }

    /// Parses [`EndpointPolicy::name`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::CATEGORIES.into_iter().chain([EndpointPolicy::Auto]).find(|p| p.name() == s)
    }
}

/// Which endpoints share a completion structure (independent of the policy, except that
/// [`EndpointPolicy::Shared`] always has one for all).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CqSharing {
    /// One per endpoint.
    PerThread,
    /// One per pair of endpoints.
    PerPair,
    /// One for all endpoints of the rank.
    All,
}

/// Largest inline payload an endpoint stages in its posting list.
pub const INLINE_LIMIT: usize = 256;

/// What [`crate::Comm::endpoints`] creates.
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointConfig {
    /// The sharing category.
    pub policy: EndpointPolicy,
    /// Endpoints to create on this rank (one per thread that communicates).
    pub threads: usize,
    /// Completion-structure sharing (default: one per endpoint).
    pub cq: CqSharing,
    /// Operations posted per publish (Postlist); 1 publishes every operation at once.
    pub postlist: usize,
    /// One signaled completion per this many operations (Unsignaled); 1 signals every one.
    pub signal_every: usize,
    /// Payloads up to this many bytes are copied into the posting list (Inline); larger ones
    /// are sent from the caller's memory at once, and [`Endpoint::put_from_nbi`] always sends
    /// from registered memory. At most [`INLINE_LIMIT`]; 0 turns Inline off.
    pub inline_max: usize,
    /// Slot pool of [`EndpointPolicy::Static`].
    pub static_slots: usize,
    /// Depth of each slot's ring to each rank, KiB.
    pub ring_kib: usize,
    /// [`EndpointPolicy::Auto`]: a category qualifies within this fraction of the fastest.
    pub tolerance: f64,
}

impl EndpointConfig {
    /// `threads` endpoints of category `policy`, with the paper's default features: postlist
    /// 32, one signaled completion per 64 operations, 64-byte inline payloads.
    pub fn new(policy: EndpointPolicy, threads: usize) -> Self {
        EndpointConfig {
            policy,
            threads,
            cq: CqSharing::PerThread,
            postlist: 32,
            signal_every: 64,
            inline_max: 64,
            static_slots: 4,
            ring_kib: 64,
            tolerance: 0.05,
        }
    }
    /// Sets the completion sharing.
    pub fn cq(mut self, cq: CqSharing) -> Self {
        self.cq = cq;
        self
    }
    /// Sets the postlist size (1 = off).
    pub fn postlist(mut self, n: usize) -> Self {
        self.postlist = n;
        self
    }
    /// Sets the unsignaled-completion interval (1 = off).
    pub fn signal_every(mut self, n: usize) -> Self {
        self.signal_every = n;
        self
    }
    /// Sets the inline threshold (0 = off).
    pub fn inline_max(mut self, bytes: usize) -> Self {
        self.inline_max = bytes;
        self
    }
    /// Sets the slot pool of [`EndpointPolicy::Static`].
    pub fn static_slots(mut self, n: usize) -> Self {
        self.static_slots = n;
        self
    }
    /// Sets the ring depth per slot and destination, KiB.
    pub fn ring_kib(mut self, kib: usize) -> Self {
        self.ring_kib = kib;
        self
    }
    /// Sets [`EndpointPolicy::Auto`]'s tolerance (a fraction: 0.05 = 5%).
    pub fn tolerance(mut self, t: f64) -> Self {
        self.tolerance = t;
        self
    }

    /// The per-endpoint features as the posting path uses them.
    fn knobs(&self) -> queue::Knobs {
        queue::Knobs {
            postlist: self.postlist,
            signal_every: self.signal_every as u64,
            inline_max: self.inline_max,
        }
    }

    pub(crate) fn check(&self) -> crate::Result<()> {
        let bad = |what: String| Err(crate::Error::Config(what));
        if self.threads == 0 || self.threads > 4096 {
            return bad(format!("{} endpoints: expected 1 to 4096", self.threads));
        }
        if self.postlist == 0 || self.signal_every == 0 {
            return bad("postlist and signal_every must be at least 1".into());
        }
        if self.inline_max > INLINE_LIMIT {
            return bad(format!("inline threshold {} B: at most {INLINE_LIMIT}", self.inline_max));
        }
        if !(4..=16 * 1024).contains(&self.ring_kib) {
            return bad(format!("endpoint ring of {} KiB: expected 4 to 16384", self.ring_kib));
        }
        if !(0.0..1.0).contains(&self.tolerance) {
            return bad(format!("tolerance {}: expected a fraction in [0, 1)", self.tolerance));
        }
        Ok(())
    }
}
