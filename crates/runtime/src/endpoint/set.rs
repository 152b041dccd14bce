//! Creating a rank's endpoints (collective over the world) and what they cost.

use super::ep::{Path, Slot};
use super::queue::{Cq, CqLine, Knobs, Queue};
use super::{auto, Endpoint, EndpointConfig, EndpointPolicy, Layout};
use crate::progress::Deps;
use crate::{Comm, Error, Result};
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use weft_fabric::{FabricError, LocalRegion};

/// The endpoints [`Comm::endpoints`] created on this rank, and what they cost. The
/// endpoints borrow the set ([`EndpointSet::endpoints`]), so they are all gone when it is
/// closed: [`EndpointSet::close`] (or dropping the set) is collective, like creating it, and
/// releases the receive paths on every rank.
pub struct EndpointSet<'c> {
    comm: &'c Comm,
    endpoints: Vec<Endpoint<'c>>,
    resources: EndpointResources,
    /// This rank's slot inboxes (receive side), released at close.
    inboxes: Vec<LocalRegion>,
    closed: bool,
}

/// What one rank's endpoints hold, for comparing categories (`weft info`, `weft bench
/// msgrate`).
#[derive(Clone, Debug, PartialEq)]
pub struct EndpointResources {
    /// The layout: category, contexts, slots (idle ones too), queues, completion structures,
    /// locks, and which endpoint uses which.
    pub layout: Layout,
    /// Bytes: slot rings in every rank's inboxes, posting lists, completion lines.
    pub bytes: u64,
    /// Set when the fabric has no transmit slots: endpoint AMs use the world's default path.
    pub fallback: Option<String>,
    /// What a transmit slot is on this fabric, as the fabric names it (shared memory: rings
    /// to every rank; libfabric: an endpoint or a scalable endpoint's transmit context, with
    /// its completion queue and staging memory); kinds that differ between slots are joined
    /// by `; `.
    pub slot_kind: Option<String>,
    /// [`EndpointPolicy::Auto`]: the rate measured for each category (operations/s).
    pub measured: Vec<(EndpointPolicy, f64)>,
}

impl EndpointResources {
    pub(super) fn new(layout: Layout, ranks: usize, cfg: &EndpointConfig) -> Self {
        EndpointResources {
            bytes: layout.bytes(ranks, ring_bytes(cfg), queue_bytes(cfg)),
            layout,
            fallback: None,
            slot_kind: None,
            measured: Vec::new(),
        }
    }
}

impl std::fmt::Display for EndpointResources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} × {}: {} contexts, {} slots ({} idle), {} queues, {} completion structures, {} locks, {} KiB",
            self.layout.policy.name(),
            self.layout.threads,
            self.layout.contexts,
            self.layout.slots(),
            self.layout.idle_slots(),
            self.layout.queues,
            self.layout.cqs,
            self.layout.locks(),
            self.bytes.div_ceil(1024)
        )?;
        if let Some(why) = &self.fallback {
            write!(f, " (AMs on the default path: {why})")?;
        }
        Ok(())
    }
}

/// Bytes of one slot's ring to one rank (the control line plus the slots).
fn ring_bytes(cfg: &EndpointConfig) -> usize {
    cfg.ring_kib * 1024 + 64
}

/// Bytes of one posting list: descriptors, inline arena, argument words.
pub(super) fn queue_bytes(cfg: &EndpointConfig) -> usize {
    cfg.postlist * (std::mem::size_of::<super::queue::Desc>() + cfg.inline_max.max(8) + 16 * 8)
}

impl<'c> EndpointSet<'c> {
    /// What the endpoints hold.
    pub fn resources(&self) -> &EndpointResources {
        &self.resources
    }
    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }
    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }
    /// The endpoints, in index order, to hand one to each thread (a second call returns
    /// none). They borrow the set, which outlives them.
    pub fn endpoints(&mut self) -> Vec<Endpoint<'_>> {
        std::mem::take(&mut self.endpoints)
    }

    /// Takes the endpoints out for as long as the world lives rather than a borrow of the
    /// set: for a library whose users make and end communication paths at run time (the
    /// OpenSHMEM library keeps one in each context handle). The caller flushes and drops them
    /// before [`EndpointSet::close`]: close flushes only the endpoints still in the set, and
    /// an endpoint used after it posts to receive paths that are gone (its operations fail
    /// or are lost).
    ///
    /// ```no_run
    /// # use weft_runtime::{EndpointConfig, EndpointPolicy, World};
    /// let world = World::init()?;
    /// let mut set = world.endpoints(&EndpointConfig::new(EndpointPolicy::Dynamic, 4))?;
    /// let mut pool = set.lend(); // borrows the world, not `set`: kept beside it
    /// let mut ep = pool.pop().expect("4 endpoints");
    /// ep.sync_nbi()?;
    /// drop((ep, pool));
    /// set.close()?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn lend(&mut self) -> Vec<Endpoint<'c>> {
        std::mem::take(&mut self.endpoints)
    }

    /// Flushes the endpoints still in the set, waits until every rank has stopped posting
    /// (a barrier), delivers what is still in this rank's receive paths and releases them.
    /// Collective over the world.
    pub fn close(mut self) -> Result<()> {
        self.close_now()
    }

    fn close_now(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.closed, true) {
            return Ok(());
        }
        let mut first_err = None;
        for mut ep in self.endpoints.drain(..) {
            if let Err(e) = ep.sync_nbi() {
                first_err.get_or_insert(e);
            }
        }
        self.comm.barrier()?;
        let fabric = &self.comm.fabric;
        for region in self.inboxes.drain(..) {
            if let Err(e) = self
                .comm
                .wait_fabric(Deps::AnyDead, "closing an endpoint set", || fabric.close_slot_inbox(&region))
            {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

impl Drop for EndpointSet<'_> {
    /// Closes the set (collective); an error is recorded on the world.
    fn drop(&mut self) {
        if let Err(e) = self.close_now() {
            self.comm.record_error(e);
        }
    }
}

/// Builds the endpoints of `layout` over `slots[context][slot]`.
pub(super) fn build<'c>(
    comm: &'c Comm,
    layout: &Layout,
    knobs: Knobs,
    slots: Vec<Vec<Slot>>,
) -> Vec<Endpoint<'c>> {
    let users = |at| layout.users_of(at);
    let cq_users = |c| layout.cq_of.iter().filter(|&&x| x == c).count();
    let cq_lines: Vec<Option<Arc<CqLine>>> =
        (0..layout.cqs).map(|c| (cq_users(c) > 1).then(|| Arc::new(CqLine::default()))).collect();
    let cq = |i: usize| match &cq_lines[layout.cq_of[i]] {
        Some(line) => Cq::Shared(line.clone()),
        None => Cq::Own(0),
    };
    // Whether each slot carries puts, known before the slots move into their paths.
    let rma: Vec<Vec<bool>> = slots
        .iter()
        .map(|c| c.iter().map(|s| s.as_ref().is_some_and(|s| s.carries_rma())).collect())
        .collect();
    let mut slots: Vec<Vec<Option<Slot>>> =
        slots.into_iter().map(|c| c.into_iter().map(Some).collect()).collect();
    let mut shared: Vec<Vec<Option<Arc<Mutex<Slot>>>>> = slots.iter().map(|c| vec![None; c.len()]).collect();
    let one_queue = (layout.policy == EndpointPolicy::Shared).then(|| {
        let q = Queue::with_capacity(knobs.postlist, rma[0][0]);
        Arc::new(Mutex::new((q, slots[0][0].take().flatten())))
    });
    (0..layout.threads)
        .map(|i| {
            let (c, s) = layout.slot_of[i];
            let path = if let Some(q) = &one_queue {
                Path::SharedQueue(q.clone())
            } else if users((c, s)) > 1 {
                let m =
                    shared[c][s].get_or_insert_with(|| Arc::new(Mutex::new(slots[c][s].take().flatten())));
                Path::SharedSlot(Queue::with_capacity(knobs.postlist, rma[c][s]), m.clone())
            } else {
                Path::Own(Queue::with_capacity(knobs.postlist, rma[c][s]), slots[c][s].take().flatten())
            };
            Endpoint {
                comm,
                index: i,
                policy: layout.policy,
                path,
                cq: cq(i),
                knobs,
                last: None,
                _one_thread: PhantomData,
            }
        })
        .collect()
}

/// First byte of each exchange message during creation.
const OK: u8 = 0;
const UNSUPPORTED: u8 = 1;
const FAILED: u8 = 2;

/// Checks every rank's status byte: all ranks fail together (with the first failure's text).
fn agree(all: &[Vec<u8>]) -> Result<bool> {
    let mut unsupported = false;
    for (r, m) in all.iter().enumerate() {
        match m.first() {
            Some(&OK) => {}
            Some(&UNSUPPORTED) => unsupported = true,
            _ => {
                let why = String::from_utf8_lossy(m.get(1..).unwrap_or_default());
                return Err(Error::Remote(format!("rank {r} could not create its endpoints: {why}")));
            }
        }
    }
    Ok(unsupported)
}

fn status<T>(r: &std::result::Result<T, FabricError>) -> Vec<u8> {
    match r {
        Ok(_) => vec![OK],
        Err(FabricError::Unsupported { .. }) => vec![UNSUPPORTED],
        Err(e) => [&[FAILED][..], e.to_string().as_bytes()].concat(),
    }
}

impl Comm {
    /// Creates `cfg.threads` endpoints on this rank under `cfg.policy`. Collective: every
    /// rank of the world calls it (with its own configuration; thread counts may differ),
    /// because each rank's slots need receive paths on every other rank. Where the fabric
    /// has no transmit slots, the endpoints' AMs travel on the world's default path and
    /// [`EndpointResources::fallback`] says so.
    pub fn endpoints(&self, cfg: &EndpointConfig) -> Result<EndpointSet<'_>> {
        cfg.check()?;
        let (policy, measured) = auto::resolve(self, cfg)?;
        let layout = Layout::new(policy, cfg.threads, cfg.cq, cfg.static_slots);
        let knobs = cfg.knobs();
        let n = self.size() as usize;
        // Every rank's slot count per context.
        let mine: Vec<u8> = layout.slots_per_context.iter().flat_map(|&s| (s as u32).to_le_bytes()).collect();
        let counts: Vec<Vec<u32>> = self
            .exchange(&mine)?
            .iter()
            .map(|m| m.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            .collect();
        let contexts = counts.iter().map(Vec::len).max().unwrap_or(0);
        let per_context: Vec<Vec<u32>> =
            (0..contexts).map(|k| counts.iter().map(|c| c.get(k).copied().unwrap_or(0)).collect()).collect();
        // Receive side: one slot inbox per context, then everyone's descriptors.
        let ring = ring_bytes(cfg) - 64;
        let opened = self.open_inboxes(&per_context, ring);
        let mut msg = status(&opened);
        if let Ok(regions) = &opened {
            for r in regions {
                msg.extend_from_slice(&(r.desc.len() as u32).to_le_bytes());
                msg.extend_from_slice(&r.desc);
            }
        }
        let all = self.exchange(&msg)?;
        let release = |e: Error| {
            for r in opened.iter().flatten() {
                let _ = self.fabric.close_slot_inbox(r);
            }
            e
        };
        let unsupported = agree(&all).map_err(release)?;
        let mut slots: Vec<Vec<Slot>> = Vec::new();
        let mut fallback = None;
        if unsupported {
            fallback = Some("the fabric has no endpoint transmit slots".to_string());
            slots = layout.slots_per_context.iter().map(|&s| (0..s).map(|_| None).collect()).collect();
        } else {
            let descs: Vec<Vec<Vec<u8>>> =
                all.iter().map(|m| split_descs(&m[1..])).collect::<Result<_>>().map_err(release)?;
            let mut failed = None;
            for (k, &count) in layout.slots_per_context.iter().enumerate() {
                let inboxes: Vec<Vec<u8>> =
                    descs.iter().map(|d| d.get(k).cloned().unwrap_or_default()).collect();
                match self.fabric.open_tx_slots(&inboxes, &per_context[k], 0, count as u32) {
                    Ok(s) => slots.push(s.into_iter().map(Some).collect()),
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            // Everyone attached (or failed): the inboxes can be sealed.
            let all = self.exchange(&status(&failed.map_or(Ok(()), Err)))?;
            for r in opened.iter().flatten() {
                self.fabric.seal(r)?;
            }
            if let Err(e) = agree(&all) {
                drop(slots);
                return Err(release(e));
            }
        }
        let inboxes = opened.unwrap_or_default();
        let mut resources = EndpointResources::new(layout.clone(), n, cfg);
        let opened_slots: Vec<_> = slots.iter().flatten().flatten().map(|s| s.resources()).collect();
        let mut kinds: Vec<String> = vec![];
        for r in &opened_slots {
            if !kinds.contains(&r.kind) {
                kinds.push(r.kind.clone());
            }
        }
        resources.slot_kind = (!kinds.is_empty()).then(|| kinds.join("; "));
        if !self.caps.load_store && !opened_slots.is_empty() {
            // Network slots are what the fabric allocated, not rings: count what it reports.
            resources.bytes =
                layout.software_bytes(queue_bytes(cfg)) + opened_slots.iter().map(|r| r.bytes).sum::<u64>();
        }
        resources.fallback = fallback;
        resources.measured = measured;
        Ok(EndpointSet {
            comm: self,
            endpoints: build(self, &layout, knobs, slots),
            resources,
            inboxes,
            closed: false,
        })
    }
}

impl Comm {
    /// Opens one slot inbox per context; on a failure releases those already opened (they
    /// are empty: nobody has their descriptors yet).
    fn open_inboxes(
        &self,
        per_context: &[Vec<u32>],
        ring: usize,
    ) -> std::result::Result<Vec<LocalRegion>, FabricError> {
        let mut opened = Vec::with_capacity(per_context.len());
        for slots in per_context {
            match self.fabric.open_slot_inbox(slots, ring) {
                Ok(r) => opened.push(r),
                Err(e) => {
                    for r in &opened {
                        let _ = self.fabric.close_slot_inbox(r);
                    }
                    return Err(e);
                }
            }
        }
        Ok(opened)
    }
}

/// Splits length-prefixed descriptors.
fn split_descs(mut b: &[u8]) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        let bad = || Error::Remote("malformed endpoint descriptor list".into());
        let len = u32::from_le_bytes(b.get(..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?) as usize;
        out.push(b.get(4..4 + len).ok_or_else(bad)?.to_vec());
        b = &b[4 + len..];
    }
    Ok(out)
}
