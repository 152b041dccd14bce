//! The array forms of point-to-point synchronization: `wait_until_{all,any,some}`,
//! `test_{all,any,some}` and their `_vector` forms (a comparison value per element). An
//! element whose `status` is non-zero is left out; a null `status` leaves none out.

use crate::amo::Word;
use crate::cabi;
use crate::rma::bytes;
use crate::state::{die, st};
use crate::sync::holds;
use std::ffi::{c_int, c_void};

/// The checked local addresses of `n` `T`s at `ivars` (this PE's symmetric memory).
fn words<T: Word>(call: &str, ivars: *const T, n: usize) -> usize {
    let s = st(call);
    if n > 0 {
        s.local_word(call, ivars.cast::<c_void>(), T::BYTES);
        let last = (ivars as usize)
            .checked_add(bytes(call, n - 1, T::BYTES))
            .unwrap_or_else(|| die(call, "overflow"));
        s.local_word(call, last as *const c_void, T::BYTES);
    }
    ivars as usize
}

/// Which elements are satisfied now: indices in order, of those not left out.
fn satisfied<T: Word + PartialOrd>(
    call: &str,
    base: usize,
    n: usize,
    status: *const c_int,
    cmp: c_int,
    value: &dyn Fn(usize) -> T,
) -> (Vec<usize>, usize) {
    let mut hit = vec![];
    let mut considered = 0;
    for i in 0..n {
        if !status.is_null() && cabi::read_at(status, i) != 0 {
            continue;
        }
        considered += 1;
        let v = T::from_w(cabi::load_local(base + i * T::BYTES, T::BYTES));
        if holds(call, v, cmp, value(i)) {
            hit.push(i);
        }
    }
    (hit, considered)
}

/// What a wait waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    All,
    Any,
    Some,
}

/// Waits (`wait`) or tests once until `need` of the elements satisfy the comparison; the
/// satisfied indices then (all: every considered one; any: the first; some: all now).
pub(crate) fn array<T: Word + PartialOrd>(
    call: &str,
    (ivars, n, status): (*const T, usize, *const c_int),
    cmp: c_int,
    value: &dyn Fn(usize) -> T,
    need: Need,
    wait: bool,
) -> Option<Vec<usize>> {
    let s = st(call);
    let base = words(call, ivars, n);
    let done = |(hit, considered): &(Vec<usize>, usize)| match need {
        Need::All => hit.len() == *considered,
        Need::Any | Need::Some => !hit.is_empty() || *considered == 0,
    };
    let mut now = satisfied(call, base, n, status, cmp, value);
    if !done(&now) && wait {
        s.check(
            call,
            s.comm.wait_until_written(|| {
                now = satisfied(call, base, n, status, cmp, value);
                done(&now)
            }),
        );
    } else if !wait {
        s.check(call, s.comm.poll());
        now = satisfied(call, base, n, status, cmp, value);
    }
    done(&now).then_some(now.0)
}

macro_rules! p2p_arrays {
    ($($name:ident: $t:ty),* $(,)?) => {$(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            const N: &str = stringify!($name);
            fn c(what: &str) -> String {
                format!("shmem_{N}_{what}")
            }
            fn one(v: $t) -> impl Fn(usize) -> $t {
                move |_| v
            }
            fn each(v: *const $t) -> impl Fn(usize) -> $t {
                move |i| cabi::read_at(v, i)
            }
            fn first(hit: Option<Vec<usize>>) -> usize {
                hit.and_then(|h| h.first().copied()).unwrap_or(usize::MAX)
            }
            fn some(hit: Option<Vec<usize>>, indices: *mut usize) -> usize {
                let hit = hit.unwrap_or_default();
                hit.iter().enumerate().for_each(|(k, &i)| cabi::write_at(indices, k, i));
                hit.len()
            }
            #[export_name = concat!("shmem_", stringify!($name), "_wait_until_all")]
            pub extern "C" fn wait_all(ivars: *mut $t, n: usize, status: *const c_int, cmp: c_int, v: $t) {
                array(&c("wait_until_all"), (ivars, n, status), cmp, &one(v), Need::All, true);
            }
            #[export_name = concat!("shmem_", stringify!($name), "_wait_until_any")]
            pub extern "C" fn wait_any(ivars: *mut $t, n: usize, status: *const c_int, cmp: c_int, v: $t) -> usize {
                first(array(&c("wait_until_any"), (ivars, n, status), cmp, &one(v), Need::Any, true))
            }
            #[export_name = concat!("shmem_", stringify!($name), "_wait_until_some")]
            pub extern "C" fn wait_some(ivars: *mut $t, n: usize, indices: *mut usize, status: *const c_int, cmp: c_int, v: $t) -> usize {
                some(array(&c("wait_until_some"), (ivars, n, status), cmp, &one(v), Need::Some, true), indices)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_wait_until_all_vector")]
            pub extern "C" fn wait_all_v(ivars: *mut $t, n: usize, status: *const c_int, cmp: c_int, v: *const $t) {
                array(&c("wait_until_all_vector"), (ivars, n, status), cmp, &each(v), Need::All, true);
            }
            #[export_name = concat!("shmem_", stringify!($name), "_wait_until_any_vector")]
            pub extern "C" fn wait_any_v(ivars: *mut $t, n: usize, status: *const c_int, cmp: c_int, v: *const $t) -> usize {
                first(array(&c("wait_until_any_vector"), (ivars, n, status), cmp, &each(v), Need::Any, true))
            }
            #[export_name = concat!("shmem_", stringify!($name), "_wait_until_some_vector")]
            pub extern "C" fn wait_some_v(ivars: *mut $t, n: usize, indices: *mut usize, status: *const c_int, cmp: c_int, v: *const $t) -> usize {
                some(array(&c("wait_until_some_vector"), (ivars, n, status), cmp, &each(v), Need::Some, true), indices)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_test_all")]
            pub extern "C" fn test_all(ivars: *mut $t, n: usize, status: *const c_int, cmp: c_int, v: $t) -> c_int {
                array(&c("test_all"), (ivars, n, status), cmp, &one(v), Need::All, false).is_some() as c_int
            }
            #[export_name = concat!("shmem_", stringify!($name), "_test_any")]
            pub extern "C" fn test_any(ivars: *mut $t, n: usize, status: *const c_int, cmp: c_int, v: $t) -> usize {
                first(array(&c("test_any"), (ivars, n, status), cmp, &one(v), Need::Any, false))
            }
            #[export_name = concat!("shmem_", stringify!($name), "_test_some")]
            pub extern "C" fn test_some(ivars: *mut $t, n: usize, indices: *mut usize, status: *const c_int, cmp: c_int, v: $t) -> usize {
                some(array(&c("test_some"), (ivars, n, status), cmp, &one(v), Need::Some, false), indices)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_test_all_vector")]
            pub extern "C" fn test_all_v(ivars: *mut $t, n: usize, status: *const c_int, cmp: c_int, v: *const $t) -> c_int {
                array(&c("test_all_vector"), (ivars, n, status), cmp, &each(v), Need::All, false).is_some() as c_int
            }
            #[export_name = concat!("shmem_", stringify!($name), "_test_any_vector")]
            pub extern "C" fn test_any_v(ivars: *mut $t, n: usize, status: *const c_int, cmp: c_int, v: *const $t) -> usize {
                first(array(&c("test_any_vector"), (ivars, n, status), cmp, &each(v), Need::Any, false))
            }
            #[export_name = concat!("shmem_", stringify!($name), "_test_some_vector")]
            pub extern "C" fn test_some_v(ivars: *mut $t, n: usize, indices: *mut usize, status: *const c_int, cmp: c_int, v: *const $t) -> usize {
                some(array(&c("test_some_vector"), (ivars, n, status), cmp, &each(v), Need::Some, false), indices)
            }
        }
    )*};
}

// Table 11 of OpenSHMEM 1.5.
p2p_arrays! {
    int: i32, long: i64, longlong: i64, uint: u32, ulong: u64, ulonglong: u64,
    int32: i32, int64: i64, uint32: u32, uint64: u64, size: usize, ptrdiff: isize,
}
