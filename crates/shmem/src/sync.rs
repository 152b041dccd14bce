//! Ordering (`quiet`, `fence`), barriers, point-to-point synchronization (`wait_until`,
//! `test`) and signals.
//!
//! Waits spin on this PE's own memory with acquire loads while weft makes progress, backing
//! off to sleep as weft's waits do, so a PE waiting for a peer leaves the core to it.

use crate::amo::{amo, Amo, Word};
use crate::cabi;
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

#[no_mangle]
pub extern "C" fn shmem_barrier_all() {
    let s = st("shmem_barrier_all");
    s.check("shmem_barrier_all", s.comm.sync_nbi().and_then(|()| s.comm.barrier()));
}

#[no_mangle]
pub extern "C" fn shmem_sync_all() {
    let s = st("shmem_sync_all");
    s.check("shmem_sync_all", s.comm.barrier());
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
        s.comm.wait_until(|| {
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

/// Puts `len` bytes, then updates the signal once they are visible at the target.
fn put_signal(call: &str, dest: *mut c_void, src: *const c_void, len: usize, sig: Signal, pe: c_int) {
    let s = st(call);
    crate::rma::empty(call, src, len);
    match sig.op {
        SIGNAL_SET => {
            let g = s.sym(call, dest, len, pe);
            let flag = s.sym(call, sig.addr.cast(), 8, pe).cast();
            s.check(call, s.comm.put_signal(g, cabi::src_bytes(src, len), flag, sig.value));
        }
        SIGNAL_ADD => {
            put(call, dest, src, len, pe);
            amo::<u64>(call, sig.addr.cast(), pe, Amo::Add(sig.value));
        }
        op => die(call, format_args!("signal operation {op} is not SHMEM_SIGNAL_SET or SHMEM_SIGNAL_ADD")),
    }
    // Wakes the target if it sleeps waiting for the signal (RMA rings no doorbell).
    s.check(call, s.comm.notify(s.pe(call, pe)));
}

/// `shmem_NAME_put_signal` and `_nbi` for the typed, sized and `mem` forms.
macro_rules! put_signal_typed {
    ($($name:ident $pre:literal $z:expr),* $(,)?) => {$(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            #[export_name = concat!($pre, "_signal")]
            pub extern "C" fn ps(dest: *mut c_void, source: *const c_void, nelems: usize, sig_addr: *mut u64, signal: u64, sig_op: c_int, pe: c_int) {
                let call = concat!($pre, "_signal");
                let len = crate::rma::bytes(call, nelems, $z);
                put_signal(call, dest, source, len, Signal { addr: sig_addr, value: signal, op: sig_op }, pe)
            }
            #[export_name = concat!($pre, "_signal_nbi")]
            pub extern "C" fn ps_nbi(dest: *mut c_void, source: *const c_void, nelems: usize, sig_addr: *mut u64, signal: u64, sig_op: c_int, pe: c_int) {
                let call = concat!($pre, "_signal_nbi");
                let len = crate::rma::bytes(call, nelems, $z);
                put_signal(call, dest, source, len, Signal { addr: sig_addr, value: signal, op: sig_op }, pe)
            }
        }
    )*};
}

mod put_signals {
    use super::*;
    put_signal_typed! {
    float "shmem_float_put" 4, double "shmem_double_put" 8, longdouble "shmem_longdouble_put" 16,
    char "shmem_char_put" 1, schar "shmem_schar_put" 1, short "shmem_short_put" 2, int "shmem_int_put" 4,
    long "shmem_long_put" 8, longlong "shmem_longlong_put" 8, uchar "shmem_uchar_put" 1,
    ushort "shmem_ushort_put" 2, uint "shmem_uint_put" 4, ulong "shmem_ulong_put" 8,
    ulonglong "shmem_ulonglong_put" 8, int8 "shmem_int8_put" 1, int16 "shmem_int16_put" 2,
    int32 "shmem_int32_put" 4, int64 "shmem_int64_put" 8, uint8 "shmem_uint8_put" 1,
    uint16 "shmem_uint16_put" 2, uint32 "shmem_uint32_put" 4, uint64 "shmem_uint64_put" 8,
    size "shmem_size_put" 8, ptrdiff "shmem_ptrdiff_put" 8,
    mem "shmem_putmem" 1, s8 "shmem_put8" 1, s16 "shmem_put16" 2, s32 "shmem_put32" 4, s64 "shmem_put64" 8, s128 "shmem_put128" 16,
    }
}
