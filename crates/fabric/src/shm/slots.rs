//! Endpoint transmit slots on shared memory.
//!
//! A slot is one single-producer ring per destination, owned by one sender (the runtime's
//! endpoint, or a group of them under the runtime's lock). The rings of every rank's slots
//! towards rank `r` live in one *slot inbox* region that `r` registers, ordered by source rank
//! and then slot index, so `r` polls them from its own memory as it polls its default rings.
//! Several slot inboxes may exist (one per endpoint context); each is a separate file and
//! mapping, which is what a context costs on this fabric.

use super::bias::Bias;
use super::control::Control;
use super::ring::{self, Body, RingPtr, Sender};
use super::{body_for, max_medium_for, ring_doorbell, Inbound};
use crate::os::Mapping;
use crate::{AmClass, AmOut, FabricError, FabricResult, Rank, Resource, TxSlot};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

/// Most slot inboxes (endpoint contexts) one rank holds.
pub const MAX_SLOT_INBOXES: usize = 256;
/// Most rings in one slot inbox (slots of all ranks together).
pub const MAX_SLOT_RINGS: usize = 16 * 1024;

/// Bytes of a slot inbox descriptor: the region's (id, len), then the ring depth in slots.
const DESC_BYTES: usize = 16;

/// One slot inbox: rings from `(source, slot)` pairs in that order.
pub(super) struct SlotInbox {
    _map: Arc<Mapping>,
    pub rings: Vec<(Rank, Inbound)>,
    /// Bytes of the rings.
    pub bytes: u64,
}

/// The slot inboxes of this rank. Pollers take the read lock only when there is at least one
/// inbox (`count`), so a world without endpoint sets pays one load per poll.
pub(super) struct SlotInboxes {
    list: RwLock<Vec<(u32, SlotInbox)>>,
    count: AtomicUsize,
    /// The slot doorbell value of the last complete scan.
    seen: AtomicU32,
    /// Requests handled by inboxes since removed, per source: the counts outlive them (a
    /// sender's counts of what it sent through the slots do).
    closed: std::sync::Mutex<Vec<(Rank, u64)>>,
}

impl SlotInboxes {
    pub fn new() -> Self {
        SlotInboxes {
            list: RwLock::new(Vec::new()),
            count: AtomicUsize::new(0),
            seen: AtomicU32::new(0),
            closed: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// Delivers from the slot inboxes with `drain` if the doorbell `bell` moved since the
    /// last scan that left nothing behind (senders ring it after each batch): idle pollers
    /// then pay two loads, inline, and no lock. Returns what `drain` delivered.
    #[inline]
    pub fn poll(
        &self,
        bell: &AtomicU32,
        drain: impl FnMut(&Inbound, Rank) -> FabricResult<usize>,
    ) -> FabricResult<usize> {
        let now = bell.load(Ordering::Acquire);
        if self.count.load(Ordering::Acquire) == 0 || self.seen.load(Ordering::Relaxed) == now {
            return Ok(0);
        }
        self.scan(now, drain)
    }

    /// The part of [`SlotInboxes::poll`] after the bell moved to `now`.
    #[inline(never)]
    fn scan(
        &self,
        now: u32,
        mut drain: impl FnMut(&Inbound, Rank) -> FabricResult<usize>,
    ) -> FabricResult<usize> {
        self.seen.store(now, Ordering::Relaxed);
        let (n, left) = self.with(Ok((0, false)), |inboxes| {
            let mut n = 0;
            for (_, inbox) in inboxes {
                for (src, inbound) in &inbox.rings {
                    n += drain(inbound, *src)?;
                }
            }
            let left = inboxes.iter().any(|(_, i)| i.rings.iter().any(|(_, r)| r.ready()));
            Ok::<_, FabricError>((n, left))
        })?;
        if left {
            // More than one scan's worth (or a ring busy in another thread): scan again.
            self.seen.store(now.wrapping_sub(1), Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Runs `f` on the inboxes (none: no lock taken).
    /// Requests handled from `src`'s slots, those of removed inboxes included.
    pub fn handled_from(&self, src: Rank) -> u64 {
        let closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        let gone = closed.iter().find(|(s, _)| *s == src).map_or(0, |(_, n)| *n);
        drop(closed);
        gone + self.with(0, |l| {
            l.iter()
                .flat_map(|(_, i)| i.rings.iter())
                .filter(|(s, _)| *s == src)
                .map(|(_, r)| r.handled())
                .sum()
        })
    }

    pub fn with<R>(&self, empty: R, f: impl FnOnce(&[(u32, SlotInbox)]) -> R) -> R {
        if self.count.load(Ordering::Acquire) == 0 {
            return empty;
        }
        f(&self.list.read().unwrap_or_else(|e| e.into_inner()))
    }

    fn push(&self, region: u32, inbox: SlotInbox) -> FabricResult<()> {
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        if l.len() == MAX_SLOT_INBOXES {
            return Err(FabricError::Limit {
                what: "endpoint contexts (slot inboxes) per rank",
                asked: l.len() + 1,
                max: MAX_SLOT_INBOXES,
            });
        }
        l.push((region, inbox));
        self.count.store(l.len(), Ordering::Release);
        Ok(())
    }

    /// Removes the inbox of region `region` if nothing waits in it; `Ok(false)` while
    /// messages remain (deliver them and ask again).
    pub fn remove(&self, region: u32, bias: &Bias) -> FabricResult<bool> {
        let mut l = self.list.write().unwrap_or_else(|e| e.into_inner());
        let Some(at) = l.iter().position(|(r, _)| *r == region) else {
            return Err(FabricError::Malformed { what: format!("region {region} is no slot inbox") });
        };
        if l[at].1.rings.iter().any(|(_, r)| r.rx.try_lock(bias).is_none_or(|rx| rx.ready())) {
            return Ok(false);
        }
        let (_, inbox) = l.swap_remove(at);
        self.count.store(l.len(), Ordering::Release);
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        for (src, ring) in &inbox.rings {
            match closed.iter_mut().find(|(s, _)| s == src) {
                Some((_, n)) => *n += ring.handled(),
                None => closed.push((*src, ring.handled())),
            }
        }
        Ok(true)
    }
}

/// Checks the per-source slot counts of a slot inbox set; returns the total ring count.
pub(super) fn total_rings(slots: &[u32], size: u32) -> FabricResult<usize> {
    if slots.len() != size as usize {
        return Err(FabricError::Mismatch {
            what: format!("slot counts for {} ranks in a job of {size}", slots.len()),
        });
    }
    let total: usize = slots.iter().map(|&s| s as usize).sum();
    if total > MAX_SLOT_RINGS {
        return Err(FabricError::Limit {
            what: "endpoint slot rings per inbox",
            asked: total,
            max: MAX_SLOT_RINGS,
        });
    }
    Ok(total)
}

/// Bytes of a slot inbox of `total` rings of `depth` slots (never empty: a region has a size).
pub(super) fn inbox_bytes(total: usize, depth: usize) -> usize {
    (total * ring::ring_bytes(depth)).max(ring::SLOT)
}

/// Builds the receive side of a freshly registered slot inbox and publishes it to pollers.
pub(super) fn add_inbox(
    inboxes: &SlotInboxes,
    region: u32,
    map: Arc<Mapping>,
    slots: &[u32],
    depth: usize,
) -> FabricResult<()> {
    let rb = ring::ring_bytes(depth);
    let mut rings = Vec::new();
    for (src, &n) in slots.iter().enumerate() {
        for _ in 0..n {
            let at = rings.len() * rb;
            // SAFETY: the region holds inbox_bytes(total, depth) bytes (registered by the
            // caller with that size), so ring k lies at k * rb inside it, 64-aligned (the
            // mapping is page-aligned and rb is a multiple of 64); `map` is kept alive by the
            // inbox as long as the rings are polled.
            let ptr = unsafe { RingPtr::new(map.as_ptr().add(at), depth) };
            rings.push((src as Rank, Inbound::new(ptr, max_medium_for(depth))));
        }
    }
    let bytes = (rings.len() * rb) as u64;
    inboxes.push(region, SlotInbox { _map: map, rings, bytes })
}

/// Appends the ring depth to a region descriptor.
pub(super) fn inbox_desc(region_desc: &[u8], depth: usize) -> Vec<u8> {
    let mut d = region_desc.to_vec();
    d.extend_from_slice(&(depth as u32).to_le_bytes());
    d
}

/// Splits a slot inbox descriptor into the region's descriptor and the ring depth.
pub(super) fn split_desc(rank: Rank, d: &[u8]) -> FabricResult<(&[u8], usize)> {
    let depth = match d {
        [.., a, b, c, e] if d.len() == DESC_BYTES => u32::from_le_bytes([*a, *b, *c, *e]) as usize,
        _ => 0,
    };
    if !depth.is_power_of_two() || depth < 64 {
        return Err(FabricError::Malformed {
            what: format!("slot inbox descriptor of {} bytes from rank {rank}", d.len()),
        });
    }
    Ok((&d[..DESC_BYTES - 4], depth))
}

/// One endpoint slot: a ring to every rank in that rank's slot inbox.
pub(super) struct ShmTxSlot {
    senders: Vec<Sender>,
    max_medium: Vec<usize>,
    /// Each destination's inbox (its control block rings the doorbell).
    controls: Vec<Arc<Mapping>>,
    /// The slot inboxes the rings live in.
    _rings: Vec<Arc<Mapping>>,
    /// Destinations posted to since the last doorbell.
    posted: Vec<Rank>,
    bytes: u64,
    /// Requests sent per destination (this slot's owner is their one writer).
    sent: crate::counts::PerPeer,
}

impl ShmTxSlot {
    /// `rings[r]` = (rank r's slot inbox mapping, its depth, this slot's ring index in it).
    pub fn new(
        controls: Vec<Arc<Mapping>>,
        rings: Vec<(Arc<Mapping>, usize, usize)>,
        sent: crate::counts::PerPeer,
    ) -> FabricResult<Self> {
        let mut senders = Vec::with_capacity(rings.len());
        let mut max_medium = Vec::with_capacity(rings.len());
        let mut bytes = 0;
        for (map, depth, index) in &rings {
            let rb = ring::ring_bytes(*depth);
            let at = index * rb;
            if at + rb > map.len() {
                return Err(FabricError::OutOfBounds { offset: at, len: rb, region_len: map.len() });
            }
            // SAFETY: ring `index` lies inside the mapping (checked above), 64-aligned, and the
            // mapping is kept alive by this slot.
            senders.push(Sender::new(unsafe { RingPtr::new(map.as_ptr().add(at), *depth) }));
            max_medium.push(max_medium_for(*depth));
            bytes += rb as u64;
        }
        let _rings = rings.into_iter().map(|(m, ..)| m).collect();
        Ok(ShmTxSlot { senders, max_medium, controls, _rings, posted: Vec::new(), bytes, sent })
    }
}

impl TxSlot for ShmTxSlot {
    fn am_try_send(&mut self, dst: Rank, msg: &AmOut<'_>) -> FabricResult<bool> {
        let Some(sender) = self.senders.get_mut(dst as usize) else {
            return Err(FabricError::Peer {
                rank: dst,
                reason: format!("does not exist (job of {})", self.controls.len()),
            });
        };
        if msg.class != AmClass::Request {
            return Err(FabricError::Malformed { what: "a reply posted on an endpoint slot".into() });
        }
        let body: Body<'_> = body_for(dst, msg, self.max_medium[dst as usize])?;
        let sent = sender.try_send(msg.handler, msg.args, body)?;
        if sent {
            crate::counts::add_single(&self.sent[dst as usize], 1);
            if !self.posted.contains(&dst) {
                self.posted.push(dst);
            }
        }
        Ok(sent)
    }

    fn doorbell(&mut self) {
        for d in self.posted.drain(..) {
            // SAFETY: every inbox starts with an initialised control block and stays mapped
            // while this slot holds it.
            let c = unsafe { Control::at(self.controls[d as usize].as_ptr()) };
            // After the ring writes (release): a poller that sees the bell move sees them.
            c.slot_bell().fetch_add(1, Ordering::Release);
            ring_doorbell(c);
        }
    }

    fn resources(&self) -> Resource {
        Resource {
            kind: "one ring to each rank, in its slot inbox".into(),
            count: self.senders.len() as u64,
            bytes: self.bytes,
        }
    }
}
