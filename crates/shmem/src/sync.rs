//! Ordering (`quiet`, `fence`), barriers, point-to-point synchronization (`wait_until`,
//! `test`) and signals.
//!
//! Waits spin on this PE's own memory with acquire loads while weft makes progress, backing
//! off to sleep as weft's waits do, so a PE waiting for a peer leaves the core to it; the
//! peers' puts to it ring no doorbell, so those sleeps last at most
//! [`weft_runtime::RMA_WAIT_SLEEP`] (`Comm::wait_until_written`).

use crate::amo::{amo, Amo, Word};
use crate::cabi;
use crate::ctx::{with_ctx, DEFAULT};
use crate::rma::put;
use crate::state::{die, st};
use std::ffi::{c_int, c_void};

/// `SHMEM_CMP_*` of `shmem.h`.
const CMP_EQ: c_int = 0;
const CMP_NE: c_int = 1;
const CMP_GT: c_int = 2;
const CMP_GE: c_int = 3;
const CMP_LT: c_int = 4;
const CMP_LE: c_int = 5;
/// `SHMEM_SIGNAL_SET` and `SHMEM_SIGNAL_ADD`.
const SIGNAL_SET: c_int = 0;
const SIGNAL_ADD: c_int = 1;

#[no_mangle]
pub extern "C" fn shmem_quiet() {
    let s = st("shmem_quiet");
    s.check("shmem_quiet", s.comm.sync_nbi());
}

/// Orders this thread's puts to each PE: weft's completion of them is the strongest order.
#[no_mangle]
pub extern "C" fn shmem_fence() {
    let s = st("shmem_fence");
    s.check("shmem_fence", s.comm.sync_nbi());
}

/// `shmem_barrier_all` and `shmem_sync_all`: the barrier of `SHMEM_TEAM_WORLD` (which
/// completes this thread's puts first, as `shmem_barrier_all` must).
fn barrier_all(call: &str) {
    let s = st(call);
    let (set, area) = crate::team::world(s, call);
    crate::coll::barrier(s, call, set, area, (crate::watch::SYNC, 0, 0));
}

#[no_mangle]
pub extern "C" fn shmem_barrier_all() {
    barrier_all("shmem_barrier_all");
}

#[no_mangle]
pub extern "C" fn shmem_sync_all() {
    barrier_all("shmem_sync_all");
}

/// Whether `a cmp b` holds; the end of the job for an unknown comparison.
pub(crate) fn holds<T: PartialOrd>(call: &str, a: T, cmp: c_int, b: T) -> bool {
    match cmp {
        CMP_EQ => a == b,
        CMP_NE => a != b,
        CMP_GT => a > b,
        CMP_GE => a >= b,
        CMP_LT => a < b,
        CMP_LE => a <= b,
        _ => die(call, format_args!("comparison {cmp} is not one of SHMEM_CMP_*")),
    }
}

/// Waits until this PE's `T` at `ivar` compares to `value` as `cmp` says; returns it.
pub(crate) fn wait_until<T: Word + PartialOrd>(call: &str, ivar: *const c_void, cmp: c_int, value: T) -> T {
    let s = st(call);
    holds(call, value, cmp, value);
    let addr = s.local_word(call, ivar, T::BYTES);
    let mut seen = T::from_w(cabi::load_local(addr, T::BYTES));
    if holds(call, seen, cmp, value) {
        return seen;
    }
    s.check(
        call,
        s.comm.wait_until_written(|| {
            seen = T::from_w(cabi::load_local(addr, T::BYTES));
            holds(call, seen, cmp, value)
        }),
    );
    seen
}

/// Whether this PE's `T` at `ivar` compares to `value` as `cmp` says (after making progress).
pub(crate) fn test<T: Word + PartialOrd>(call: &str, ivar: *const c_void, cmp: c_int, value: T) -> c_int {
    let s = st(call);
    let addr = s.local_word(call, ivar, T::BYTES);
    s.check(call, s.comm.poll());
    holds(call, T::from_w(cabi::load_local(addr, T::BYTES)), cmp, value) as c_int
}

macro_rules! p2p {
    ($($name:ident: $t:ty),* $(,)?) => {$(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            #[export_name = concat!("shmem_", stringify!($name), "_wait_until")]
            pub extern "C" fn wait_until_(ivar: *mut $t, cmp: c_int, value: $t) {
                wait_until::<$t>(concat!("shmem_", stringify!($name), "_wait_until"), ivar.cast(), cmp, value);
            }
            #[export_name = concat!("shmem_", stringify!($name), "_wait")]
            pub extern "C" fn wait_(ivar: *mut $t, value: $t) {
                wait_until::<$t>(concat!("shmem_", stringify!($name), "_wait"), ivar.cast(), CMP_NE, value);
            }
            #[export_name = concat!("shmem_", stringify!($name), "_test")]
            pub extern "C" fn test_(ivar: *mut $t, cmp: c_int, value: $t) -> c_int {
                test::<$t>(concat!("shmem_", stringify!($name), "_test"), ivar.cast(), cmp, value)
            }
        }
    )*};
}

// Table 11 of OpenSHMEM 1.5 (point-to-point synchronization types).
p2p! {
    int: i32, long: i64, longlong: i64, uint: u32, ulong: u64, ulonglong: u64,
    int32: i32, int64: i64, uint32: u32, uint64: u64, size: usize, ptrdiff: isize,
}

#[no_mangle]
pub extern "C" fn shmem_signal_fetch(sig_addr: *const u64) -> u64 {
    let s = st("shmem_signal_fetch");
    cabi::load_local(s.local_word("shmem_signal_fetch", sig_addr.cast(), 8), 8)
}

#[no_mangle]
pub extern "C" fn shmem_signal_wait_until(sig_addr: *mut u64, cmp: c_int, cmp_value: u64) -> u64 {
    wait_until::<u64>("shmem_signal_wait_until", sig_addr.cast(), cmp, cmp_value)
}

/// A signal's word, value and operation (`SHMEM_SIGNAL_SET` or `SHMEM_SIGNAL_ADD`).
struct Signal {
    addr: *mut u64,
    value: u64,
    op: c_int,
}

/// Puts `len` bytes on context `ctx`, then updates the signal once they are visible at the
/// target (on a context's endpoint: its put, completed, then the signal on the world's path
/// as every atomic).
fn put_signal(
    call: &str,
    ctx: *mut c_void,
    dest: *mut c_void,
    src: *const c_void,
    len: usize,
    sig: Signal,
    pe: c_int,
) {
    let (s, c, pe) = crate::ctx::target(call, ctx, pe);
    crate::rma::empty(call, src, len);
    let op = match sig.op {
        SIGNAL_SET => Amo::Set(sig.value),
        SIGNAL_ADD => Amo::Add(sig.value),
        op => die(call, format_args!("signal operation {op} is not SHMEM_SIGNAL_SET or SHMEM_SIGNAL_ADD")),
    };
    let g = s.sym(call, dest, len, pe);
    let bytes = cabi::src_bytes(src, len);
    let on_ep = match s.direct(dest, len, pe) {
        Some(_) => None,
        None => c.with_ep(|ep| ep.put_nbi(g, bytes).and_then(|()| ep.sync_nbi())),
    };
    match (on_ep, op) {
        (Some(r), _) => {
            s.check(call, r);
            amo::<u64>(call, DEFAULT, sig.addr.cast(), pe, op);
        }
        (None, Amo::Set(v)) => {
            let flag = s.sym(call, sig.addr.cast(), 8, pe).cast();
            s.check(call, s.comm.put_signal(g, bytes, flag, v));
        }
        (None, _) => {
            put(call, DEFAULT, dest, src, len, pe);
            amo::<u64>(call, DEFAULT, sig.addr.cast(), pe, op);
        }
    }
    // Wakes the target if it sleeps waiting for the signal (RMA rings no doorbell).
    s.check(call, s.comm.notify(s.pe(call, pe)));
}

/// `shmem_NAME_put_signal` and `_nbi` for the typed, sized and `mem` forms, with their
/// `shmem_ctx_` forms.
macro_rules! put_signal_typed {
    ($($name:ident $pre:literal $z:expr),* $(,)?) => {$(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            with_ctx!(call, ctx, concat!($pre, "_signal"), fn(dest: *mut c_void, source: *const c_void, nelems: usize, sig_addr: *mut u64, signal: u64, sig_op: c_int, pe: c_int) {
                let len = crate::rma::bytes(call, nelems, $z);
                put_signal(call, ctx, dest, source, len, Signal { addr: sig_addr, value: signal, op: sig_op }, pe)
            });
            with_ctx!(call, ctx, concat!($pre, "_signal_nbi"), fn(dest: *mut c_void, source: *const c_void, nelems: usize, sig_addr: *mut u64, signal: u64, sig_op: c_int, pe: c_int) {
                let len = crate::rma::bytes(call, nelems, $z);
                put_signal(call, ctx, dest, source, len, Signal { addr: sig_addr, value: signal, op: sig_op }, pe)
            });
        }
    )*};
}

mod put_signals {
    use super::*;
    put_signal_typed! {
    float "float_put" 4, double "double_put" 8, longdouble "longdouble_put" 16,
    char "char_put" 1, schar "schar_put" 1, short "short_put" 2, int "int_put" 4,
    long "long_put" 8, longlong "longlong_put" 8, uchar "uchar_put" 1,
    ushort "ushort_put" 2, uint "uint_put" 4, ulong "ulong_put" 8,
    ulonglong "ulonglong_put" 8, int8 "int8_put" 1, int16 "int16_put" 2,
    int32 "int32_put" 4, int64 "int64_put" 8, uint8 "uint8_put" 1,
    uint16 "uint16_put" 2, uint32 "uint32_put" 4, uint64 "uint64_put" 8,
    size "size_put" 8, ptrdiff "ptrdiff_put" 8,
    mem "putmem" 1, s8 "put8" 1, s16 "put16" 2, s32 "put32" 4, s64 "put64" 8, s128 "put128" 16,
    }
}
