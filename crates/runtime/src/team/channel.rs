//! Point-to-point channels between the members of a team, built on one-sided operations: the
//! sender puts a chunk into its slot in the receiver's scratch and then stores the chunk's
//! number into the receiver's `filled` flag; the receiver copies the chunk out and stores the
//! number into its own `drained` flag, which the sender reads (remote atomic load) before it
//! reuses the slot. Every collective is a sequence of [`Channels::transfer`]s.
//!
//! Scratch layout on each member, `n` members: flags (`u64`, one 64-byte line each) —
//! `in[src] = [filled, message bytes, tag]` for `src` in `0..n`, then `drained[src]` — and
//! data, one slot of [`SLOT`] bytes per source.

use super::Team;
use crate::progress::Deps;
use crate::{Error, Result, Segment};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// Bytes of one chunk (one slot per source in every member's scratch).
pub const SLOT: usize = 256 << 10;
/// `u64` words per flag line.
const LINE: usize = 8;

pub(crate) struct Channels {
    scratch: Option<(Segment<u64>, Segment<u8>)>,
    /// Chunks sent to each member and received from each member, since the team was made.
    counts: Mutex<(Vec<u64>, Vec<u64>)>,
}

/// A message to one member.
pub(crate) struct Out<'a> {
    pub to: usize,
    pub data: &'a [u8],
}

/// A message from one member, of a length both sides know.
pub(crate) struct In<'a> {
    pub from: usize,
    pub out: &'a mut [u8],
}

/// Chunks of a message of `len` bytes (an empty message is one empty chunk: it still tells
/// the receiver the sender got there).
fn chunks(len: usize) -> u64 {
    len.div_ceil(SLOT).max(1) as u64
}

impl Channels {
    pub fn empty() -> Self {
        Channels { scratch: None, counts: Mutex::new((vec![], vec![])) }
    }

    /// Allocates the team's scratch (collective over the team).
    pub fn new(team: &Team<'_>) -> Result<Self> {
        let n = team.members.len();
        let flags = team.alloc_segment::<u64>(2 * n * LINE)?;
        let slots = team.alloc_segment::<u8>(n * SLOT)?;
        Ok(Channels { scratch: Some((flags, slots)), counts: Mutex::new((vec![0; n], vec![0; n])) })
    }

    /// Moves all `outs` and `ins` (none to or from this rank itself) concurrently, chunk by
    /// chunk, making progress until all are done. `tag` names the collective: a receiver that
    /// finds another tag or length than it expects reports the mismatch instead of reading it.
    pub fn transfer(&self, team: &Team<'_>, tag: u64, outs: &[Out<'_>], ins: &mut [In<'_>]) -> Result<()> {
        let (flags, slots) = self.scratch.as_ref().ok_or(Error::Misuse("team scratch not allocated"))?;
        let comm = team.comm;
        let (me, n) = (team.me, team.members.len());
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let (sent, recvd) = &mut *counts;
        // Chunks of each message moved so far.
        let mut out_done = vec![0u64; outs.len()];
        let mut in_done = vec![0u64; ins.len()];
        let local = flags.local();
        let mut failed: Option<Error> = None;
        // Members a message is still owed to or from: the ones this transfer depends on.
        let pending: Vec<std::cell::Cell<bool>> = (0..n).map(|_| std::cell::Cell::new(false)).collect();
        outs.iter().for_each(|o| pending[o.to].set(true));
        ins.iter().for_each(|i| pending[i.from].set(true));
        let needed = |w: u32| team.team_rank(w).is_some_and(|t| pending[t as usize].get());
        let mut step = || -> Result<bool> {
            let mut all = true;
            for (o, done) in outs.iter().zip(out_done.iter_mut()) {
                let total = chunks(o.data.len());
                while *done < total {
                    let dst = team.members[o.to];
                    // The slot is free once the receiver drained everything sent before.
                    let drained = comm.atomic_load(flags.at(dst, (n + me) * LINE))?;
                    if drained < sent[o.to] {
                        break;
                    }
                    let at = *done as usize * SLOT;
                    let chunk = &o.data[at..(at + SLOT).min(o.data.len())];
                    if !chunk.is_empty() {
                        comm.put(slots.at(dst, me * SLOT), chunk)?;
                    }
                    comm.put(flags.at(dst, me * LINE + 1), &[o.data.len() as u64, tag])?;
                    sent[o.to] += 1;
                    comm.atomic_store(flags.at(dst, me * LINE), sent[o.to])?;
                    *done += 1;
                }
                all &= *done == total;
                pending[o.to].set(*done < total);
            }
            for (i, done) in ins.iter_mut().zip(in_done.iter_mut()) {
                let total = chunks(i.out.len());
                while *done < total {
                    let src = i.from;
                    if local.atomic(src * LINE).load(Ordering::Acquire) <= recvd[src] {
                        break;
                    }
                    let (len, their_tag) = (local.read(src * LINE + 1), local.read(src * LINE + 2));
                    if their_tag != tag || len != i.out.len() as u64 {
                        return Err(Error::Mismatch(format!(
                            "team rank {src} (world rank {}) sent {len} bytes for collective {their_tag:#x}, team rank {me} expects {} bytes for {tag:#x}",
                            team.members[src],
                            i.out.len()
                        )));
                    }
                    let at = *done as usize * SLOT;
                    let end = (at + SLOT).min(i.out.len());
                    slots.local().copy_out(src * SLOT, &mut i.out[at..end]);
                    recvd[src] += 1;
                    local.atomic((n + src) * LINE).store(recvd[src], Ordering::Release);
                    *done += 1;
                }
                all &= *done == total;
                pending[i.from].set(pending[i.from].get() || *done < total);
            }
            Ok(all)
        };
        comm.wait(Deps::Needed(&needed), || match step() {
            Ok(done) => done,
            Err(e) => {
                failed = Some(e);
                true
            }
        })?;
        failed.map_or(Ok(()), Err)
    }
}
