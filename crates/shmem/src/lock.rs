//! Distributed locks (`shmem_set_lock`, `shmem_test_lock`, `shmem_clear_lock`): a ticket lock
//! in PE 0's copy of the symmetric `long`, high 32 bits the next ticket, low 32 the ticket
//! served. Tickets are taken with one remote fetch-and-add (its carry out of bit 63 is lost,
//! so both halves wrap alike), the served half moves by compare-and-swap, and a waiter polls
//! PE 0's word with weft's backing-off wait, so PEs get the lock in the order they asked.
//!
//! Misuse is named rather than left to break the lock for good:
//! - each PE keeps the locks it holds (and their tickets); a clear of one it does not hold
//!   ends the job naming `shmem_clear_lock` and who holds it;
//! - the holder writes "ticket t is PE p's" into PE 1's copy of the lock (an implicit store,
//!   completed by its clear's `quiet` before the lock moves on), so a waiter that waits long
//!   names the lock and the PE holding it, and fails if that PE is gone.

use crate::state::{die, st, Shmem};
use std::ffi::c_long;
use std::time::{Duration, Instant};
use weft_runtime::{AtomicOp, GlobalPtr};

const TICKET: u64 = 1 << 32;

/// PE 0's copy of `lock`, checked (symmetric, 8-byte aligned: the runtime's atomics say so).
fn word(s: &Shmem, call: &str, lock: *mut c_long) -> GlobalPtr<u64> {
    s.sym(call, lock.cast(), 8, 0).cast()
}

/// Where the holder of `lock` says who it is: PE 1's copy (none with one PE).
fn holder_word(s: &Shmem, call: &str, lock: *mut c_long) -> Option<GlobalPtr<u64>> {
    (s.n > 1).then(|| s.sym(call, lock.cast(), 8, 1).cast())
}

/// This PE now holds `lock` with ticket `mine`: noted here, and published for waiters.
fn took(s: &Shmem, call: &str, lock: *mut c_long, mine: u32) {
    s.locks_held().insert(lock as usize, mine);
    if let Some(h) = holder_word(s, call, lock) {
        let says = (mine as u64) << 32 | (s.me as u64 + 1);
        s.check(call, s.comm.atomic_nbi(h, AtomicOp::Store(says)));
    }
}

/// Who holds `lock`, whose word reads `cur`: `None` when nobody does; else the PE, where
/// known (`None` inside: the holder has not said yet), and the ticket served.
fn holder(s: &Shmem, call: &str, lock: *mut c_long, cur: u64) -> Option<(Option<u32>, u32)> {
    let served = cur as u32;
    if (cur >> 32) as u32 == served {
        return None;
    }
    if s.locks_held().get(&(lock as usize)) == Some(&served) {
        return Some((Some(s.me), served));
    }
    let pe = holder_word(s, call, lock).and_then(|h| {
        let says = s.check(call, s.comm.atomic(h, AtomicOp::Load));
        ((says >> 32) as u32 == served && says as u32 != 0).then(|| says as u32 - 1)
    });
    Some((pe, served))
}

#[no_mangle]
pub extern "C" fn shmem_set_lock(lock: *mut c_long) {
    let call = "shmem_set_lock";
    let s = st(call);
    let w = word(s, call, lock);
    if s.locks_held().contains_key(&(lock as usize)) {
        // OpenSHMEM locks are not recursive: its ticket would wait for its own for ever.
        die(call, format_args!("this PE already holds the lock at {lock:p} (locks are not recursive)"));
    }
    let mine = (s.check(call, s.comm.atomic(w, AtomicOp::FetchAdd(TICKET))) >> 32) as u32;
    let load = |s: &Shmem| s.comm.atomic(w, AtomicOp::Load);
    let mut cur = s.check(call, load(s));
    // Each round waits for the ticket served to move, depending on the PE that holds it.
    while cur as u32 != mine {
        let served = cur as u32;
        let (pe, _) = holder(s, call, lock, cur).unwrap_or((None, served));
        let whom = match pe {
            Some(p) if p == s.me => format!("held by this PE (PE {p}) itself"),
            Some(p) => format!("held by PE {p}"),
            None => format!("held by the PE with ticket {served}, which has not said which it is yet"),
        };
        let waiting = mine.wrapping_sub(served);
        let ahead = if waiting == 1 { "1 ticket".to_string() } else { format!("{waiting} tickets") };
        let what = format!("shmem_set_lock (the lock at {lock:p}, {whom}; {ahead} ahead of this PE's)");
        let mut err = None;
        let moved = |cur: &mut u64, err: &mut Option<_>| match load(s) {
            Ok(v) => {
                *cur = v;
                v as u32 != served
            }
            Err(e) => {
                *err = Some(e);
                true
            }
        };
        // A holder not known yet (it has not stored its word) is asked again every 10 ms.
        let ask_again = pe.is_none().then(|| Instant::now() + Duration::from_millis(10));
        let on = pe.filter(|&p| p != s.me);
        let r = s.comm.wait_until_written_from(on, &what, || {
            moved(&mut cur, &mut err) || ask_again.is_some_and(|t| Instant::now() >= t)
        });
        s.check(call, r);
        if let Some(e) = err {
            s.check::<()>(call, Err(e));
        }
    }
    took(s, call, lock, mine);
}

#[no_mangle]
pub extern "C" fn shmem_test_lock(lock: *mut c_long) -> i32 {
    let call = "shmem_test_lock";
    let s = st(call);
    let w = word(s, call, lock);
    let cur = s.check(call, s.comm.atomic(w, AtomicOp::Load));
    if (cur >> 32) as u32 != cur as u32 {
        return 1;
    }
    let prev = s.check(call, s.comm.compare_exchange(w, cur, cur.wrapping_add(TICKET)));
    if prev != cur {
        return 1;
    }
    took(s, call, lock, (cur >> 32) as u32);
    0
}

#[no_mangle]
pub extern "C" fn shmem_clear_lock(lock: *mut c_long) {
    let call = "shmem_clear_lock";
    let s = st(call);
    let w = word(s, call, lock);
    let held = s.locks_held().remove(&(lock as usize));
    let Some(mine) = held else {
        let cur = s.check(call, s.comm.atomic(w, AtomicOp::Load));
        let whom = match holder(s, call, lock, cur) {
            None => "nobody holds it".to_string(),
            Some((Some(pe), _)) => format!("PE {pe} holds it"),
            Some((None, t)) => format!("the PE with ticket {t} holds it"),
        };
        die(call, format_args!("the lock at {lock:p} is not held by this PE ({whom})"));
    };
    // What this PE wrote under the lock (its holder word too) is visible before the next
    // holder gets it.
    s.check(call, s.comm.sync_nbi());
    let mut cur = s.check(call, s.comm.atomic(w, AtomicOp::Load));
    loop {
        if cur as u32 != mine {
            die(
                call,
                format_args!(
                    "the lock at {lock:p} was taken from this PE (ticket {mine}, now {})",
                    cur as u32
                ),
            );
        }
        let next = (cur & !0xffff_ffff) | (cur as u32).wrapping_add(1) as u64;
        let prev = s.check(call, s.comm.compare_exchange(w, cur, next));
        if prev == cur {
            return;
        }
        cur = prev;
    }
}
