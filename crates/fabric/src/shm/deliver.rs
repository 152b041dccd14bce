//! Delivery from the rings of this rank's inbox: each ring's consumer under its lock, the
//! batch of handlers, the count of requests handled (for the runtime's `wait_all`).

use super::ring::{Body, Receiver, RingPtr};
use super::spin::SpinLock;
use super::{class_index, ShmFabric};
use crate::{AmClass, AmIn, AmInPayload, EventSink, FabricError, FabricResult, Rank};
use std::sync::atomic::{AtomicU64, Ordering};

/// One ring of our inbox: the consumer under a lock, plus what a poller needs to peek at it
/// without taking the lock (idle polls then cost one load per ring).
pub(super) struct Inbound {
    ring: RingPtr,
    head: AtomicU64,
    pub(super) rx: SpinLock<Receiver>,
    /// Requests from this ring whose handlers have returned (written under `rx`).
    handled: AtomicU64,
}

impl Inbound {
    pub(super) fn new(ring: RingPtr, max_medium: usize) -> Self {
        let rx = SpinLock::new(Receiver::new(ring, max_medium));
        Inbound { ring, head: AtomicU64::new(0), rx, handled: AtomicU64::new(0) }
    }
    /// Requests handled from this ring.
    pub(super) fn handled(&self) -> u64 {
        self.handled.load(Ordering::Acquire)
    }
    #[inline]
    pub(super) fn ready(&self) -> bool {
        self.ring.ready_at(self.head.load(Ordering::Relaxed))
    }
}

impl ShmFabric {
    /// Delivers what waits in the `class` ring of every source.
    #[inline]
    pub(super) fn drain_class(&self, class: AmClass, sink: &dyn EventSink) -> FabricResult<usize> {
        let mut delivered = 0;
        for (src, rings) in self.receivers.iter().enumerate() {
            delivered += self.drain(&rings[class_index(class)], src as Rank, class, sink)?;
        }
        Ok(delivered)
    }

    /// Delivers up to 64 messages from one ring (bounded so that one busy sender cannot
    /// starve the others). An idle ring costs one load, inline in the poll loop; only a ring
    /// with a message waiting pays for the call that delivers (idle polls are most of a
    /// waiting thread's loop, and every instruction there delays the next detection).
    #[inline]
    pub(super) fn drain(
        &self,
        inbound: &Inbound,
        src: Rank,
        class: AmClass,
        sink: &dyn EventSink,
    ) -> FabricResult<usize> {
        if !inbound.ready() {
            return Ok(0);
        }
        self.deliver(inbound, src, class, sink)
    }

    /// The part of [`ShmFabric::drain`] for a ring with a message waiting.
    #[inline(never)]
    fn deliver(
        &self,
        inbound: &Inbound,
        src: Rank,
        class: AmClass,
        sink: &dyn EventSink,
    ) -> FabricResult<usize> {
        let Some(mut rx) = inbound.rx.try_lock(&self.bias) else {
            return Ok(0);
        };
        let delivered = rx.recv(64, |m| {
            let payload = match m.body {
                Body::Short => AmInPayload::Short,
                Body::Medium(p) => AmInPayload::Medium(p),
                Body::Long { region, offset, len } => self.long_payload(src, region, offset, len)?,
            };
            sink.on_am(AmIn { src, handler: m.handler, class, args: m.args, payload });
            Ok(())
        });
        // Pollers peek at the ring through this copy of the head (also after an error: the
        // bad message was consumed).
        inbound.head.store(rx.head(), Ordering::Relaxed);
        if let (AmClass::Request, Ok(n)) = (class, &delivered) {
            // Still under the consumer's lock: the one writer.
            crate::counts::add_single(&inbound.handled, *n as u64);
        }
        delivered
    }

    /// The payload of a long AM: bytes already written to one of our regions.
    #[inline(never)]
    fn long_payload(&self, src: Rank, region: u32, offset: u64, len: u64) -> FabricResult<AmInPayload<'_>> {
        match self.local_bytes(region, offset, len) {
            Some(data) => Ok(AmInPayload::Long { region, offset: offset as usize, data }),
            None => Err(FabricError::Malformed {
                what: format!("long AM from rank {src} names {len} bytes at {offset} of region {region}"),
            }),
        }
    }

    /// Bytes of a local region, for long AMs; `None` if the range is not inside one.
    fn local_bytes(&self, region: u32, offset: u64, len: u64) -> Option<&[u8]> {
        let regions = self.local_regions.read().unwrap_or_else(|e| e.into_inner());
        let map = regions.get(region as usize)?.as_ref()?;
        let end = offset.checked_add(len)?;
        if end > map.len() as u64 {
            return None;
        }
        // SAFETY: the range lies inside the mapping, which lives as long as the fabric (regions
        // are never removed from the table), hence as long as &self.
        Some(unsafe { std::slice::from_raw_parts(map.as_ptr().add(offset as usize), len as usize) })
    }
}
