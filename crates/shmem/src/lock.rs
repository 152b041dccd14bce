//! Distributed locks (`shmem_set_lock`, `shmem_test_lock`, `shmem_clear_lock`): a ticket lock
//! in PE 0's copy of the symmetric `long`, high 32 bits the next ticket, low 32 the ticket
//! served. Tickets are taken with one remote fetch-and-add (its carry out of bit 63 is lost,
//! so both halves wrap alike), the served half moves by compare-and-swap, and a waiter polls
//! PE 0's word with weft's backing-off wait, so PEs get the lock in the order they asked.

use crate::state::{st, Shmem};
use std::ffi::c_long;
use weft_runtime::{AtomicOp, GlobalPtr};

const TICKET: u64 = 1 << 32;

/// PE 0's copy of `lock`, checked (symmetric, 8-byte aligned: the runtime's atomics say so).
fn word(s: &Shmem, call: &str, lock: *mut c_long) -> GlobalPtr<u64> {
    s.sym(call, lock.cast(), 8, 0).cast()
}

#[no_mangle]
pub extern "C" fn shmem_set_lock(lock: *mut c_long) {
    let call = "shmem_set_lock";
    let s = st(call);
    let w = word(s, call, lock);
    let mine = (s.check(call, s.comm.atomic(w, AtomicOp::FetchAdd(TICKET))) >> 32) as u32;
    let served = |s: &Shmem| s.comm.atomic(w, AtomicOp::Load).map(|v| v as u32 == mine);
    if s.check(call, served(s)) {
        return;
    }
    let mut err = None;
    let r = s.comm.wait_until_written(|| match served(s) {
        Ok(done) => done,
        Err(e) => {
            err = Some(e);
            true
        }
    });
    s.check(call, r);
    if let Some(e) = err {
        s.check::<()>(call, Err(e));
    }
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
    (prev != cur) as i32
}

#[no_mangle]
pub extern "C" fn shmem_clear_lock(lock: *mut c_long) {
    let call = "shmem_clear_lock";
    let s = st(call);
    // What this PE wrote under the lock is visible before the next holder gets it.
    s.check(call, s.comm.sync_nbi());
    let w = word(s, call, lock);
    let mut cur = s.check(call, s.comm.atomic(w, AtomicOp::Load));
    loop {
        let next = (cur & !0xffff_ffff) | (cur as u32).wrapping_add(1) as u64;
        let prev = s.check(call, s.comm.compare_exchange(w, cur, next));
        if prev == cur {
            return;
        }
        cur = prev;
    }
}
