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
//! Send-ahead: each source has [`LINES`] flag lines in each receiver, used in turn, and its
//! slot doubles as `LINES` sub-slots of [`SUB`] bytes, so a sender may be up to `LINES`
//! messages ahead of the receiver as long as they fit a sub-slot (message `m` uses line and
//! sub-slot `(m - 1) % LINES`, free once message `m - LINES` was drained). A longer message
//! uses the whole slot in chunks of [`SLOT`] bytes: each waits until the receiver drained
//! everything before it, and sub-slots wait until it was drained. The sender caches the last
//! `drained` it read and reads it again only when the cached value says "not free", so
//! back-to-back small collectives do not pay a remote load each.
//!
//! Scratch layout on each member, `n` members: flags (`u64`, one 64-byte line each) —
//! `in[src][j] = [filled, message bytes, tag, address or 0, up to 32 bytes of data inline]`
//! for `src` in `0..n`, `j` in `0..LINES` (message number `m` uses line `(m - 1) % LINES`, and
//! `filled` holds `m`), then `drained[src]` — and data, one slot of [`SLOT`] bytes per source.

use super::Core;
use crate::{Error, Result, Segment};
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::task::Poll;
use weft_fabric::pod::{bytes_of, bytes_of_mut};

/// Bytes of one chunk (one slot per source in every member's scratch).
pub const SLOT: usize = 256 << 10;
/// `u64` words per flag line.
const LINE: usize = 8;
/// Messages up to this many bytes travel inside the flag line (words 4..8).
const INLINE: usize = 32;
/// Flag lines per source in each receiver: how many messages a sender may be ahead.
pub const LINES: usize = 8;
/// Messages up to this many bytes use one of the `LINES` sub-slots of their source's slot.
pub const SUB: usize = SLOT / LINES;

pub(crate) struct Channels {
    flags: Segment<u64>,
    slots: Segment<u8>,
    state: Mutex<State>,
}

struct State {
    /// Chunks sent to each member and received from each member, since the team was made.
    sent: Vec<u64>,
    recvd: Vec<u64>,
    /// The last `drained` read from each member (it only grows).
    drained: Vec<u64>,
    /// Number of the last message sent to each member through its whole slot (0: none).
    whole: Vec<u64>,
    /// Members the running transfer still owes a message to or waits on.
    pending: Vec<bool>,
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
    /// In sub-slot `(m - 1) % LINES` of the slot.
    Sub,
    /// Through the whole slot, in chunks of [`SLOT`] bytes.
    Whole,
}

impl Kind {
    fn of(len: usize) -> Kind {
        if len <= INLINE {
            Kind::Inline
        } else if len <= SUB {
            Kind::Sub
        } else {
            Kind::Whole
        }
    }
}

/// Byte offset, in a source's slot, of the sub-slot of message number `m = count + 1`.
fn sub_slot(count: u64) -> usize {
    (count as usize % LINES) * SUB
}

/// Chunks of a message of `len` bytes (an empty message is one empty chunk: it still tells
/// the receiver the sender got there).
fn chunks(len: usize) -> u64 {
    len.div_ceil(SLOT).max(1) as u64
}

impl Channels {
    /// Words of the flag segment for `n` members.
    pub fn flag_words(n: usize) -> usize {
        n * (LINES + 1) * LINE
    }
    /// Bytes of the slot segment for `n` members.
    pub fn slot_bytes(n: usize) -> usize {
        n * SLOT
    }

    /// Channels over a team's scratch segments (sized by [`Channels::flag_words`] and
    /// [`Channels::slot_bytes`]).
    pub fn new(flags: Segment<u64>, slots: Segment<u8>, n: usize) -> Self {
        let state = State {
            sent: vec![0; n],
            recvd: vec![0; n],
            drained: vec![0; n],
            whole: vec![0; n],
            pending: vec![false; n],
        };
        Channels { flags, slots, state: Mutex::new(state) }
    }

    /// True if the running transfer still owes team rank `t` a message or waits on it.
    pub fn needs(&self, t: usize) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).pending.get(t).copied().unwrap_or(false)
    }

    /// Moves all `outs` and `ins` (none to or from this rank itself) concurrently, chunk by
    /// chunk; ready when all are done. Each poll moves what it can without waiting (the
    /// caller makes progress between polls). `tag` names the collective: a receiver that finds
    /// another tag or length than it expects reports the mismatch instead of reading it.
    pub async fn transfer(
        &self,
        team: &Core<'_>,
        tag: u64,
        outs: &[Out<'_>],
        ins: &mut [In<'_>],
    ) -> Result<()> {
        // Progress per message, on the stack for up to INLINE_COUNTERS messages each way (no
        // allocation in a small collective, where malloc and free would cost as much as
        // the messages).
        let (mut out_inline, mut in_inline) = ([0u64; INLINE_COUNTERS], [0u64; INLINE_COUNTERS]);
        let (mut out_heap, mut in_heap) = (Vec::new(), Vec::new());
        let out_done = counters(&mut out_inline, &mut out_heap, outs.len());
        let in_done = counters(&mut in_inline, &mut in_heap, ins.len());
        poll_fn(|_| match self.step(team, tag, outs, ins, out_done, in_done) {
            Ok(false) => Poll::Pending,
            Ok(true) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e)),
        })
        .await
    }

    /// One pass over a transfer: sends the chunks whose slots are free, takes the chunks that
    /// arrived. True when everything is done.
    fn step(
        &self,
        team: &Core<'_>,
        tag: u64,
        outs: &[Out<'_>],
        ins: &mut [In<'_>],
        out_done: &mut [u64],
        in_done: &mut [u64],
    ) -> Result<bool> {
        let (flags, slots, comm) = (&self.flags, &self.slots, team.comm);
        let (me, n) = (team.me, team.members.len());
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let State { sent, recvd, drained, whole, pending } = &mut *st;
        pending.iter_mut().for_each(|p| *p = false);
        let local = flags.local();
        let mut all = true;
        let direct_min = if comm.caps().peer_read { comm.cfg.coll_direct_bytes } else { usize::MAX };
        for (o, done) in outs.iter().zip(out_done.iter_mut()) {
            let dst = team.members[o.to];
            // True once the receiver drained `need` messages (the cached count first).
            let mut drained_at_least = |need: u64| -> Result<bool> {
                if drained[o.to] < need {
                    drained[o.to] = comm.atomic_load(flags.at(dst, (n * LINES + me) * LINE))?;
                }
                Ok(drained[o.to] >= need)
            };
            // Message number m = sent + 1 goes into line (m - 1) % LINES, free once message
            // m - LINES was drained.
            let line = |sent: u64| (me * LINES + (sent as usize % LINES)) * LINE;
            let line_free = |sent: u64| (sent + 1).saturating_sub(LINES as u64);
            // Writes the line's words after `filled` (header, and inline data) and then stores
            // the message number into `filled`, in one put with signal.
            let publish = |sent: u64, words: &[u64]| -> Result<()> {
                comm.put_signal(flags.at(dst, line(sent) + 1), words, flags.at(dst, line(sent)), sent + 1)?;
                comm.fabric.notify(dst);
                Ok(())
            };
            let header = |addr: u64| [o.data.len() as u64, tag, addr];
            if o.data.len() >= direct_min {
                // 0: not announced; 1: announced, the receiver is reading; 2: read.
                if *done == 0 && drained_at_least(line_free(sent[o.to]))? {
                    publish(sent[o.to], &header(o.data.as_ptr() as u64))?;
                    sent[o.to] += 1;
                    *done = 1;
                }
                // The buffer is free again once the receiver drained this very message.
                if *done == 1 && drained_at_least(sent[o.to])? {
                    *done = 2;
                }
                all &= *done == 2;
                pending[o.to] |= *done < 2;
                continue;
            }
            let total = chunks(o.data.len());
            let kind = Kind::of(o.data.len());
            while *done < total {
                // A message needs its line; in a sub-slot also the end of the last whole-slot
                // message; a whole-slot chunk needs everything sent before drained.
                let need = match kind {
                    Kind::Inline => line_free(sent[o.to]),
                    Kind::Sub => line_free(sent[o.to]).max(whole[o.to]),
                    Kind::Whole => sent[o.to],
                };
                if !drained_at_least(need)? {
                    break;
                }
                let at = *done as usize * SLOT;
                let chunk = &o.data[at..(at + SLOT).min(o.data.len())];
                match kind {
                    Kind::Inline => {
                        // Header and data in the flag's line: one put with signal.
                        let mut words = [o.data.len() as u64, tag, 0, 0, 0, 0, 0];
                        bytes_of_mut(&mut words[3..])[..chunk.len()].copy_from_slice(chunk);
                        publish(sent[o.to], &words)?;
                    }
                    Kind::Sub => {
                        comm.put(slots.at(dst, me * SLOT + sub_slot(sent[o.to])), chunk)?;
                        publish(sent[o.to], &header(0))?;
                    }
                    Kind::Whole => {
                        comm.put(slots.at(dst, me * SLOT), chunk)?;
                        publish(sent[o.to], &header(0))?;
                        whole[o.to] = sent[o.to] + 1;
                    }
                }
                sent[o.to] += 1;
                *done += 1;
            }
            all &= *done == total;
            pending[o.to] |= *done < total;
        }
        for (i, done) in ins.iter_mut().zip(in_done.iter_mut()) {
            let total = chunks(i.out.len());
            let src = i.from;
            while *done < total {
                let base = (src * LINES + recvd[src] as usize % LINES) * LINE;
                if local.atomic(base).load(Ordering::Acquire) <= recvd[src] {
                    break;
                }
                let (len, their_tag, addr) =
                    (local.read(base + 1), local.read(base + 2), local.read(base + 3));
                if their_tag != tag || len != i.out.len() as u64 {
                    return Err(Error::Mismatch(format!(
                        "team rank {src} (world rank {}) sent {len} bytes for collective {their_tag:#x}, team rank {me} expects {} bytes for {tag:#x}",
                        team.members[src],
                        i.out.len()
                    )));
                }
                if addr != 0 {
                    // Announced for a direct read: the whole message, straight from the
                    // sender's buffer.
                    comm.read_peer(team.members[src], addr, i.out)?;
                    *done = total;
                } else {
                    match Kind::of(i.out.len()) {
                        Kind::Inline => {
                            let mut words = [0u64; 4];
                            local.copy_out(base + 4, &mut words);
                            i.out.copy_from_slice(&bytes_of(&words)[..i.out.len()]);
                        }
                        Kind::Sub => slots.local().copy_out(src * SLOT + sub_slot(recvd[src]), i.out),
                        Kind::Whole => {
                            let at = *done as usize * SLOT;
                            let end = (at + SLOT).min(i.out.len());
                            slots.local().copy_out(src * SLOT, &mut i.out[at..end]);
                        }
                    }
                    *done += 1;
                }
                recvd[src] += 1;
                local.atomic((n * LINES + src) * LINE).store(recvd[src], Ordering::Release);
                comm.fabric.notify(team.members[src]);
            }
            all &= *done == total;
            pending[src] |= *done < total;
        }
        Ok(all)
    }
}

/// Members a small alltoall describes without allocating.
pub(crate) const INLINE_PEERS: usize = 16;
/// Messages each way a transfer counts without allocating (few: the counters are zeroed on
/// every transfer, and a tree or ring step has one or two).
const INLINE_COUNTERS: usize = 4;

/// `len` zeroed counters: the front of `inline` if it is long enough, else `heap`, grown.
fn counters<'a>(inline: &'a mut [u64], heap: &'a mut Vec<u64>, len: usize) -> &'a mut [u64] {
    if len <= inline.len() {
        &mut inline[..len]
    } else {
        heap.resize(len, 0);
        heap
    }
}

#[cfg(test)]
mod tests {
    use super::{counters, INLINE_COUNTERS};

    #[test]
    fn counters_inline_then_heap() {
        let (mut inline, mut heap) = ([0u64; INLINE_COUNTERS], Vec::new());
        assert_eq!(counters(&mut inline, &mut heap, 3).len(), 3);
        assert!(heap.is_empty(), "a small transfer must not allocate");
        let big = counters(&mut inline, &mut heap, INLINE_COUNTERS + 1);
        assert_eq!(big.len(), INLINE_COUNTERS + 1);
        assert!(big.iter().all(|&c| c == 0));
    }
}
