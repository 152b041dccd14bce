//! Mismatched collective calls named, not hung: what collective call each PE waits in.
//!
//! A wait of a collective call that lasts (past its 1024th poll) stores a word saying which
//! call (kind, length, a reduction's operation and type or a broadcast's root, the set of
//! PEs, team or `pSync`) in a symmetric word of its PE, and clears it when the wait ends;
//! `shmem_finalize`, which waits in weft's runtime, stores its call for the whole call.
//! Calls whose waits end sooner cost a few register operations. A wait that
//! has lasted `WEFT_SHMEM_MISMATCH_S` seconds (default 5; 0: never) reads the other members'
//! words, and again as long later. If every other member waited in one call on the same set
//! throughout (its word unchanged, entry count included) and none is in this PE's call, the
//! calls cannot meet: the job ends naming each member's call.
//!
//! Nothing else is concluded. A member that does not wait may be computing; one in a call
//! on another set may wait for PEs outside this one; one with two threads waiting in
//! different calls is marked and not judged; a member in the same call means the calls
//! still meet. A program that asked for `SHMEM_THREAD_MULTIPLE` is not judged at all: a
//! thread of a member that is in another call may yet come to this one. A member that ran
//! ahead into the next call gave this PE all it needs from the call it left, so no member is
//! waited for from there. A member whose memory this PE maps is read with a load, another
//! (over a network) with an atomic read through the fabric, which needs nothing of its CPU.

use crate::coll::{Set, SyncArea};
use crate::state::{die, Shmem};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};
use weft_runtime::AtomicOp;

/// Kinds of call beyond [`crate::exchange`]'s (1 to 4).
pub(crate) const ALLTOALL: u8 = 5;
pub(crate) const ALLTOALLS: u8 = 6;
/// A set's barrier (`shmem_barrier`, `shmem_sync`, `shmem_team_sync`, and
/// `shmem_barrier_all` and `shmem_sync_all`, which the specification makes
/// `shmem_team_sync(SHMEM_TEAM_WORLD)`).
pub(crate) const SYNC: u8 = 7;
/// `shmem_finalize` (weft's runtime barrier).
const FINALIZE: u8 = 8;

/// Calls this PE published (the low 7 bits travel in its word).
static ENTRIES: AtomicU32 = AtomicU32::new(0);

/// The program asked for `SHMEM_THREAD_MULTIPLE`: a PE's threads may be in different
/// collective calls at once, and one that is not in the call awaited yet may still come to
/// it, so nothing is judged.
static THREADS: AtomicBool = AtomicBool::new(false);

/// Called by `shmem_init_thread(SHMEM_THREAD_MULTIPLE)`: see [`THREADS`].
pub(crate) fn threads_may_share_calls() {
    THREADS.store(true, Ordering::Relaxed);
}

/// Seconds a collective waits before reading its members' calls, from
/// `WEFT_SHMEM_MISMATCH_S` (`None`: never).
pub(crate) fn patience(call: &str) -> Option<Duration> {
    let secs = match std::env::var("WEFT_SHMEM_MISMATCH_S") {
        Ok(v) => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 1e6)
            .unwrap_or_else(|| {
                die(call, format_args!("WEFT_SHMEM_MISMATCH_S={v:?} is not a number of seconds (0: never)"))
            }),
        Err(_) => 5.0,
    };
    (secs > 0.0).then(|| Duration::from_secs_f64(secs))
}

/// A call's word without its set and entry count: bytes (saturated) in the high half, whether
/// on a team, the detail (a reduction's operation and type, a broadcast's root), the kind.
fn call_word(kind: u8, detail: u8, bytes: usize, team: bool) -> u64 {
    (bytes.min(u32::MAX as usize) as u64) << 32
        | (team as u64) << 31
        | (detail as u64) << 13
        | (kind as u64 & 0x1f) << 8
}

/// Call word `call` with the signature of `set` (bits 21-30) and entry count `entry`.
fn word(call: u64, set: Set, entry: u32) -> u64 {
    let Set { start, stride, size } = set;
    let mix = (start as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (stride as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ (size as u64).wrapping_mul(0x1656_67b1_9e37_79f9);
    call | (mix >> 54) << 21 | (entry & 0x7f) as u64
}

/// The call of a word, without its entry count.
fn call_of(word: u64) -> u64 {
    word & !0xff
}

/// The set of PEs of a word's call (team or `pSync` aside).
fn set_of(word: u64) -> u64 {
    word >> 21 & 0x3ff
}

/// Says a word's call in words.
fn describe(word: u64) -> String {
    let (kind, detail, bytes) = ((word >> 8 & 0x1f) as u8, (word >> 13) as u8, word >> 32);
    let team = if word >> 31 & 1 == 1 { "a team" } else { "a pSync" };
    match kind {
        crate::exchange::BROADCAST => {
            format!("a broadcast of {bytes} bytes from member {detail} (on {team})")
        }
        crate::exchange::COLLECT => format!("a collect of {bytes} bytes (on {team})"),
        crate::exchange::FCOLLECT => format!("an fcollect of {bytes} bytes (on {team})"),
        crate::exchange::REDUCE => {
            format!("a reduction ({}) of {bytes} bytes (on {team})", crate::coll::describe_reduction(detail))
        }
        ALLTOALL => format!("an alltoall of {bytes}-byte blocks (on {team})"),
        ALLTOALLS => format!("an alltoalls of {bytes} bytes per member (on {team})"),
        SYNC if word >> 31 & 1 == 1 => {
            "a barrier of a team (shmem_team_sync, or shmem_barrier_all or shmem_sync_all: all PEs)".into()
        }
        SYNC => "a barrier of an active set (shmem_barrier or shmem_sync)".into(),
        FINALIZE => "shmem_finalize".into(),
        _ => "an unknown call".into(),
    }
}

/// This PE's word.
fn own(s: &Shmem) -> &'static std::sync::atomic::AtomicU64 {
    crate::cabi::atomic_u64(s.internal_word(crate::team::CALL_WORD))
}

/// Set in a PE's word where another thread's call was there (the word names one call
/// only): the PE's calls are then not judged.
const SEVERAL: u64 = 0x80;

/// A collective call as its waits are given it: kind, detail (a reduction's operation and
/// type, a broadcast's root), bytes. Its word is made only where a wait lasts.
pub(crate) type Call = (u8, u8, usize);

/// `shmem_finalize` is under way until the guard drops: its barrier is weft's runtime's,
/// which publishes nothing, so the call is published at once.
pub(crate) struct Finalizing<'a>(&'a Shmem);

impl Drop for Finalizing<'_> {
    fn drop(&mut self) {
        own(self.0).store(0, Ordering::Release);
    }
}

/// Publishes `shmem_finalize` until the guard drops.
pub(crate) fn finalizing(s: &Shmem) -> Finalizing<'_> {
    let set = Set { start: 0, stride: 1, size: s.n };
    publish(s, word(call_word(FINALIZE, 0, 0, false), set, next_entry()));
    Finalizing(s)
}

/// A new entry count (a plain increment: two threads at once may take one count).
fn next_entry() -> u32 {
    let entry = ENTRIES.load(Ordering::Relaxed).wrapping_add(1);
    ENTRIES.store(entry, Ordering::Relaxed);
    entry
}

/// Stores `word` in this PE's word, or marks it [`SEVERAL`] where another call's is there.
/// Plain loads and stores: two threads at the very same moment may leave one of their calls
/// unmarked.
fn publish(s: &Shmem, word: u64) {
    let w = own(s);
    let there = w.load(Ordering::Relaxed);
    let mine = there == 0 || call_of(there) == call_of(word);
    w.store(if mine { word } else { there | SEVERAL }, Ordering::Release);
}

/// The words of the members of `set` other than this PE: a load where this PE maps the
/// member's memory, an atomic read through the fabric elsewhere (a network); `None` if one
/// cannot be read (the member is gone: the wait itself reports that).
fn words(s: &Shmem, call: &str, set: Set) -> Option<Vec<(u32, u64)>> {
    let at = s.internal_word(crate::team::CALL_WORD) as *const c_void;
    (0..set.size)
        .map(|i| set.pe(i))
        .filter(|&pe| pe != s.me)
        .map(|pe| {
            let word = match s.direct(at, 8, pe as i32) {
                Some(a) => crate::cabi::atomic_u64(a).load(Ordering::Acquire),
                None => s.comm.atomic(s.sym(call, at, 8, pe as i32).cast(), AtomicOp::Load).ok()?,
            };
            Some((pe, word))
        })
        .collect()
}

/// Waits until `cond` holds, which world PE `from` makes true, in collective call `call`
/// (kind, detail and bytes as given) on `set` over `area`; ends the job if the members' calls
/// cannot meet (see the module's notes), or if `from` died or finalized first.
pub(crate) fn wait(
    s: &Shmem,
    call: &str,
    (set, area, from): (Set, SyncArea, u32),
    (kind, detail, bytes): Call,
    mut cond: impl FnMut() -> bool,
) {
    let (Some(patience), false) = (s.patience, THREADS.load(Ordering::Relaxed)) else {
        return s.check(call, s.comm.wait_until_from(from, call, cond));
    };
    // From the 1024th poll on (tens of microseconds of spinning, well past a peer's arrival;
    // once the runtime sleeps, a poll per sleep of at most a few milliseconds), the wait
    // publishes its call and reads the clock every 64 polls.
    let (mut polls, mut start, mut next) = (0u32, None, patience);
    let mut mine = 0;
    let mut seen: Option<Vec<(u32, u64)>> = None;
    s.check(
        call,
        s.comm.wait_until_from(from, call, || {
            if cond() {
                return true;
            }
            polls = polls.wrapping_add(1);
            if polls < 1024 || polls % 64 != 0 {
                return false;
            }
            let since = *start.get_or_insert_with(|| {
                mine = word(call_word(kind, detail, bytes, area.calls.is_some()), set, next_entry());
                publish(s, mine);
                Instant::now()
            });
            if since.elapsed() < next {
                return false;
            }
            next += patience;
            let now = words(s, call, set);
            if now.is_some() && now == seen {
                judge(s, call, mine, now.as_deref().unwrap_or_default());
            }
            seen = now;
            false
        }),
    );
    if start.is_some() {
        own(s).store(0, Ordering::Release);
    }
}

/// Ends the job if every other member's unchanged word is a call on this PE's set and none
/// is this PE's call.
fn judge(s: &Shmem, call: &str, mine: u64, others: &[(u32, u64)]) {
    if own(s).load(Ordering::Relaxed) != mine {
        return;
    }
    let meets = others.iter().any(|&(_, w)| call_of(w) == call_of(mine));
    let all_here = others.iter().all(|&(_, w)| w != 0 && w & SEVERAL == 0 && set_of(w) == set_of(mine));
    if meets || !all_here {
        return;
    }
    let theirs: Vec<String> =
        others.iter().map(|&(pe, w)| format!("PE {pe} is in {}", describe(w))).collect();
    die(
        call,
        format_args!(
            "mismatched collective calls (each unchanged over {:.1} s): this PE is in {}; {}: every member must make the same collective calls in the same order",
            s.patience.unwrap_or_default().as_secs_f64(),
            describe(mine),
            theirs.join("; "),
        ),
    );
}
