//! Single-producer single-consumer message ring in shared memory.
//!
//! The ring is an array of 64-byte slots (one cache line each) preceded by one control line.
//! A message takes `k` consecutive slots: a 32-byte header, `nargs` argument words, then the
//! medium payload. The first word of the header is a *stamp*: the message's position in the
//! ring's infinite sequence of slots, plus one. The receiver waits for the stamp it expects at
//! its head position, so a small message moves exactly one cache line from sender to receiver
//! (no separate tail pointer to transfer). The stamp is stored last with release ordering.
//!
//! Stale data never looks like a message: a header slot keeps an old stamp (always smaller than
//! any future position), and the receiver zeroes the first word of a message's continuation
//! slots (which held payload bytes) before releasing them.
//!
//! The receiver publishes how far it has consumed in the control line; the sender reads it only
//! when its cached copy says the ring is full (back-pressure: the sender polls, nothing drops).
//! A message never wraps: when it does not fit before the end, the sender writes a skip marker.
//!
//! Multiple threads of one process may send on the same ring: [`Sender`] is used under a lock
//! by its owner. Likewise [`Receiver`].

use crate::{FabricError, FabricResult, AM_MAX_ARGS};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of one slot.
pub const SLOT: usize = 64;
/// Bytes of the header at the start of a message.
pub const HEADER: usize = 32;

const KIND_SHORT: u64 = 0;
const KIND_MEDIUM: u64 = 1;
const KIND_LONG: u64 = 2;
const KIND_SKIP: u64 = 3;

/// Bytes a ring with `slots` slots occupies (control line + slots).
pub const fn ring_bytes(slots: usize) -> usize {
    SLOT + slots * SLOT
}

/// Location of a ring in mapped shared memory.
#[derive(Clone, Copy, Debug)]
pub struct RingPtr {
    base: *mut u8,
    slots: u64,
    /// `slots - 1` (slots is a power of two, so positions map to slots with a mask, not a
    /// division: a 64-bit `div` costs tens of cycles on every send and poll).
    mask: u64,
}

// SAFETY: RingPtr is an address into a mapping that outlives every ring user (the fabric keeps
// the mappings alive); concurrent access is governed by the SPSC protocol above.
unsafe impl Send for RingPtr {}
// SAFETY: as above; shared use only reads the stamp words atomically (`ready_at`), everything
// else goes through a Sender or Receiver owned under a lock.
unsafe impl Sync for RingPtr {}

impl RingPtr {
    /// # Safety
    /// `base` must point to `ring_bytes(slots)` bytes of 64-byte-aligned shared memory that
    /// stays mapped while the `RingPtr` (and anything built from it) is used; `slots` must be
    /// a power of two.
    pub unsafe fn new(base: *mut u8, slots: usize) -> Self {
        debug_assert_eq!(base as usize % SLOT, 0);
        assert!(slots.is_power_of_two(), "ring slots must be a power of two, not {slots}");
        RingPtr { base, slots: slots as u64, mask: slots as u64 - 1 }
    }
    /// Slots left between `pos` and the end of the ring.
    fn room_to_end(&self, pos: u64) -> u64 {
        self.slots - (pos & self.mask)
    }
    fn consumed(&self) -> &AtomicU64 {
        // SAFETY: the control line is the first 64 bytes of the ring, 8-aligned, and is only
        // ever accessed atomically.
        unsafe { &*(self.base as *const AtomicU64) }
    }
    #[inline]
    fn slot(&self, pos: u64) -> *mut u8 {
        // SAFETY: pos & mask < slots, so the slot lies inside the ring.
        unsafe { self.base.add(SLOT + ((pos & self.mask) as usize) * SLOT) }
    }
    /// True if a message starts at `pos` (a lock-free peek for pollers).
    #[inline]
    pub fn ready_at(&self, pos: u64) -> bool {
        self.stamp(pos).load(Ordering::Acquire) == pos + 1
    }

    #[inline]
    fn stamp(&self, pos: u64) -> &AtomicU64 {
        // SAFETY: a slot's first word is 8-aligned and only accessed atomically.
        unsafe { &*(self.slot(pos) as *const AtomicU64) }
    }
}

/// What a message carries besides the arguments.
#[derive(Clone, Copy, Debug)]
pub enum Body<'a> {
    /// Nothing.
    Short,
    /// Bytes copied into the ring.
    Medium(&'a [u8]),
    /// Bytes already written to region `region` at `offset`, `len` long.
    Long { region: u32, offset: u64, len: u64 },
}

/// A message read from the ring (borrowing the ring memory).
#[derive(Debug)]
pub struct Message<'a> {
    /// Handler index.
    pub handler: u16,
    /// Arguments.
    pub args: &'a [u64],
    /// Body.
    pub body: Body<'a>,
}

/// Slots a message takes.
pub fn slots_for(nargs: usize, medium_len: usize) -> usize {
    (HEADER + nargs * 8 + medium_len).div_ceil(SLOT)
}

/// Producer side (kept in the sender's process).
#[derive(Debug)]
pub struct Sender {
    ring: RingPtr,
    tail: u64,
    cached_consumed: u64,
}

impl Sender {
    /// A producer for `ring`, starting at position 0.
    pub fn new(ring: RingPtr) -> Self {
        Sender { ring, tail: 0, cached_consumed: 0 }
    }

    /// Writes one message; `Ok(false)` if the ring is full now. Always inlined into its
    /// callers (the fabric's AM send): left to the inliner, it was inlined or not depending on
    /// unrelated code elsewhere in the crate, and a call here cut the medium-AM flood's rate
    /// from 55 to 20 M/s.
    #[inline(always)]
    pub fn try_send(&mut self, handler: u16, args: &[u64], body: Body<'_>) -> FabricResult<bool> {
        let medium = if let Body::Medium(p) = body { p.len() } else { 0 };
        let k = slots_for(args.len(), medium) as u64;
        let n = self.ring.slots;
        if k > n / 2 || args.len() > AM_MAX_ARGS {
            return Err(FabricError::TooLarge {
                what: "active message",
                len: HEADER + args.len() * 8 + medium,
                max: (n / 2) as usize * SLOT,
            });
        }
        let room_to_end = self.ring.room_to_end(self.tail);
        let need = if k > room_to_end { room_to_end + k } else { k };
        if self.tail + need - self.cached_consumed > n {
            self.cached_consumed = self.ring.consumed().load(Ordering::Acquire);
            if self.tail + need - self.cached_consumed > n {
                return Ok(false);
            }
        }
        if k > room_to_end {
            self.publish(self.tail, header_word(0, KIND_SKIP, 0, room_to_end));
            self.tail += room_to_end;
        }
        let pos = self.tail;
        let slot = self.ring.slot(pos);
        let (kind, len) = match body {
            Body::Short => (KIND_SHORT, 0),
            Body::Medium(p) => (KIND_MEDIUM, p.len() as u64),
            Body::Long { region, offset, len } => {
                // SAFETY: words 2 and 3 of a free slot owned by this producer until the stamp
                // is stored (only long messages use them).
                unsafe {
                    slot.cast::<u64>().add(2).write_volatile(region as u64);
                    slot.cast::<u64>().add(3).write_volatile(offset);
                }
                (KIND_LONG, len)
            }
        };
        // SAFETY: the k slots starting at `slot` are inside the ring (no wrap: checked above)
        // and free (consumed by the receiver, checked above); the receiver reads them only
        // after it sees the stamp, which `publish` stores last (release).
        unsafe {
            // A word loop, not memcpy: at most AM_MAX_ARGS words, usually none or a few, where
            // a call to memcpy costs more than the copy.
            let words = slot.add(HEADER).cast::<u64>();
            for (i, &a) in args.iter().enumerate() {
                words.add(i).write_volatile(a);
            }
            if let Body::Medium(p) = body {
                crate::copy::copy_bytes(p.as_ptr(), slot.add(HEADER + args.len() * 8), p.len());
            }
        }
        self.publish(pos, header_word(handler, kind, args.len(), len));
        self.tail += k;
        Ok(true)
    }

    /// Stores the header word `meta` and then, with release ordering, the stamp of the message
    /// at `pos`: a receiver that sees the stamp sees the whole message.
    #[inline]
    fn publish(&self, pos: u64, meta: u64) {
        // SAFETY: word 1 of a free slot owned by this producer until the stamp is stored.
        unsafe { self.ring.slot(pos).cast::<u64>().add(1).write_volatile(meta) };
        self.ring.stamp(pos).store(pos + 1, Ordering::Release);
    }
}

/// A message's header word (word 1 of its first slot; `Receiver::take` reads it back).
fn header_word(handler: u16, kind: u64, nargs: usize, len: u64) -> u64 {
    handler as u64 | (kind << 16) | ((nargs as u64) << 24) | (len << 32)
}

/// Consumer side (kept in the receiver's process).
#[derive(Debug)]
pub struct Receiver {
    ring: RingPtr,
    head: u64,
    max_medium: usize,
}

impl Receiver {
    /// A consumer for `ring`, starting at position 0; mediums above `max_medium` are rejected.
    pub fn new(ring: RingPtr, max_medium: usize) -> Self {
        Receiver { ring, head: 0, max_medium }
    }

    /// True if a message (or skip marker) is waiting.
    pub fn ready(&self) -> bool {
        self.ring.ready_at(self.head)
    }

    /// Position of the next message.
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Hands up to `max` waiting messages to `f` in order, releasing each one's slots, and
    /// returns how many there were. An error from `f` ends the batch and is returned after its
    /// message was released (it was consumed); a malformed header ends it and stays where it
    /// is (nothing after it can be trusted).
    ///
    /// One loop for the whole batch, and the consumed position published once at its end: the
    /// producer reads it only when its ring looks full.
    #[inline]
    pub fn recv(
        &mut self,
        max: usize,
        mut f: impl FnMut(Message<'_>) -> FabricResult<()>,
    ) -> FabricResult<usize> {
        let start = self.head;
        let mut n = 0;
        let mut result = Ok(());
        while n < max && self.ready() {
            match self.take(&mut f) {
                Ok(true) => n += 1,
                Ok(false) => {}
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if self.head != start {
            self.ring.consumed().store(self.head, Ordering::Release);
        }
        result.map(|()| n)
    }

    /// Hands the message at the head (known to be ready) to `f` and moves past it; `Ok(false)`
    /// for a skip marker.
    #[inline]
    fn take(&mut self, f: &mut impl FnMut(Message<'_>) -> FabricResult<()>) -> FabricResult<bool> {
        let slot = self.ring.slot(self.head);
        // SAFETY: the acquire load of the stamp in ready() makes the producer's writes of this
        // message visible; the producer does not touch these slots until we publish `consumed`
        // past them.
        let meta = unsafe { slot.cast::<u64>().add(1).read_volatile() };
        let handler = (meta & 0xffff) as u16;
        let kind = (meta >> 16) & 0xff;
        let nargs = ((meta >> 24) & 0xff) as usize;
        let len = meta >> 32;
        let room_to_end = self.ring.room_to_end(self.head);
        if kind == KIND_SKIP {
            if len != room_to_end {
                return Err(malformed_skip(len, room_to_end));
            }
            self.head += room_to_end;
            return Ok(false);
        }
        let medium = if kind == KIND_MEDIUM { len as usize } else { 0 };
        let k = slots_for(nargs, medium) as u64;
        if kind > KIND_LONG || nargs > AM_MAX_ARGS || medium > self.max_medium || k > room_to_end {
            return Err(malformed_header(kind, nargs, medium, k));
        }
        // SAFETY: the k slots lie inside the ring (checked) and are ours until released;
        // args are 8-aligned (slot is 64-aligned, header 32 bytes).
        let (args, body) = unsafe {
            let words = slot.cast::<u64>();
            let args = std::slice::from_raw_parts(words.add(4), nargs);
            let body = match kind {
                KIND_SHORT => Body::Short,
                KIND_MEDIUM => Body::Medium(std::slice::from_raw_parts(slot.add(HEADER + nargs * 8), medium)),
                _ => Body::Long {
                    region: words.add(2).read_volatile() as u32,
                    offset: words.add(3).read_volatile(),
                    len,
                },
            };
            (args, body)
        };
        let handled = f(Message { handler, args, body });
        for i in 1..k {
            self.ring.stamp(self.head + i).store(0, Ordering::Relaxed);
        }
        self.head += k;
        handled.map(|()| true)
    }
}

#[cold]
fn malformed_skip(len: u64, room_to_end: u64) -> FabricError {
    FabricError::Malformed { what: format!("skip of {len} slots, {room_to_end} expected") }
}

#[cold]
fn malformed_header(kind: u64, nargs: usize, medium: usize, k: u64) -> FabricError {
    FabricError::Malformed {
        what: format!(
            "header kind {kind}, {nargs} args, {medium} payload bytes, {k} slots (past the ring's end?)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(64))]
    struct Mem([u8; 64 * 17]);

    #[test]
    fn wraps_with_skip_and_rejects_stale_payload() {
        let mut mem = Box::new(Mem([0; 64 * 17]));
        // SAFETY: mem is 64-aligned and ring_bytes(16) long, alive for the whole test.
        let ring = unsafe { RingPtr::new(mem.0.as_mut_ptr(), 16) };
        let mut tx = Sender::new(ring);
        let mut rx = Receiver::new(ring, 1 << 20);
        // A payload full of words that look like future stamps must not be taken as messages.
        let evil: Vec<u8> = (0..400u64).flat_map(|i| (i + 1).to_le_bytes()).take(300).collect();
        for round in 0..50u64 {
            assert!(tx.try_send(7, &[round, 2], Body::Medium(&evil)).unwrap());
            assert!(tx.try_send(9, &[round], Body::Short).unwrap());
            let mut got = vec![];
            let n = rx
                .recv(64, |m| {
                    got.push((
                        m.handler,
                        m.args.to_vec(),
                        matches!(m.body, Body::Medium(p) if p == &evil[..]),
                    ));
                    Ok(())
                })
                .unwrap();
            assert_eq!(n, 2);
            assert_eq!(got, vec![(7, vec![round, 2], true), (9, vec![round], false)]);
        }
    }

    #[test]
    fn full_ring_pushes_back() {
        let mut mem = Box::new(Mem([0; 64 * 17]));
        // SAFETY: as above.
        let ring = unsafe { RingPtr::new(mem.0.as_mut_ptr(), 16) };
        let mut tx = Sender::new(ring);
        let mut rx = Receiver::new(ring, 1 << 20);
        let mut sent = 0;
        while tx.try_send(1, &[sent], Body::Short).unwrap() {
            sent += 1;
        }
        assert_eq!(sent, 16);
        let n = rx
            .recv(1, |m| {
                assert_eq!(m.args, &[0]);
                Ok(())
            })
            .unwrap();
        assert_eq!(n, 1);
        assert!(tx.try_send(1, &[99], Body::Short).unwrap());
        assert!(tx.try_send(1, &[0; 17], Body::Short).is_err());
    }
}
