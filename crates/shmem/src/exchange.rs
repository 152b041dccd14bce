//! Small collectives in one exchange, through the slots of a sync area (words 32-63 of a
//! `pSync` or of a team's area).
//!
//! A sender copies its data into its slot on the receiver, after the slot's head word, then
//! sets the head: the data's length, whether the data is in the slot (a `collect` member's
//! may not fit: then only its length travels), the kind of call and, for a reduction, its
//! operation and type of number. The head is a plain
//! release store where the area is mapped (the data and the head of a short slot share a
//! cache line, so the receiver takes one transfer), weft's remote atomic elsewhere, after a
//! put that is visible at the target. The receiver waits for the head, checks that the
//! sender made the same call, reads the data and clears the slot, which restores a `pSync`
//! (`SHMEM_SYNC_VALUE` is 0) for the next call. No word counts: the receiver reads and
//! clears its slot with no atomic, and a sender drains its heads to every member with one
//! barrier before it wakes those that sleep.
//!
//! A slot is not written again before its receiver has cleared it: a `pSync` is not reused
//! before every PE is done with it (the specification's rule); a team's exchanges alternate
//! between two halves of the slots, and a member cannot start the exchange after next before
//! every member has finished the next one, which it begins only after clearing this one.

use crate::cabi;
use crate::coll::{put_at, Set, SyncArea, SYNC_WORDS};
use crate::state::{die, Shmem};
use std::ffi::c_void;
use std::sync::atomic::Ordering;
use weft_runtime::AtomicOp;

/// Bytes of a sync area given to slots: words 32 to 63.
const SLOTS: std::ops::Range<usize> = 32 * 8..SYNC_WORDS * 8;

/// The kinds of call a head names.
pub(crate) const BROADCAST: u8 = 1;
pub(crate) const COLLECT: u8 = 2;
pub(crate) const FCOLLECT: u8 = 3;
pub(crate) const REDUCE: u8 = 4;

fn kind_name(kind: u8) -> &'static str {
    match kind {
        BROADCAST => "a broadcast",
        COLLECT => "a collect",
        FCOLLECT => "an fcollect",
        REDUCE => "a reduction",
        _ => "an unknown call",
    }
}

/// Bytes of slot each other member has on a receiver (its head word included): the same on
/// every member of `set`, so all take the same path.
pub(crate) fn share(area: SyncArea, set: Set) -> usize {
    let room = SLOTS.len() / if area.calls.is_some() { 2 } else { 1 };
    (room / (set.size as usize - 1).max(1)) & !7
}

/// Room for data in a broadcast's slot (one sender: all the slots).
pub(crate) fn broadcast_room() -> usize {
    room(SLOTS.len())
}

/// Room for data in a slot of [`share`] bytes.
pub(crate) fn room(share: usize) -> usize {
    share.saturating_sub(8)
}

/// A call's kind and its detail (a reduction's operation and type; else 0).
pub(crate) type What = (u8, u8);

fn head((kind, detail): What, len: usize, inline: bool) -> u64 {
    1 + ((len as u64) << 16 | (detail as u64) << 8 | (kind as u64) << 1 | inline as u64)
}

/// Copies `data` into the slot at byte `off` of `area` on world PE `pe`, then sets its head.
fn put_slot(s: &Shmem, call: &str, area: SyncArea, (off, pe): (usize, u32), head: u64, data: Option<&[u8]>) {
    let local = area.local + off;
    if let Some(d) = data {
        put_at(call, local as *const c_void, 8, d.as_ptr().cast(), d.len(), pe);
    }
    match s.direct(local as *const c_void, 8, pe as i32) {
        Some(at) => cabi::atomic_u64(at).store(head, Ordering::Release),
        None => {
            let word = area.global.on(pe).byte_add(off).cast();
            s.check(call, s.comm.atomic(word, AtomicOp::FetchAdd(head)));
        }
    }
}

/// Sends head `h` and `data` to every member of `set` but member `except`: `slot_on(j)` runs
/// first for member j and gives the byte of its slot there. Then wakes those members where
/// they sleep (neither a store nor a remote atomic rings a doorbell), after a full barrier:
/// a plain store may wait in this core's store buffer while the check of the member's sleep
/// flag, a later load, goes ahead, and a member that went to sleep just then would sleep its
/// whole timeout. One barrier drains the stores to every member at once.
fn send(
    s: &Shmem,
    call: &str,
    (set, area): (Set, SyncArea),
    except: u32,
    (h, data): (u64, Option<&[u8]>),
    mut slot_on: impl FnMut(u32) -> usize,
) {
    let others = || (0..set.size).filter(move |&j| j != except);
    for j in others() {
        put_slot(s, call, area, (slot_on(j), set.pe(j)), h, data);
    }
    weft_runtime::full_fence();
    for j in others() {
        s.check(call, s.comm.notify(set.pe(j)));
    }
}

/// Waits for the head of this PE's slot at byte `off` of `area` of `set` (from world PE `from`),
/// checks it against this call, and returns the length and the data, where it came (in
/// collective call `watched`).
fn wait_slot<'a>(
    s: &Shmem,
    call: &str,
    (set, area): (Set, SyncArea),
    (off, from): (usize, u32),
    share: usize,
    ((kind, detail), watched): (What, crate::watch::Call),
) -> (usize, Option<&'a [u8]>) {
    let addr = area.local + off;
    if cabi::load_local(addr, 8) == 0 {
        crate::watch::wait(s, call, (set, area, from), watched, || cabi::load_local(addr, 8) != 0);
    }
    let h = cabi::load_local(addr, 8) - 1;
    let (len, theirs, their_detail, inline) = (h >> 16, (h >> 1 & 0x7f) as u8, (h >> 8) as u8, h & 1 == 1);
    if !(BROADCAST..=REDUCE).contains(&theirs) && area.calls.is_none() {
        die(call, format_args!("pSync word {} (PE {from}'s slot here) holds {:#x}, which no call writes: every PE must set its pSync to SHMEM_SYNC_VALUE before the first call, and none may reuse it before every PE is done with it", off / 8, h + 1));
    }
    if theirs != kind {
        die(call, format_args!("PE {from} made {} where this PE makes {}: every member must make the same collective calls in the same order", kind_name(theirs), kind_name(kind)));
    }
    if their_detail != detail {
        let (a, b) = (crate::coll::describe_reduction(their_detail), crate::coll::describe_reduction(detail));
        die(call, format_args!("PE {from} reduces with {a} where this PE reduces with {b}"));
    }
    if inline && len > room(share) as u64 {
        die(call, format_args!("PE {from} sent {len} bytes for a slot of {}", room(share)));
    }
    let len = len as usize;
    (len, inline.then(|| cabi::src_bytes((addr + 8) as *const c_void, len)))
}

/// Zeroes `len` bytes from byte `off` of this PE's copy of `area`.
fn clear(area: SyncArea, off: usize, len: usize) {
    cabi::dst_bytes((area.local + off) as *mut c_void, len).fill(0);
}

/// One exchange among the members of `set`: this PE's `len` and its data (`None` where it
/// does not fit [`room`]) go to every other member, and `take` gets every member's length
/// and data in member order (this PE's own included).
pub(crate) fn all(
    s: &Shmem,
    call: &str,
    (set, area): (Set, SyncArea),
    kind: What,
    (len, mine): (usize, Option<&[u8]>),
    mut take: impl FnMut(u32, usize, Option<&[u8]>),
) {
    let me = set.index_of(s.me).unwrap_or_else(|| die(call, "this PE is not in the set"));
    let parity = area.calls.map_or(0, |c| (c.fetch_add(1, Ordering::Relaxed) & 1) as usize);
    let share = share(area, set);
    let base = SLOTS.start + parity * (SLOTS.len() / 2);
    // Member `from`'s slot on member `on` (none for itself).
    let at = |from: u32, on: u32| base + share * (if from < on { from } else { from - 1 }) as usize;
    send(s, call, (set, area), me, (head(kind, len, mine.is_some()), mine), |j| at(me, j));
    for i in 0..set.size {
        match i == me {
            true => take(i, len, mine),
            false => {
                let (l, data) = wait_slot(
                    s,
                    call,
                    (set, area),
                    (at(i, me), set.pe(i)),
                    share,
                    (kind, (kind.0, kind.1, len)),
                );
                take(i, l, data);
                clear(area, at(i, me), 8 + data.map_or(0, |d| d.len()));
            }
        }
    }
}

/// The root's side of a broadcast of `len` bytes over a `pSync`: for each other member in
/// turn, `before` (the root's own puts of data too long for a slot) and then the slot, with
/// `data` where it fits, and its head; then the wake.
pub(crate) fn to_members(
    s: &Shmem,
    call: &str,
    (set, area): (Set, SyncArea),
    root: u32,
    (len, data): (usize, Option<&[u8]>),
    mut before: impl FnMut(u32),
) {
    let h = head((BROADCAST, 0), len, data.is_some());
    send(s, call, (set, area), root, (h, data), |j| {
        before(set.pe(j));
        SLOTS.start
    });
}

/// A member's side of a broadcast of `len` bytes over a `pSync` from member `root`:
/// `deliver` gets the data where it came in the slot (else the root put it in place).
pub(crate) fn from_root(
    s: &Shmem,
    call: &str,
    (set, area): (Set, SyncArea),
    root: u32,
    len: usize,
    deliver: impl FnOnce(Option<&[u8]>),
) {
    let watched = (BROADCAST, root as u8, len);
    let (l, got) =
        wait_slot(s, call, (set, area), (SLOTS.start, set.pe(root)), SLOTS.len(), ((BROADCAST, 0), watched));
    if l != len {
        die(call, format_args!("the root broadcasts {l} bytes where this PE expects {len}"));
    }
    deliver(got);
    clear(area, SLOTS.start, 8 + got.map_or(0, |g| g.len()));
}
