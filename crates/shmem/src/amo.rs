//! Atomic memory operations on symmetric objects of 32 and 64 bits.
//!
//! Every operation goes through weft's 64-bit remote atomics (native on shared memory and
//! where the provider offers them, active messages elsewhere): a 64-bit object is one such
//! atomic, a 32-bit one a compare-and-swap loop on the 8-byte word holding it. So 32- and
//! 64-bit operations are atomic with respect to each other, on every PE and context, also on
//! fabrics whose atomics are 64-bit only. The `_nbi` fetching forms complete before they
//! return (the fetched value is in place at once, earlier than `shmem_quiet` requires).

use crate::ctx::{with_ctx, DEFAULT};
use crate::state::{die, Shmem};
use std::ffi::{c_int, c_void};
use weft_runtime::{AtomicOp, GlobalPtr};

/// A C type an atomic operation applies to, as the bits of its word.
pub(crate) trait Word: Copy {
    const BYTES: usize;
    fn to_w(self) -> u64;
    fn from_w(w: u64) -> Self;
}

macro_rules! word {
    ($($t:ty: $b:literal, $to:expr, $from:expr);* $(;)?) => {$(
        impl Word for $t {
            const BYTES: usize = $b;
            #[inline]
            fn to_w(self) -> u64 {
                #[allow(clippy::redundant_closure_call)]
                ($to)(self)
            }
            #[inline]
            fn from_w(w: u64) -> Self {
                #[allow(clippy::redundant_closure_call)]
                ($from)(w)
            }
        }
    )*};
}

word! {
    i32: 4, |v: i32| v as u32 as u64, |w: u64| w as u32 as i32;
    u32: 4, |v: u32| v as u64, |w: u64| w as u32;
    i64: 8, |v: i64| v as u64, |w: u64| w as i64;
    u64: 8, |v: u64| v, |w: u64| w;
    isize: 8, |v: isize| v as u64, |w: u64| w as isize;
    usize: 8, |v: usize| v as u64, |w: u64| w as usize;
    f32: 4, |v: f32| v.to_bits() as u64, |w: u64| f32::from_bits(w as u32);
    f64: 8, |v: f64| v.to_bits(), |w: u64| f64::from_bits(w);
}

/// An atomic operation on a word's bits.
#[derive(Clone, Copy)]
pub(crate) enum Amo {
    Fetch,
    Set(u64),
    Swap(u64),
    CompareSwap { cond: u64, value: u64 },
    Add(u64),
    And(u64),
    Or(u64),
    Xor(u64),
}

impl Amo {
    /// The new 32-bit value for `old`, or `None` when nothing is written.
    fn apply32(self, old: u32) -> Option<u32> {
        match self {
            Amo::Fetch => None,
            Amo::Set(v) | Amo::Swap(v) => Some(v as u32),
            Amo::CompareSwap { cond, value } => (old == cond as u32).then_some(value as u32),
            Amo::Add(v) => Some(old.wrapping_add(v as u32)),
            Amo::And(v) => Some(old & v as u32),
            Amo::Or(v) => Some(old | v as u32),
            Amo::Xor(v) => Some(old ^ v as u32),
        }
    }
    fn op64(self) -> AtomicOp {
        match self {
            Amo::Fetch => AtomicOp::Load,
            Amo::Set(v) => AtomicOp::Store(v),
            Amo::Swap(v) => AtomicOp::Swap(v),
            Amo::CompareSwap { cond, value } => AtomicOp::CompareSwap { expected: cond, new: value },
            Amo::Add(v) => AtomicOp::FetchAdd(v),
            Amo::And(v) => AtomicOp::FetchAnd(v),
            Amo::Or(v) => AtomicOp::FetchOr(v),
            Amo::Xor(v) => AtomicOp::FetchXor(v),
        }
    }
}

/// Applies `op` to the `T` at symmetric address `dest` on `pe` (a member of context `ctx`'s
/// team); returns the previous value. Every context's atomics take the world's path.
pub(crate) fn amo<T: Word>(call: &str, ctx: *mut c_void, dest: *const c_void, pe: c_int, op: Amo) -> T {
    let (s, _, pe) = crate::ctx::target(call, ctx, pe);
    if !(dest as usize).is_multiple_of(T::BYTES) {
        die(call, format_args!("{dest:p} is not aligned to {} bytes", T::BYTES));
    }
    if let Some(at) = s.direct(dest, T::BYTES, pe) {
        return T::from_w(direct(at, T::BYTES, op));
    }
    let old = if T::BYTES == 8 {
        let g: GlobalPtr<u64> = s.sym(call, dest, 8, pe).cast();
        s.check(call, s.comm.atomic(g, op.op64()))
    } else {
        amo32(s, call, dest, pe, op) as u64
    };
    T::from_w(old)
}

/// Runs a fetching `_nbi` operation and writes its result to the caller's `fetch` (NULL is
/// an error, found before the operation runs).
#[inline]
fn fetch_out<T: Copy>(call: &str, fetch: *mut T, op: impl FnOnce() -> T) {
    if fetch.is_null() {
        die(call, "the fetch pointer is NULL");
    }
    crate::cabi::write_value(fetch, op())
}

thread_local! {
    /// The last value this thread saw of the last word a 32-bit operation used (rank,
    /// segment, offset, value): the first guess of the next compare-and-swap on it, which
    /// then needs no read first while no other PE changed the word.
    static LAST_WORD: std::cell::Cell<(u32, u32, usize, u64)> = const { std::cell::Cell::new((u32::MAX, 0, 0, 0)) };
}

/// `op` on the atomic `$a` whose values `$v` converts from the operation's bits.
macro_rules! on_atomic {
    ($a:expr, $v:expr, $op:expr) => {{
        use std::sync::atomic::Ordering::SeqCst;
        let (a, v) = ($a, $v);
        let old = match $op {
            Amo::Fetch => a.load(SeqCst),
            Amo::Set(x) => {
                a.store(v(x), SeqCst);
                0
            }
            Amo::Swap(x) => a.swap(v(x), SeqCst),
            Amo::CompareSwap { cond, value } => {
                a.compare_exchange(v(cond), v(value), SeqCst, SeqCst).unwrap_or_else(|c| c)
            }
            Amo::Add(x) => a.fetch_add(v(x), SeqCst),
            Amo::And(x) => a.fetch_and(v(x), SeqCst),
            Amo::Or(x) => a.fetch_or(v(x), SeqCst),
            Amo::Xor(x) => a.fetch_xor(v(x), SeqCst),
        };
        old as u64
    }};
}

/// `op` on the (aligned) word at `at`, mapped here: the CPU's own atomic instructions, of
/// the object's size, as weft's shared-memory atomics are.
fn direct(at: usize, size: usize, op: Amo) -> u64 {
    if size == 4 {
        on_atomic!(crate::cabi::atomic_u32(at), |x: u64| x as u32, op)
    } else {
        on_atomic!(crate::cabi::atomic_u64(at), |x: u64| x, op)
    }
}

/// A 32-bit operation as a compare-and-swap loop on the (little-endian) word that holds it.
fn amo32(s: &Shmem, call: &str, dest: *const c_void, pe: c_int, op: Amo) -> u32 {
    // The object first, so that an error names it rather than its word.
    s.sym(call, dest, 4, pe);
    let word_addr = (dest as usize & !7) as *const c_void;
    let word: GlobalPtr<u64> = s.sym(call, word_addr, 8, pe).cast();
    let shift = (dest as usize & 4) * 8;
    let key = (word.rank(), word.segment_id(), word.byte_offset());
    let last = LAST_WORD.get();
    let mut cur = if matches!(op, Amo::Fetch) || (last.0, last.1, last.2) != key {
        s.check(call, s.comm.atomic(word, AtomicOp::Load))
    } else {
        last.3
    };
    let old = loop {
        let old = (cur >> shift) as u32;
        let Some(new) = op.apply32(old) else { break old };
        let next = (cur & !(0xffff_ffffu64 << shift)) | ((new as u64) << shift);
        let prev = s.check(call, s.comm.compare_exchange(word, cur, next));
        if prev == cur {
            cur = next;
            break old;
        }
        cur = prev;
    };
    LAST_WORD.set((key.0, key.1, key.2, cur));
    old
}

/// The routines of one type: the standard set (fetch, set, swap, compare_swap, inc, add,
/// their fetching forms, `_nbi` fetching forms, with their `shmem_ctx_` forms, and the
/// deprecated names) for `standard`, fetch/set/swap only for `extended`, and the bitwise ones
/// for `bitwise`.
macro_rules! amo_routines {
    // A deprecated name of a fetching operation with a value (`swap`, `fadd`).
    (@old $name:ident $t:ty, $old:literal, $variant:ident) => {
        const _: () = {
            #[export_name = concat!("shmem_", stringify!($name), "_", $old)]
            pub extern "C" fn f(dest: *mut $t, value: $t, pe: c_int) -> $t {
                let call = concat!("shmem_", stringify!($name), "_", $old);
                amo::<$t>(call, DEFAULT, dest.cast(), pe, Amo::$variant(value.to_w()))
            }
        };
    };
    (@ext $name:ident $t:ty) => {
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_fetch"), fn(source: *const $t, pe: c_int) -> $t {
            amo::<$t>(call, ctx, source.cast(), pe, Amo::Fetch)
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_set"), fn(dest: *mut $t, value: $t, pe: c_int) {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::Set(value.to_w()));
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_swap"), fn(dest: *mut $t, value: $t, pe: c_int) -> $t {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::Swap(value.to_w()))
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_fetch_nbi"), fn(fetch: *mut $t, source: *const $t, pe: c_int) {
            fetch_out(call, fetch, || amo::<$t>(call, ctx, source.cast(), pe, Amo::Fetch))
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_swap_nbi"), fn(fetch: *mut $t, dest: *mut $t, value: $t, pe: c_int) {
            fetch_out(call, fetch, || amo::<$t>(call, ctx, dest.cast(), pe, Amo::Swap(value.to_w())))
        });
        #[export_name = concat!("shmem_", stringify!($name), "_fetch")]
        pub extern "C" fn fetch_old(source: *const $t, pe: c_int) -> $t {
            amo::<$t>(concat!("shmem_", stringify!($name), "_fetch"), DEFAULT, source.cast(), pe, Amo::Fetch)
        }
        #[export_name = concat!("shmem_", stringify!($name), "_set")]
        pub extern "C" fn set_old(dest: *mut $t, value: $t, pe: c_int) {
            amo::<$t>(concat!("shmem_", stringify!($name), "_set"), DEFAULT, dest.cast(), pe, Amo::Set(value.to_w()));
        }
        amo_routines!(@old $name $t, "swap", Swap);
    };
    (@std $name:ident $t:ty) => {
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_compare_swap"), fn(dest: *mut $t, cond: $t, value: $t, pe: c_int) -> $t {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::CompareSwap { cond: cond.to_w(), value: value.to_w() })
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_compare_swap_nbi"), fn(fetch: *mut $t, dest: *mut $t, cond: $t, value: $t, pe: c_int) {
            let op = Amo::CompareSwap { cond: cond.to_w(), value: value.to_w() };
            fetch_out(call, fetch, || amo::<$t>(call, ctx, dest.cast(), pe, op))
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_fetch_add"), fn(dest: *mut $t, value: $t, pe: c_int) -> $t {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::Add(value.to_w()))
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_fetch_add_nbi"), fn(fetch: *mut $t, dest: *mut $t, value: $t, pe: c_int) {
            fetch_out(call, fetch, || amo::<$t>(call, ctx, dest.cast(), pe, Amo::Add(value.to_w())))
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_add"), fn(dest: *mut $t, value: $t, pe: c_int) {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::Add(value.to_w()));
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_fetch_inc"), fn(dest: *mut $t, pe: c_int) -> $t {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::Add(1))
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_fetch_inc_nbi"), fn(fetch: *mut $t, dest: *mut $t, pe: c_int) {
            fetch_out(call, fetch, || amo::<$t>(call, ctx, dest.cast(), pe, Amo::Add(1)))
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_inc"), fn(dest: *mut $t, pe: c_int) {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::Add(1));
        });
        #[export_name = concat!("shmem_", stringify!($name), "_cswap")]
        pub extern "C" fn cswap_old(dest: *mut $t, cond: $t, value: $t, pe: c_int) -> $t {
            let op = Amo::CompareSwap { cond: cond.to_w(), value: value.to_w() };
            amo::<$t>(concat!("shmem_", stringify!($name), "_cswap"), DEFAULT, dest.cast(), pe, op)
        }
        amo_routines!(@old $name $t, "fadd", Add);
        #[export_name = concat!("shmem_", stringify!($name), "_add")]
        pub extern "C" fn add_old(dest: *mut $t, value: $t, pe: c_int) {
            amo::<$t>(concat!("shmem_", stringify!($name), "_add"), DEFAULT, dest.cast(), pe, Amo::Add(value.to_w()));
        }
        #[export_name = concat!("shmem_", stringify!($name), "_finc")]
        pub extern "C" fn finc_old(dest: *mut $t, pe: c_int) -> $t {
            amo::<$t>(concat!("shmem_", stringify!($name), "_finc"), DEFAULT, dest.cast(), pe, Amo::Add(1))
        }
        #[export_name = concat!("shmem_", stringify!($name), "_inc")]
        pub extern "C" fn inc_old(dest: *mut $t, pe: c_int) {
            amo::<$t>(concat!("shmem_", stringify!($name), "_inc"), DEFAULT, dest.cast(), pe, Amo::Add(1));
        }
    };
    (@bit $name:ident $t:ty, $($op:ident $variant:ident),*) => {$(
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_fetch_", stringify!($op)), fn(dest: *mut $t, value: $t, pe: c_int) -> $t {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::$variant(value.to_w()))
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_", stringify!($op)), fn(dest: *mut $t, value: $t, pe: c_int) {
            amo::<$t>(call, ctx, dest.cast(), pe, Amo::$variant(value.to_w()));
        });
        with_ctx!(call, ctx, concat!(stringify!($name), "_atomic_fetch_", stringify!($op), "_nbi"), fn(fetch: *mut $t, dest: *mut $t, value: $t, pe: c_int) {
            fetch_out(call, fetch, || amo::<$t>(call, ctx, dest.cast(), pe, Amo::$variant(value.to_w())))
        });
    )*};
}

macro_rules! amo_types {
    ($($kind:ident [$($name:ident: $t:ty),*]);* $(;)?) => {$($(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            amo_types!(@kind $kind $name $t);
        }
    )*)*};
    (@kind extended $name:ident $t:ty) => { amo_routines!(@ext $name $t); };
    (@kind standard $name:ident $t:ty) => { amo_routines!(@ext $name $t); amo_routines!(@std $name $t); };
    (@kind bitwise $name:ident $t:ty) => {
        amo_routines!(@ext $name $t);
        amo_routines!(@std $name $t);
        amo_routines!(@bit $name $t, and And, or Or, xor Xor);
    };
}

// Tables 6 and 7 of OpenSHMEM 1.5 (LP64): the standard AMO types (with the bitwise ones
// among them) and the extended types.
amo_types! {
    standard [int: i32, long: i64, longlong: i64, size: usize, ptrdiff: isize];
    bitwise [uint: u32, ulong: u64, ulonglong: u64, int32: i32, int64: i64, uint32: u32, uint64: u64];
    extended [float: f32, double: f64];
}
