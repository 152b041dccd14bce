//! Point-to-point channels between the members of a team, built on one-sided operations: the
//! sender puts a chunk into its slot in the receiver's scratch and then the chunk's header with
//! its number as the signal into the receiver's `filled` flag (one put with signal); the
//! receiver copies the chunk out and stores the number into its own `drained` flag, which the
//! sender reads (remote atomic load) before it reuses the slot. Every collective is a sequence of [`Channels::transfer`]s.
//!
//! Messages of `coll_direct_bytes` ([`crate::Config`]) and more skip the slot where the fabric can read a peer's
//! memory ([`crate::Caps::peer_read`]): the sender announces its buffer's address in the flag
//! line, the receiver reads the whole message from there in one copy and then stores
//! `drained`, which is also what tells the sender its buffer is free again.
//!
//! A message of [`DIRECT_MIN`] bytes or more that lies in a segment the receiver holds too is
//! read the same way on a load/store fabric, whatever `coll_direct_bytes` says: the flag line
//! names the segment and offset, and the receiver copies it out of its own mapping (a `get`),
//! with no system call.
//!
//! Messages of up to [`PACKED`] bytes (a small broadcast's or alltoall's, a reduction's
//! element, a barrier's empty one) travel as 16-byte records instead, four to a cache line, in
//! a ring of [`RECORDS`] per source: `[header, data]`, the header (message number, length and
//! folded tag) stored after the data as the signal. A receiver that reads one line so takes up
//! to four messages, where a flag line carries one: back-to-back 8 B broadcasts took 0.70x the
//! time of one line each (0.022 against 0.031 µs), and 0.37x where this machine's two cores
//! are slow to hand lines to each other (0.049 against 0.133 µs; Open MPI's 0.098). Message
//! numbers are shared by the lines and the records, so a receiver that finds its next message
//! in the other place than its expected length says (the sender chose by another length)
//! reports a mismatch instead of waiting for ever.
//!
//! Send-ahead: each source has [`LINES`] flag lines in each receiver, used in turn, and its
//! slot doubles as [`SUBS`] sub-slots of [`SUB`] bytes, so a sender may be up to `LINES`
//! inline messages or `SUBS` sub-slot messages ahead of the receiver (message `m` uses line
//! `(m - 1) % LINES`, free once message `m - LINES` was drained, and sub-slot
//! `(m - 1) % SUBS`, free once message `m - SUBS` was drained). A longer message
//! uses the whole slot. In a one-way transfer (only sends or only receives: a tree's or a
//! chain's step) it goes in chunks of [`CHUNK`] bytes (half the slot) that alternate between
//! the halves: its first chunk waits until the receiver drained everything before it, each
//! later one until the chunk before the one before it was drained, so the sender copies chunk
//! `j + 1` in while the receiver copies chunk `j` out. In an exchange (both ways at once, where
//! both members copy anyway) it goes in chunks of the whole slot, each waiting until
//! everything before it was drained: half the handshakes. The tag carries the choice, so
//! members that disagree get a mismatch, not mixed-up data. Sub-slots wait until the last
//! chunk was drained. The sender caches the last
//! `drained` it read and reads it again only when the cached value says "not free", so
//! back-to-back small collectives do not pay a remote load each.
//!
//! Scratch layout on each member, `n` members: flags (`u64`, two 64-byte lines each) —
//! `in[src][j] = [filled, message bytes, tag, address or 0, up to 96 bytes of data inline]`
//! for `src` in `0..n`, `j` in `0..LINES` (message number `m` uses line `(m - 1) % LINES`, and
//! `filled` holds `m`), then `drained[src]`, then `rec[src][k] = [header, data]` for `k` in
//! `0..RECORDS` (packed message `p` uses record `(p - 1) % RECORDS`) — and data, one slot of
//! [`SLOT`] bytes per source.

mod lane;

use super::call::describe_tag;
use super::tune::DIRECT_MIN;
use super::Core;
use crate::layer::Layer;
use crate::{Error, GlobalPtr, Result, Segment};
use lane::Lane;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use weft_fabric::pod::{bytes_of, bytes_of_mut};

/// Bytes of the largest slot (one per source in every member's scratch); a team with more
/// members than fit in a rank's scratch budget gets smaller ones (see [`Slot::for_team`]).
pub const SLOT: usize = 256 << 10;
/// Bytes of the smallest slot.
pub const MIN_SLOT: usize = 16 << 10;
/// `u64` words per flag line: two cache lines, so that messages of up to 96 bytes travel in
/// one put with signal (a 64 B broadcast or alltoall took a sub-slot put and the flag's put:
/// 0.9x the time back-to-back this way). Only the words a message uses are written.
const LINE: usize = 16;
/// Messages up to this many bytes travel inside the flag line (words 4..16).
pub(crate) const INLINE: usize = (LINE - 4) * 8;
/// Flag lines per source in each receiver: how many messages a sender may be ahead (deep, so
/// that a rank sharing its core with others finds many messages when it gets the core).
pub const LINES: usize = 32;
/// Records per source in each receiver's packed ring (16 bytes each, four to a cache line):
/// how many packed messages a sender may be ahead.
pub const RECORDS: usize = 64;
/// Messages up to this many bytes travel as one record of the packed ring.
pub(crate) const PACKED: usize = 8;
/// Sub-slots per source's slot.
pub const SUBS: usize = 8;

/// The size of a team's slots, the same on every member (it follows from the team's size and
/// the scratch budget): a power of two from [`MIN_SLOT`] to [`SLOT`]. Messages up to an
/// eighth of it use a sub-slot; longer ones go in chunks of half of it (one-way transfers, so
/// two are in flight) or all of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot(usize);

impl Slot {
    /// The largest slot such that the team's `n` slots fit in `budget` bytes (at least
    /// [`MIN_SLOT`], at most [`SLOT`]): a rank's scratch per team stays flat as teams grow.
    pub fn for_team(n: usize, budget: usize) -> Slot {
        let share = (budget / n.max(1)).max(1);
        let pow2 = 1usize << (usize::BITS - 1 - share.leading_zeros());
        Slot(pow2.clamp(MIN_SLOT, SLOT))
    }
    /// Bytes of one slot.
    pub fn bytes(self) -> usize {
        self.0
    }
    /// Bytes of one sub-slot.
    fn sub(self) -> usize {
        self.0 / SUBS
    }
    /// Where a message of `len` bytes travels.
    fn kind(self, len: usize) -> Kind {
        if len <= INLINE {
            Kind::Inline
        } else if len <= self.sub() {
            Kind::Sub
        } else {
            Kind::Whole
        }
    }
    /// Byte offset, in a source's slot, of the sub-slot of message number `m = count + 1`.
    fn sub_slot(self, count: u64) -> usize {
        (count as usize % SUBS) * self.sub()
    }
    /// Bytes of one chunk of a long message.
    fn chunk_bytes(self, pipelined: bool) -> usize {
        if pipelined {
            self.0 / 2
        } else {
            self.0
        }
    }
    /// Byte offset, in a source's slot, of chunk `j` of a long message.
    fn chunk_at(self, j: u64, pipelined: bool) -> usize {
        if pipelined {
            (j as usize % 2) * self.chunk_bytes(true)
        } else {
            0
        }
    }
    /// Bytes of chunk `j` of a message of `len` bytes.
    fn chunk_range(self, j: u64, len: usize, pipelined: bool) -> std::ops::Range<usize> {
        let at = j as usize * self.chunk_bytes(pipelined);
        at..(at + self.chunk_bytes(pipelined)).min(len)
    }
    /// Chunks of a message of `len` bytes (an empty message is one empty chunk: it still
    /// tells the receiver the sender got there).
    fn chunks(self, len: usize, pipelined: bool) -> u64 {
        len.div_ceil(self.chunk_bytes(pipelined)).max(1) as u64
    }
}

pub(crate) struct Channels {
    flags: Segment<u64>,
    slots: Segment<u8>,
    slot: Slot,
    /// Per member. Atomics rather than a lock: a team runs one collective at a time, so only
    /// one thread steps its channels, and a lock cost as much as a small message (plain loads
    /// and stores here; concurrent misuse gives wrong data, never undefined behaviour).
    state: Vec<PeerCell>,
    /// Messages from this many bytes up are read directly where the fabric can (the
    /// configured `coll_direct_bytes`, or lower while a tuned collective tries the direct way).
    direct_from: AtomicUsize,
}

/// What this member knows of its channel with one member, as a step works on it.
#[derive(Clone, Copy, Default)]
struct Peer {
    /// Chunks sent to the member and received from it, since the team was made.
    sent: u64,
    recvd: u64,
    /// The last `drained` read from the member (it only grows).
    drained: u64,
    /// Number of the last message sent to the member through its whole slot (0: none).
    whole: u64,
    /// Messages sent to the member and received from it through the packed ring.
    packed_sent: u64,
    packed_recvd: u64,
}

/// [`Peer`] as the channels keep it (one struct per member: a step touches one cache line per
/// peer, not one per counter).
#[derive(Default)]
struct PeerCell {
    sent: AtomicU64,
    recvd: AtomicU64,
    drained: AtomicU64,
    whole: AtomicU64,
    packed_sent: AtomicU64,
    packed_recvd: AtomicU64,
    /// The running transfer still owes the member a message or waits on it.
    pending: AtomicBool,
}

impl PeerCell {
    fn load(&self) -> Peer {
        Peer {
            sent: self.sent.load(Ordering::Relaxed),
            recvd: self.recvd.load(Ordering::Relaxed),
            drained: self.drained.load(Ordering::Relaxed),
            whole: self.whole.load(Ordering::Relaxed),
            packed_sent: self.packed_sent.load(Ordering::Relaxed),
            packed_recvd: self.packed_recvd.load(Ordering::Relaxed),
        }
    }
    fn store(&self, p: &Peer) {
        self.sent.store(p.sent, Ordering::Relaxed);
        self.recvd.store(p.recvd, Ordering::Relaxed);
        self.drained.store(p.drained, Ordering::Relaxed);
        self.whole.store(p.whole, Ordering::Relaxed);
        self.packed_sent.store(p.packed_sent, Ordering::Relaxed);
        self.packed_recvd.store(p.packed_recvd, Ordering::Relaxed);
    }
}

/// A message to one member.
#[derive(Clone, Copy)]
pub(crate) struct Out<'a> {
    pub to: usize,
    pub data: &'a [u8],
}

/// A message from one member, of a length both sides know.
pub(crate) struct In<'a> {
    pub from: usize,
    pub out: &'a mut [u8],
}

/// Where a message of a given length travels (sender and receiver decide alike).
#[derive(Clone, Copy)]
enum Kind {
    /// In its flag line.
    Inline,
    /// In sub-slot `(m - 1) % SUBS` of the slot.
    Sub,
    /// Through the whole slot, in chunks (see [`chunk_bytes`]).
    Whole,
}

/// Tag bit of a one-way transfer (long messages pipelined through the slot's halves).
const PIPELINED: u64 = 1 << 32;

/// `tag` as a one-way transfer's messages carry it ([`Channels::try_send_inline`]'s): a
/// transfer given it keeps it even where it moves messages both ways.
pub(crate) fn one_way(tag: u64) -> u64 {
    tag | PIPELINED
}

/// Word, in a member's flag segment, of the line that message number `count + 1` from team
/// rank `src` uses.
fn line_word(src: usize, count: u64) -> usize {
    (src * LINES + count as usize % LINES) * LINE
}

/// Word, in a member's flag segment of `n` members, of its `drained` count for team rank `src`.
fn drained_word(n: usize, src: usize) -> usize {
    (n * LINES + src) * LINE
}

/// Word, in a member's flag segment of `n` members, of the record that packed message number
/// `count + 1` from team rank `src` uses.
fn record_word(n: usize, src: usize, count: u64) -> usize {
    (n * (LINES + 1) * LINE) + (src * RECORDS + count as usize % RECORDS) * 2
}

/// Word, in a member's flag segment of `n` members, of its running call's descriptor: in a
/// 128-byte pair of lines of its own, apart from the records peers write (a store to a line
/// next to a line another core writes slowed back-to-back 8 B broadcasts by a third: the
/// adjacent-line prefetcher moves lines in pairs).
fn desc_word(n: usize) -> usize {
    n * (LINES + 1) * LINE + n * RECORDS * 2 + LINE
}

/// Word of the alarm (a pair of lines of its own).
fn alarm_word(n: usize) -> usize {
    desc_word(n) + LINE
}

/// Words of a report: [the detector's call, the other call, the other's team rank, the
/// detector's team rank].
pub(crate) const REPORT: usize = 4;

/// Word of team rank `src`'s report line.
fn report_word(n: usize, src: usize) -> usize {
    alarm_word(n) + LINE + src * 8
}

/// Bits of a record's header word that hold the message number (the rest: length and tag).
const SEQ_BITS: u32 = 44;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

/// A packed record's header: message number `m` (its low [`SEQ_BITS`]), length (4 bits), and
/// the tag folded into 16 bits.
fn record_header(m: u64, len: usize, tag: u64) -> u64 {
    debug_assert!(len <= PACKED);
    (m & SEQ_MASK) | (len as u64) << SEQ_BITS | fold_tag(tag) << 48
}

/// `tag` in 16 bits: its low 15 (the kind of collective and the call's check bits, see
/// [`super::call`]) and the [`PIPELINED`] bit.
fn fold_tag(tag: u64) -> u64 {
    (tag & 0x7fff) | u64::from(tag & PIPELINED != 0) << 15
}

/// The tag a folded one stands for, as far as 16 bits tell (no call number or root).
fn unfold_tag(folded: u64) -> u64 {
    (folded & 0x7fff) | if folded & 0x8000 != 0 { PIPELINED } else { 0 }
}

/// True if a message of `len` bytes travels as a record of the packed ring (sender and
/// receiver decide alike; longer ones by [`Kind`]).
fn packed(len: usize) -> bool {
    len <= PACKED
}

impl Channels {
    /// Words of the flag segment for `n` members: the channels, then a line with this
    /// member's running call, a line with its alarm, and one report line per member (see
    /// [`super::call`]).
    pub fn flag_words(n: usize) -> usize {
        report_word(n, n)
    }

    /// Publishes this member's running call (its descriptor) where the others can read it.
    pub fn publish_call(&self, desc: u64) {
        self.flags.local().atomic(desc_word(self.state.len())).store(desc, Ordering::Release);
    }

    /// Team rank `t`'s running call, as it published it.
    pub fn call_of(&self, team: &Core, t: usize) -> Result<u64> {
        team.comm.atomic_load(self.flags.at(team.members[t], desc_word(team.members.len())))
    }

    /// This member's alarm: 0, or 1 + the team rank whose report says why the team failed.
    #[inline]
    pub fn alarm(&self) -> u64 {
        self.flags.local().atomic(alarm_word(self.state.len())).load(Ordering::Acquire)
    }

    /// The report of team rank `src`, as it arrived here.
    pub fn report(&self, src: usize) -> [u64; REPORT] {
        let mut r = [0; REPORT];
        self.flags.local().copy_out(report_word(self.state.len(), src), &mut r);
        r
    }

    /// Writes this member's `report` into every member's report line for it, then sets their
    /// alarm to name it (data first, then the signal: an alarm names a complete report).
    /// Members that cannot be reached (gone) are skipped.
    pub fn raise(&self, team: &Core, report: [u64; REPORT]) {
        let n = team.members.len();
        let (at, alarm) = (report_word(n, team.me), alarm_word(n));
        let local = self.flags.local();
        local.copy_in(at, &report);
        local.atomic(alarm).store(team.me as u64 + 1, Ordering::Release);
        for t in (0..n).filter(|&t| t != team.me) {
            let w = team.members[t];
            if team.comm.put_signal_within(&self.flags, w, at, &report, alarm, team.me as u64 + 1).is_ok() {
                let _ = team.comm.notify(w);
            }
        }
    }
    /// Bytes of the slot segment for `n` members.
    pub fn slot_bytes(n: usize, slot: Slot) -> usize {
        n * slot.bytes()
    }

    /// Channels over a team's scratch segments (sized by [`Channels::flag_words`] and
    /// [`Channels::slot_bytes`]).
    pub fn new(flags: Segment<u64>, slots: Segment<u8>, slot: Slot, n: usize, direct_from: usize) -> Self {
        let state = (0..n).map(|_| PeerCell::default()).collect();
        Channels { flags, slots, slot, state, direct_from: AtomicUsize::new(direct_from) }
    }

    /// Messages sent from now on are read directly from `bytes` up (where the fabric can).
    pub fn set_direct_from(&self, bytes: usize) {
        self.direct_from.store(bytes, Ordering::Relaxed);
    }

    /// Marks team rank `t` as needed (or not) by the running wait, outside a transfer.
    pub fn set_needed(&self, t: usize, needed: bool) {
        if let Some(p) = self.state.get(t) {
            p.pending.store(needed, Ordering::Relaxed);
        }
    }

    /// True if the running transfer still owes team rank `t` a message or waits on it.
    pub fn needs(&self, t: usize) -> bool {
        self.state.get(t).is_some_and(|p| p.pending.load(Ordering::Relaxed))
    }

    /// Moves all `outs` and `ins` (none to or from this rank itself) concurrently, chunk by
    /// chunk; the future is ready when all are done. Each poll moves what it can without
    /// waiting (the caller makes progress between polls). `tag` names the collective: a
    /// receiver that finds another tag or length than it expects reports the mismatch instead
    /// of reading it.
    pub fn transfer<'t, 'o, 'i>(
        &'t self,
        team: &'t Core,
        tag: u64,
        outs: &'t [Out<'o>],
        ins: &'t mut [In<'i>],
    ) -> Transfer<'t, 'o, 'i> {
        let tag = if outs.is_empty() || ins.is_empty() { one_way(tag) } else { tag };
        self.transfer_tagged(team, tag, outs, ins)
    }

    /// [`Channels::transfer`] with the tag its messages carry as given (`tag` or
    /// [`one_way`]`(tag)`), whichever ways they move: for the rest of messages that
    /// [`Channels::try_send_inline`] and [`Channels::try_take_inline`] did not move.
    pub fn transfer_tagged<'t, 'o, 'i>(
        &'t self,
        team: &'t Core,
        tag: u64,
        outs: &'t [Out<'o>],
        ins: &'t mut [In<'i>],
    ) -> Transfer<'t, 'o, 'i> {
        let done = Counters::zeroed(outs.len() + ins.len());
        Transfer { channels: self, team, tag, outs, ins, done }
    }

    /// Sends `data` (at most [`INLINE`] bytes) to team rank `to`, carrying `tag` as given
    /// (see [`Channels::transfer_tagged`]), if its line or record is free now; false, with
    /// nothing sent, if not. For the small collectives' path without a future and a wait
    /// loop: the same message on the wire as a transfer's.
    pub fn try_send_inline(&self, team: &Core, tag: u64, to: usize, data: &[u8]) -> Result<bool> {
        debug_assert!(data.len() <= INLINE);
        let o = Out { to, data };
        let mut done = 0;
        self.advance(to, &mut done, |peer, done| self.send(team, tag, &o, peer, done))
    }

    /// Takes the next message from team rank `from` into `out` (at most [`INLINE`] bytes),
    /// expecting `tag` as given, if it has arrived; false, with nothing taken, if not.
    pub fn try_take_inline(&self, team: &Core, tag: u64, from: usize, out: &mut [u8]) -> Result<bool> {
        debug_assert!(out.len() <= INLINE);
        let mut i = In { from, out };
        let mut done = 0;
        self.advance(from, &mut done, |peer, done| self.receive(team, tag, &mut i, peer, done))
    }

    /// One pass over a transfer: sends the chunks whose slots are free, takes the chunks that
    /// arrived. True when everything is done.
    fn step(
        &self,
        team: &Core,
        tag: u64,
        outs: &[Out<'_>],
        ins: &mut [In<'_>],
        out_done: &mut [u64],
        in_done: &mut [u64],
    ) -> Result<bool> {
        // Which members this transfer still needs, as of this step (what `needs` reports):
        // cleared for every member it touches, then set for those it waits on. A finished
        // transfer so leaves all of them clear.
        for t in outs.iter().map(|o| o.to).chain(ins.iter().map(|i| i.from)) {
            if let Some(c) = self.state.get(t) {
                c.pending.store(false, Ordering::Relaxed);
            }
        }
        let mut all = true;
        for (o, done) in outs.iter().zip(out_done.iter_mut()) {
            all &= self.advance(o.to, done, |peer, done| self.send(team, tag, o, peer, done))?;
        }
        for (i, done) in ins.iter_mut().zip(in_done.iter_mut()) {
            let from = i.from;
            all &= self.advance(from, done, |peer, done| self.receive(team, tag, i, peer, done))?;
        }
        Ok(all)
    }

    /// Moves one message of a step with `go` (a send or a receive) on the channel with team
    /// rank `t`, unless it is finished; marks the member needed while the message is not
    /// done, and the message finished once it is. True if it is done.
    fn advance(
        &self,
        t: usize,
        done: &mut u64,
        go: impl FnOnce(&mut Peer, &mut u64) -> Result<bool>,
    ) -> Result<bool> {
        if *done == FINISHED {
            return Ok(true);
        }
        let cell = self.state.get(t).ok_or(Error::Misuse("channel with a non-member"))?;
        let mut peer = cell.load();
        let r = go(&mut peer, done);
        cell.store(&peer); // also what an error left: those messages went out
        if r? {
            *done = FINISHED;
            Ok(true)
        } else {
            cell.pending.store(true, Ordering::Relaxed);
            Ok(false)
        }
    }

    /// Spins (a bounded number of flag reads) until the next chunk of an unfinished `ins`
    /// arrives; true if one did. Only a transfer whose sends are all out spins: a send waiting
    /// for its receiver to drain is not watched here, and must not wait behind the spin.
    fn await_arrival(&self, out_done: &[u64], ins: &[In<'_>], in_done: &[u64]) -> bool {
        if out_done.iter().any(|&done| done != FINISHED) {
            return false;
        }
        // (source, what this member knows of it) of up to WATCHED unfinished ins.
        let mut watch = [(0usize, Peer::default()); WATCHED];
        let mut k = 0;
        for (i, &done) in ins.iter().zip(in_done) {
            if done != FINISHED && k < WATCHED {
                let Some(p) = self.state.get(i.from) else { return false };
                watch[k] = (i.from, p.load());
                k += 1;
            }
        }
        if k == 0 {
            return false; // only sends left: they wait on the receivers, not on a local flag
        }
        let n = self.state.len();
        // No PAUSE between reads: it takes ~30 ns on this machine's cores, which would be added
        // to the detection of every message.
        (0..ARRIVAL_SPINS).any(|_| {
            watch[..k].iter().any(|(src, peer)| {
                let (in_line, record) = self.arrival(n, *src, peer);
                in_line || record.is_some()
            })
        })
    }

    /// Whether the next message from team rank `src` is in its flag line, and its packed
    /// record's header if it is there instead (the sender chose by the length it sent).
    fn arrival(&self, n: usize, src: usize, peer: &Peer) -> (bool, Option<u64>) {
        let local = self.flags.local();
        let next = peer.recvd + 1;
        let in_line = local.atomic(line_word(src, peer.recvd)).load(Ordering::Acquire) >= next;
        let head = local.atomic(record_word(n, src, peer.packed_recvd)).load(Ordering::Acquire);
        (in_line, (head & SEQ_MASK == next & SEQ_MASK).then_some(head))
    }

    /// Sends what it can of `o`; true once the whole message is out. It goes by one of three
    /// lanes, chosen by its length (the receiver tells them apart by the header): a packed
    /// record (<= 8 B), a direct read of the sender's buffer (long messages on peer-read
    /// fabrics, or data in a segment both hold), or chunks through the flag line and the slot.
    /// `done` is the lane's progress: see [`Lane::packed`], [`Lane::direct`], [`Lane::chunks`].
    fn send(&self, team: &Core, tag: u64, o: &Out<'_>, peer: &mut Peer, done: &mut u64) -> Result<bool> {
        let lane = Lane {
            ch: self,
            comm: &team.comm,
            me: team.me,
            n: team.members.len(),
            dst: team.members[o.to],
            tag,
            o,
        };
        if packed(o.data.len()) {
            return lane.packed(peer, done);
        }
        let comm = &*team.comm;
        let direct_min =
            if comm.caps().peer_read { self.direct_from.load(Ordering::Relaxed) } else { usize::MAX };
        // A long message in a segment the receiver holds too, on a fabric where a read of it
        // is a copy through the receiver's own mapping: always read there (one copy, and no
        // system call, unlike a read of the sender's private memory).
        let in_segment = if o.data.len() >= DIRECT_MIN && comm.caps().load_store {
            comm.segment_holding(o.data, lane.dst)
        } else {
            None
        };
        if o.data.len() >= direct_min || in_segment.is_some() {
            return lane.direct(peer, done, in_segment);
        }
        lane.chunks(peer, done)
    }

    /// Takes what arrived of `i` (`done`: chunks taken so far); true once all of it is here.
    fn receive(
        &self,
        team: &Core,
        tag: u64,
        i: &mut In<'_>,
        peer: &mut Peer,
        done: &mut u64,
    ) -> Result<bool> {
        let (comm, me, n) = (&*team.comm, team.me, team.members.len());
        let local = self.flags.local();
        let pipelined = tag & PIPELINED != 0;
        let total = self.slot.chunks(i.out.len(), pipelined);
        let (src, want) = (i.from, i.out.len());
        let mismatch = |len: u64, their_tag: u64| {
            team.note_mismatch(src, their_tag);
            Error::Mismatch(format!(
                "team rank {src} (world rank {}) sent {len} bytes for {}, team rank {me} expects {want} bytes for {}",
                team.members[src],
                describe_tag(their_tag),
                describe_tag(tag),
            ))
        };
        while *done < total {
            // The next message is in its flag line or, packed, in its record; one found in the
            // other place than its expected length says comes from a sender that sent another
            // length, reported instead of waited for.
            let (base, rec) = (line_word(src, peer.recvd), record_word(n, src, peer.packed_recvd));
            let (in_line, record) = self.arrival(n, src, peer);
            let record_mismatch = |head: u64| mismatch((head >> SEQ_BITS) & 0xf, unfold_tag(head >> 48));
            if packed(want) {
                let Some(head) = record else {
                    if in_line {
                        return Err(mismatch(local.read(base + 1), local.read(base + 2)));
                    }
                    break;
                };
                if head >> SEQ_BITS != record_header(0, want, tag) >> SEQ_BITS {
                    return Err(record_mismatch(head));
                }
                let word = [local.read(rec + 1)];
                i.out.copy_from_slice(&bytes_of(&word)[..want]);
                peer.packed_recvd += 1;
                *done = 1;
            } else if !in_line {
                if let Some(head) = record {
                    return Err(record_mismatch(head));
                }
                break;
            } else {
                let (len, their_tag, addr) =
                    (local.read(base + 1), local.read(base + 2), local.read(base + 3));
                if their_tag != tag || len != want as u64 {
                    return Err(mismatch(len, their_tag));
                }
                if addr & IN_SEGMENT != 0 {
                    // Announced in a segment: the whole message, read through this rank's
                    // mapping of the sender's part (bounds-checked like any get).
                    let at = GlobalPtr::<u8>::new(
                        team.members[src],
                        (addr & !IN_SEGMENT) as u32,
                        local.read(base + 4) as usize,
                    );
                    comm.get(at, i.out)?;
                    *done = total;
                } else if addr != 0 {
                    // Announced for a direct read: the whole message, straight from the
                    // sender's buffer.
                    comm.read_peer(team.members[src], addr, i.out)?;
                    *done = total;
                } else {
                    match self.slot.kind(want) {
                        Kind::Inline => {
                            let mut words = [0u64; LINE - 4];
                            local.copy_out(base + 4, &mut words[..want.div_ceil(8)]);
                            i.out.copy_from_slice(&bytes_of(&words)[..want]);
                        }
                        Kind::Sub => {
                            let at = src * self.slot.bytes() + self.slot.sub_slot(peer.recvd);
                            self.slots.local().copy_out(at, i.out)
                        }
                        Kind::Whole => {
                            let range = self.slot.chunk_range(*done, want, pipelined);
                            let from = src * self.slot.bytes() + self.slot.chunk_at(*done, pipelined);
                            self.slots.local().copy_out(from, &mut i.out[range]);
                        }
                    }
                    *done += 1;
                }
            }
            peer.recvd += 1;
            local.atomic(drained_word(n, src)).store(peer.recvd, Ordering::Release);
            comm.fabric.notify(team.members[src]);
        }
        Ok(*done == total)
    }
}

/// Marks a direct message's address word as a segment id (the next word is the offset):
/// user-space addresses never have the top bit set.
const IN_SEGMENT: u64 = 1 << 63;

/// A message's counter once it is finished (skipped by later steps).
const FINISHED: u64 = u64::MAX;

/// Flag reads [`Transfer`]'s poll spins for at most before it hands back to the wait loop.
const ARRIVAL_SPINS: usize = 256;
/// Unfinished messages it watches at most.
const WATCHED: usize = 4;

/// Members a small alltoall describes without allocating.
pub(crate) const INLINE_PEERS: usize = 8;
/// Messages (both ways together) a transfer counts without allocating: a tree or ring step
/// has one or two each way, a small alltoall of up to 5 members 8.
const INLINE_COUNTERS: usize = 8;

/// Progress per message of a transfer (outs first, then ins): on the stack for up to
/// [`INLINE_COUNTERS`] messages, so a small collective does not pay malloc and free, which
/// cost as much as its messages.
enum Counters {
    Inline([u64; INLINE_COUNTERS]),
    Heap(Vec<u64>),
}

impl Counters {
    fn zeroed(len: usize) -> Counters {
        if len <= INLINE_COUNTERS {
            Counters::Inline([0; INLINE_COUNTERS])
        } else {
            Counters::Heap(vec![0; len])
        }
    }
    fn get(&mut self) -> &mut [u64] {
        match self {
            Counters::Inline(c) => c,
            Counters::Heap(c) => c,
        }
    }
}

/// A running [`Channels::transfer`]: a small future (it is moved into the collective's own
/// future and polled many times), holding references and the counters only.
pub(crate) struct Transfer<'t, 'o, 'i> {
    channels: &'t Channels,
    team: &'t Core,
    tag: u64,
    outs: &'t [Out<'o>],
    ins: &'t mut [In<'i>],
    done: Counters,
}

impl Future for Transfer<'_, '_, '_> {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<()>> {
        let t = self.get_mut();
        let (out_done, in_done) = t.done.get().split_at_mut(t.outs.len());
        // In a blocking collective on cores of its own, watch the flags of the messages still
        // expected for a moment before handing back to the wait loop: their arrival is then
        // seen within a few loads, not after a round of AM progress.
        let mut watch = super::spin_on_flags();
        loop {
            match t.channels.step(t.team, t.tag, t.outs, t.ins, out_done, in_done) {
                Ok(false) => {}
                Ok(true) => return Poll::Ready(Ok(())),
                Err(e) => return Poll::Ready(Err(e)),
            }
            if !std::mem::take(&mut watch) || !t.channels.await_arrival(out_done, t.ins, in_done) {
                return Poll::Pending;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::coll::tag;
    use super::{
        record_header, unfold_tag, Counters, Kind, Slot, INLINE_COUNTERS, MIN_SLOT, PACKED, PIPELINED,
        SEQ_BITS, SEQ_MASK, SLOT, SUBS,
    };

    #[test]
    fn record_header_keeps_number_length_and_tag() {
        let tags = [
            tag::BARRIER,
            tag::BROADCAST,
            tag::REDUCE,
            tag::GATHER,
            tag::ALLGATHER,
            tag::SCATTER,
            tag::ALLTOALL,
            tag::SCAN,
            tag::ALLREDUCE,
        ];
        for t in tags.into_iter().flat_map(|t| [t, t | PIPELINED]) {
            for len in 0..=PACKED {
                for m in [1, 2, 63, 64, SEQ_MASK, SEQ_MASK + 5] {
                    let h = record_header(m, len, t);
                    assert_eq!(h & SEQ_MASK, m & SEQ_MASK);
                    assert_eq!((h >> SEQ_BITS) & 0xf, len as u64);
                    assert_eq!(unfold_tag(h >> 48), t, "tag {t:#x} does not survive folding");
                }
            }
        }
        // Different tags or lengths give different headers for one message number.
        assert_ne!(record_header(7, 8, tag::BROADCAST), record_header(7, 8, tag::BROADCAST | PIPELINED));
        assert_ne!(record_header(7, 8, tag::BROADCAST), record_header(7, 0, tag::BROADCAST));
    }

    #[test]
    fn slots_shrink_with_the_team_within_the_budget() {
        let budget = 4096 << 10;
        let kib = |n| Slot::for_team(n, budget).bytes() >> 10;
        assert_eq!(
            [kib(1), kib(2), kib(16), kib(17), kib(64), kib(128), kib(192)],
            [256, 256, 256, 128, 64, 32, 16]
        );
        assert_eq!(Slot::for_team(100_000, budget).bytes(), MIN_SLOT);
        assert_eq!(Slot::for_team(4, 0).bytes(), MIN_SLOT);
        assert_eq!(Slot::for_team(2, usize::MAX).bytes(), SLOT);
        // Chunks cover a message exactly, within the slot, for every slot size.
        for s in [MIN_SLOT, 32 << 10, SLOT].map(|b| Slot::for_team(1, b)) {
            for pipelined in [false, true] {
                for len in [0, 1, s.sub() + 1, s.bytes(), 3 * s.bytes() + 5] {
                    let mut next = 0;
                    for j in 0..s.chunks(len, pipelined) {
                        let r = s.chunk_range(j, len, pipelined);
                        assert_eq!(r.start, next);
                        assert!(s.chunk_at(j, pipelined) + r.len() <= s.bytes());
                        next = r.end;
                    }
                    assert_eq!(next, len);
                }
            }
            assert!(s.sub_slot(SUBS as u64 - 1) + s.sub() <= s.bytes());
            assert!(matches!(s.kind(s.sub()), Kind::Sub) && matches!(s.kind(s.sub() + 1), Kind::Whole));
        }
    }

    #[test]
    fn counters_inline_then_heap() {
        let mut small = Counters::zeroed(3);
        assert!(matches!(small, Counters::Inline(_)), "a small transfer must not allocate");
        assert!(small.get().iter().all(|&c| c == 0));
        let mut big = Counters::zeroed(INLINE_COUNTERS + 1);
        assert_eq!(big.get().len(), INLINE_COUNTERS + 1);
        assert!(big.get().iter().all(|&c| c == 0));
    }
}
