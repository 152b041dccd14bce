//! What identifies a team's collective call, and what happens when members disagree.
//!
//! Every collective of a team (blocking or not, and `split`, `subset`, `alloc_segment`) takes
//! the team's next call number, in program order, the same on every member of a correct
//! program. Its *descriptor* is one word: the call number's low 32 bits, the kind, the root
//! and a code of the bytes per member. A member publishes the descriptor of the call it runs
//! in its scratch (`Channels::publish_call`), and every message it sends carries the call in
//! its tag ([`tag_bits`]): lines the whole tag, packed records 15 bits of it (the kind, and
//! check bits that differ between consecutive calls and between roots).
//!
//! A member finds a disagreement three ways: a message whose tag or length is not what its
//! call expects (the channels); while it waits, at every peer check, a member whose published
//! call has the same number and another descriptor ([`Core::check`]); and in the exchanges of
//! `split`, `subset` and `alloc_segment`, whose contributions start with the descriptor. It
//! then writes a report — both calls and both team ranks — into every member's scratch and
//! raises their alarm ([`Core::fail`]). Every member's running call fails at its next peer
//! check, and every later call of the team fails at once: the team is unusable, not out of
//! step. A call whose own messages all agreed with it (a root that only sent; a member whose
//! root agreed with it while another member named another root) may have returned `Ok`; the
//! messages the disagreeing calls left carry their number, so the next call that meets them
//! fails instead of reading them. Telling such a root in the call itself takes hearing from every member, a
//! synchronisation per call: `WEFT_COLL_CHECK=strict` starts every call with it
//! ([`Core::agree`]).

use super::coll::tag;
use super::Core;
use crate::{Error, Result};
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::{Duration, Instant};

/// A team call as its member describes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    /// One of [`coll::tag`](super::coll::tag)'s kinds.
    pub kind: u64,
    /// The root's team rank, for rooted collectives.
    pub root: Option<u32>,
    /// Bytes per member where every member passes the same (0 where they may differ).
    pub bytes: usize,
}

impl Call {
    pub fn new(kind: u64, root: Option<u32>, bytes: usize) -> Call {
        Call { kind, root, bytes }
    }
}

/// Kind names, by the low four bits of a kind.
const NAMES: [&str; 16] = [
    "barrier",
    "broadcast",
    "reduce",
    "gather",
    "allgather",
    "scatter",
    "alltoall",
    "exscan",
    "allreduce",
    "split",
    "subset",
    "alloc_segment",
    "an unknown collective",
    "an unknown collective",
    "an unknown collective",
    "a call that failed on this member's own arguments",
];

/// The kind a member publishes for a call that failed on its own arguments before it moved
/// a message: the others' waits for that call then see a call of the same number that is not
/// theirs, unless they failed alike.
const FAILED_HERE: u64 = 0xf;

/// A root in 12 bits: 0 for none, root + 1 up to 4094, 4095 beyond.
#[inline(always)]
fn root_code(root: Option<u32>) -> u64 {
    root.map_or(0, |r| (r as u64 + 1).min(0xfff))
}

/// Bytes in 16 bits: exact below 2^15, else the bit length and the next 8 bits.
#[inline(always)]
fn bytes_code(bytes: usize) -> u64 {
    let b = bytes as u64;
    if b < 0x8000 {
        return b;
    }
    let len = 64 - b.leading_zeros() as u64;
    0x8000 | (len << 8) | ((b >> (len - 9)) & 0xff)
}

/// The descriptor of call number `c`.
#[inline(always)]
pub(crate) fn descriptor(c: u64, call: &Call) -> u64 {
    (c & 0xffff_ffff) << 32 | (call.kind & 0xf) << 28 | root_code(call.root) << 16 | bytes_code(call.bytes)
}

fn number(desc: u64) -> u64 {
    desc >> 32
}

/// A bytes code no size has: unknown.
const UNKNOWN_BYTES: u64 = 0xffff;

/// What a message's tag says of the call that sent it, as a descriptor: kind and root, and
/// the call number where the tag holds it (a flag line's does, a packed record's does not);
/// the bytes unknown.
pub(crate) fn descriptor_of_tag(tag: u64) -> u64 {
    (tag >> 33) << 32 | (tag & 0xf) << 28 | ((tag >> 16) & 0xfff) << 16 | UNKNOWN_BYTES
}

/// The bits a message of the call `desc` adds to its kind in its tag: the call number's low
/// 31 bits above the [`PIPELINED`](super::channel) bit (32), the root code in bits 16-27, and
/// in bits 8-14 check bits `(c + 43 * root) mod 128`, which a packed record keeps with the
/// kind: consecutive calls, and calls with roots less than 128 apart, differ in them.
#[inline(always)]
pub(crate) fn tag_bits(desc: u64) -> u64 {
    let (c, root) = (number(desc), (desc >> 16) & 0xfff);
    let check = (c + 43 * root) & 0x7f;
    (c & 0x7fff_ffff) << 33 | root << 16 | check << 8
}

/// A call in words, from its descriptor.
pub(crate) fn describe(desc: u64) -> String {
    if desc == 0 {
        return "no call yet".into();
    }
    let kind = NAMES[((desc >> 28) & 0xf) as usize];
    let root = match (desc >> 16) & 0xfff {
        0 => String::new(),
        0xfff => " from a root above 4093".into(),
        r => format!(" with root {}", r - 1),
    };
    let b = desc & 0xffff;
    let k = (desc >> 28) & 0xf;
    // Gathers are described by what every member agrees on: the bytes of all members.
    let per = if k == tag::GATHER & 0xf || k == tag::ALLGATHER & 0xf { "in all" } else { "per member" };
    let bytes = match b {
        UNKNOWN_BYTES | 0 => String::new(),
        // A subset's code is a digest of its range, not a size.
        b if k == tag::SUBSET & 0xf => format!(" (range digest {b:#x})"),
        b if b & 0x8000 == 0 => format!(" of {b} bytes {per}"),
        b => format!(" of about {} bytes {per}", ((b & 0xff) | 0x100) << (((b >> 8) & 0x7f) - 9)),
    };
    match number(desc) {
        0 => format!("{kind}{root}{bytes}"),
        c => format!("call #{c}: {kind}{root}{bytes}"),
    }
}

/// The kind and check bits a (possibly folded) tag names, in words.
pub(crate) fn describe_tag(tag: u64) -> String {
    let kind = match tag & 0xff {
        k @ tag::BARRIER..=0xbb => NAMES[(k & 0xf) as usize],
        _ => "an unknown collective",
    };
    match tag >> 33 {
        0 => format!("{kind} (check bits {:#x})", (tag >> 8) & 0x7f),
        c => format!("{kind} of call #{c}"),
    }
}

impl Core {
    /// Starts a call of this team (in program order): refuses it inside an AM handler or on a
    /// failed team, numbers it, finishes the non-blocking collectives called before it and
    /// makes it the running call. Returns its descriptor.
    #[inline]
    pub(super) fn open(&self, call: Call) -> Result<u64> {
        let desc = self.number(call)?;
        if self.queued.load(Ordering::Acquire) != 0 {
            self.drain()?;
        }
        self.publish(desc);
        if self.strict {
            self.run(pin!(self.agree(desc)))?;
        }
        Ok(desc)
    }

    /// With `WEFT_COLL_CHECK=strict`, the start of every call: publishes its descriptor and is
    /// ready when every other member has published this call or a later one; a member at
    /// this call's number with another descriptor fails it, on every member (each compares
    /// itself with all the others, so any two that differ fail everyone). A member found at a
    /// later call agreed: it could leave this call only after seeing this member in it, with
    /// the same descriptor.
    pub(super) async fn agree(&self, desc: u64) -> Result<()> {
        self.channels.publish_call(desc);
        std::future::poll_fn(|_| {
            let mut all = true;
            for t in (0..self.size()).filter(|&t| t != self.me) {
                let d = match self.channels.call_of(self, t) {
                    Ok(d) => d,
                    Err(e) => return Poll::Ready(Err(e)),
                };
                // Call numbers are the low 32 bits: compared modulo 2^32.
                let ahead = number(d).wrapping_sub(number(desc)) as u32 as i32;
                // A member that failed on its own arguments in this call reached it (it
                // may have seen this member agree); what it does not send fails the call.
                let failed_here = (d >> 28) & 0xf == FAILED_HERE;
                if d != 0 && ahead == 0 && d != desc && !failed_here {
                    let e = Error::Mismatch("members disagree".into());
                    return Poll::Ready(Err(self.fail(e, Some((t, d)))));
                }
                let arrived = d != 0 && ahead >= 0;
                self.channels.set_needed(t, !arrived);
                all &= arrived;
            }
            if all {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        })
        .await
    }

    /// Numbers a call (a non-blocking one becomes the running call when it starts to run).
    #[inline]
    pub(super) fn number(&self, call: Call) -> Result<u64> {
        // One local load on a working team.
        if self.channels.alarm() != 0 || crate::am::in_handler().is_some() {
            return Err(self.refuse());
        }
        let c = self.calls.load(Ordering::Relaxed) + 1;
        self.calls.store(c, Ordering::Relaxed);
        Ok(descriptor(c, &call))
    }

    /// Notes that team rank `src` sent a message with `tag`, which the running call does not
    /// expect: [`Core::fail`] names that call.
    #[cold]
    pub(super) fn note_mismatch(&self, src: usize, tag: u64) {
        *self.mismatched.lock().unwrap_or_else(|p| p.into_inner()) = Some((src, descriptor_of_tag(tag)));
    }

    /// Why a call cannot start.
    #[cold]
    fn refuse(&self) -> Error {
        match self.poisoned() {
            Some(e) => e,
            None => crate::am::refused("team collective inside an AM handler"),
        }
    }

    /// Makes `desc` the running call: its messages carry it. The other members read it only
    /// when one of them waits long enough for a peer check, so it is written where they can
    /// read it then ([`Core::check`]), not on every call.
    #[inline]
    pub(super) fn publish(&self, desc: u64) {
        self.current.store(desc, Ordering::Relaxed);
        self.current_tag.store(tag_bits(desc), Ordering::Relaxed);
    }

    /// The tag of the running call's messages of `kind`.
    #[inline]
    pub(super) fn tag(&self, kind: u64) -> u64 {
        kind | self.current_tag.load(Ordering::Relaxed)
    }

    /// Marks `e` as the running call's error on this member's own arguments, found before
    /// the call moved a message (see [`Core::close`]). A flag set on this cold path only: a
    /// store on every call's path cost a third of a back-to-back 8 B broadcast.
    #[cold]
    pub(super) fn bad_argument(&self, e: Error) -> Error {
        self.bad_argument.store(true, Ordering::Relaxed);
        e
    }

    /// The outcome of a call. An error on this member's own arguments ([`Core::bad_argument`],
    /// before the call moved a message) is published as such, which members that did not fail
    /// alike see as a disagreement. Any other error but a dead peer's makes the team unusable
    /// on every member (see [`Core::fail`]).
    #[inline(always)]
    pub(super) fn close<R>(&self, r: Result<R>) -> Result<R> {
        match r {
            Ok(v) => Ok(v),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// The error [`Core::close`] returns for `e`.
    #[cold]
    #[inline(never)]
    fn failed(&self, e: Error) -> Error {
        match e {
            e @ (Error::PeerFailed { .. } | Error::Fabric(_)) => e,
            e if self.bad_argument.swap(false, Ordering::Relaxed) && self.poisoned().is_none() => {
                let failed = self.current.load(Ordering::Relaxed) & !(0xf << 28) | FAILED_HERE << 28;
                self.publish(failed);
                self.channels.publish_call(failed);
                e
            }
            e => self.fail(e, None),
        }
    }

    /// The team's failure, once a member raised the alarm: the report it wrote, in words.
    #[cold]
    pub(super) fn poisoned(&self) -> Option<Error> {
        if let Some(e) = self.broken.get() {
            return Some(e.clone());
        }
        let alarm = self.channels.alarm();
        if alarm == 0 {
            return None;
        }
        let src = (alarm - 1) as usize;
        let [mine, theirs, other, _] = self.channels.report(src);
        let who = |t: u64| {
            let w = self.members.get(t as usize).map_or("?".into(), |w| w.to_string());
            format!("team rank {t} (world rank {w})")
        };
        let what = if mine == theirs {
            format!("{} failed in {}", who(src as u64), describe(mine))
        } else {
            format!(
                "{} called {}, {} called {}",
                who(src as u64),
                describe(mine),
                who(other),
                describe(theirs)
            )
        };
        let e = Error::Mismatch(format!("team {:#x} is unusable: {what}", self.id));
        Some(self.broken.get_or_init(|| e).clone())
    }

    /// Makes the team unusable on every member after `e` (this member's error in its running
    /// call), naming the other member's call where one is known (`theirs`: team rank and
    /// descriptor) or found: the first member whose published call has this call's number
    /// and another descriptor, or another number. Returns the team's error.
    #[cold]
    pub(super) fn fail(&self, e: Error, theirs: Option<(usize, u64)>) -> Error {
        if let Some(p) = self.poisoned() {
            return p;
        }
        let mine = self.current.load(Ordering::Relaxed);
        // The sender of a message of another call, else a member at this call's number with
        // another call, or already past it.
        let noted = self.mismatched.lock().unwrap_or_else(|p| p.into_inner()).take();
        let other = theirs.or(noted).or_else(|| {
            (0..self.size()).filter(|&t| t != self.me).find_map(|t| {
                let d = self.channels.call_of(self, t).ok()?;
                (d != mine && number(d) >= number(mine)).then_some((t, d))
            })
        });
        let (t, d) = other.unwrap_or((self.me, mine));
        self.channels.raise(self, [mine, d, t as u64, self.me as u64]);
        match (self.poisoned(), other) {
            // No other call to name: this member says what went wrong here as well.
            (Some(Error::Mismatch(team)), None) => Error::Mismatch(format!("{team}: {e}")),
            (Some(team), _) => team,
            (None, _) => e,
        }
    }

    /// What a wait of this team checks at every peer check: the alarm; a member that runs a
    /// call of the same number with another descriptor (it will never send what this call
    /// waits for); and a member this call still waits on that has gone on to a later call
    /// (it finished this one without sending what this member needs), seen so for
    /// [`PAST_GRACE`] so that a message still on its way is not taken for a missing one.
    #[cold]
    pub(super) fn check(&self) -> Option<Error> {
        if let Some(e) = self.poisoned() {
            return Some(e);
        }
        let mine = self.current.load(Ordering::Relaxed);
        // This member waits: the others may now read what it runs.
        self.channels.publish_call(mine);
        let mut past = None;
        for t in (0..self.size()).filter(|&t| t != self.me) {
            let Ok(d) = self.channels.call_of(self, t) else { continue };
            if number(d) == number(mine) && d != mine {
                return Some(self.fail(Error::Mismatch("members disagree".into()), Some((t, d))));
            }
            if number(d) > number(mine) && self.channels.needs(t) && past.is_none() {
                past = Some((t, d));
            }
        }
        let mut seen = self.past.lock().unwrap_or_else(|p| p.into_inner());
        let Some((t, d)) = past else {
            *seen = None;
            return None;
        };
        let since = match *seen {
            Some((st, sc, since)) if st == t && sc == mine => since,
            _ => seen.insert((t, mine, Instant::now())).2,
        };
        // On a load/store fabric a member's messages are in place when it moves on; over a
        // network its last puts may still be on their way.
        let grace = if self.comm.caps().load_store { PAST_GRACE } else { PAST_GRACE_NETWORK };
        if since.elapsed() < grace {
            return None;
        }
        drop(seen);
        Some(self.fail(Error::Mismatch("a member went past this call".into()), Some((t, d))))
    }
}

/// How long a member this call waits on must be seen at a later call before the call fails,
/// on a load/store fabric and over a network.
const PAST_GRACE: Duration = Duration::from_millis(20);
const PAST_GRACE_NETWORK: Duration = Duration::from_secs(2);

/// Checks a call's descriptor against the ones every member put in front of its contribution
/// to an exchange (`split`, `subset`, `alloc_segment`); returns the contributions without
/// them.
pub(super) fn strip_descriptors(core: &Core, mine: u64, all: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::with_capacity(all.len());
    for (t, mut d) in all.into_iter().enumerate() {
        let theirs = d.get(..8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
        if theirs != mine {
            return Err(core.fail(Error::Mismatch("members disagree".into()), Some((t, theirs))));
        }
        d.drain(..8);
        out.push(d);
    }
    Ok(out)
}

/// The words of `Channels` a call needs, for the tests.
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_tell_calls_apart_and_read_back() {
        let b = descriptor(7, &Call::new(tag::BROADCAST, Some(1), 512 << 10));
        assert_eq!(describe(b), "call #7: broadcast with root 1 of about 524288 bytes per member");
        let a = descriptor(7, &Call::new(tag::ALLREDUCE, None, 8));
        assert_eq!(describe(a), "call #7: allreduce of 8 bytes per member");
        assert_ne!(b, descriptor(7, &Call::new(tag::BROADCAST, Some(0), 512 << 10)));
        assert_ne!(a, descriptor(8, &Call::new(tag::ALLREDUCE, None, 8)));
        assert_ne!(a, descriptor(7, &Call::new(tag::ALLREDUCE, None, 16)));
        assert_eq!(describe(descriptor(1, &Call::new(tag::SPLIT, None, 0))), "call #1: split");
        // Gathers carry the bytes of all members (counts may differ between members).
        let g = descriptor(2, &Call::new(tag::GATHER, Some(0), 8));
        assert_eq!(describe(g), "call #2: gather with root 0 of 8 bytes in all");
    }

    #[test]
    fn folded_tags_differ_between_consecutive_calls_and_roots() {
        let fold = |desc: u64| (tag::BROADCAST | tag_bits(desc)) & 0x7fff;
        for c in 1..3000u64 {
            let d = |c, r| descriptor(c, &Call::new(tag::BROADCAST, Some(r), 8));
            assert_ne!(fold(d(c, 0)), fold(d(c + 1, 0)), "calls {c} and {}", c + 1);
            for r in 1..100 {
                assert_ne!(fold(d(c, 0)), fold(d(c, r)), "call {c}, roots 0 and {r}");
            }
        }
        // The kind stays readable, and the full tag names the call.
        let t = tag::REDUCE | tag_bits(descriptor(42, &Call::new(tag::REDUCE, Some(2), 8)));
        assert_eq!(describe_tag(t), "reduce of call #42");
        assert!(describe_tag(t & 0x7fff).starts_with("reduce (check bits"));
    }
}
