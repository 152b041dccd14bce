//! The collective routines of C: on teams (OpenSHMEM 1.5) and on active sets with a `pSync`
//! (the deprecated forms existing programs still call), both over `crate::coll`.

use crate::coll::{self, Op, Set, SyncArea};
use crate::rma::bytes;
use crate::state::{die, st};
use crate::team::{self, sync_area};
use std::ffi::{c_int, c_long, c_void};

/// An active set and its `pSync`, checked.
fn active(call: &str, start: c_int, log: c_int, size: c_int, psync: *const c_long) -> (Set, SyncArea) {
    let s = st(call);
    (Set::active(s, call, start, log, size), SyncArea::user(s, call, psync.cast()))
}

/// A team's set and counters.
fn on_team(call: &str, t: *mut c_void) -> (Set, SyncArea) {
    let s = st(call);
    let t = team::team(s, call, t);
    (t.set, sync_area(s, call, t))
}

/// A member index given as a C int.
fn root(call: &str, set: Set, root: c_int) -> u32 {
    u32::try_from(root)
        .ok()
        .filter(|&r| r < set.size)
        .unwrap_or_else(|| die(call, format_args!("root {root} is not a PE of the team or active set")))
}

/// A stride as the engine takes it (0 for one that is not positive: refused there).
#[no_mangle]
pub extern "C" fn shmem_barrier(start: c_int, log_stride: c_int, size: c_int, psync: *mut c_long) {
    let (set, area) = active("shmem_barrier", start, log_stride, size, psync);
    coll::sync(st("shmem_barrier"), "shmem_barrier", set, area);
}

#[no_mangle]
pub extern "C" fn shmem_sync(start: c_int, log_stride: c_int, size: c_int, psync: *mut c_long) {
    let (set, area) = active("shmem_sync", start, log_stride, size, psync);
    coll::sync(st("shmem_sync"), "shmem_sync", set, area);
}

/// The deprecated sized routines of `BITS` bits.
macro_rules! active_sized {
    ($($m:ident $bits:literal $z:literal),*) => {$(
        mod $m {
            use super::*;
            #[export_name = concat!("shmem_broadcast", $bits)]
            pub extern "C" fn broadcast(dest: *mut c_void, source: *const c_void, nelems: usize, pe_root: c_int, start: c_int, log: c_int, size: c_int, psync: *mut c_long) {
                let call = concat!("shmem_broadcast", $bits);
                let (set, area) = active(call, start, log, size, psync);
                coll::broadcast(call, set, area, dest, source, bytes(call, nelems, $z), coll::Root { index: root(call, set, pe_root), to_itself: false });
            }
            #[export_name = concat!("shmem_collect", $bits)]
            pub extern "C" fn collect(dest: *mut c_void, source: *const c_void, nelems: usize, start: c_int, log: c_int, size: c_int, psync: *mut c_long) {
                let call = concat!("shmem_collect", $bits);
                let (set, area) = active(call, start, log, size, psync);
                coll::collect(call, set, area, dest, source, bytes(call, nelems, $z), Some($z));
            }
            #[export_name = concat!("shmem_fcollect", $bits)]
            pub extern "C" fn fcollect(dest: *mut c_void, source: *const c_void, nelems: usize, start: c_int, log: c_int, size: c_int, psync: *mut c_long) {
                let call = concat!("shmem_fcollect", $bits);
                let (set, area) = active(call, start, log, size, psync);
                coll::collect(call, set, area, dest, source, bytes(call, nelems, $z), None);
            }
            #[export_name = concat!("shmem_alltoalls", $bits)]
            pub extern "C" fn alltoalls(dest: *mut c_void, source: *const c_void, dst: isize, sst: isize, nelems: usize, start: c_int, log: c_int, size: c_int, psync: *mut c_long) {
                let call = concat!("shmem_alltoalls", $bits);
                let (set, area) = active(call, start, log, size, psync);
                coll::alltoalls(call, (set, area), dest, source, (dst, sst), nelems, $z);
            }
            #[export_name = concat!("shmem_alltoall", $bits)]
            pub extern "C" fn alltoall(dest: *mut c_void, source: *const c_void, nelems: usize, start: c_int, log: c_int, size: c_int, psync: *mut c_long) {
                let call = concat!("shmem_alltoall", $bits);
                let (set, area) = active(call, start, log, size, psync);
                coll::alltoall(call, set, area, dest, source, bytes(call, nelems, $z));
            }
        }
    )*};
}
active_sized! { b32 "32" 4, b64 "64" 8 }

/// The team routines of one element size: `shmem_NAME_{broadcast,collect,fcollect,alltoall}`
/// (`mem`: `shmem_{broadcast,collect,fcollect,alltoall}mem`).
macro_rules! team_typed {
    ($($name:ident $z:expr),* $(,)?) => {$(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            team_typed!(@fns $name $z, concat!("shmem_", stringify!($name), "_broadcast"),
                concat!("shmem_", stringify!($name), "_collect"), concat!("shmem_", stringify!($name), "_fcollect"),
                concat!("shmem_", stringify!($name), "_alltoall"), concat!("shmem_", stringify!($name), "_alltoalls"));
        }
    )*};
    (@fns $name:ident $z:expr, $b:expr, $c:expr, $f:expr, $a:expr, $as:expr) => {
            #[export_name = $b]
            pub extern "C" fn broadcast(t: *mut c_void, dest: *mut c_void, source: *const c_void, nelems: usize, pe_root: c_int) -> c_int {
                let call = $b;
                let (set, area) = on_team(call, t);
                coll::broadcast(call, set, area, dest, source, bytes(call, nelems, $z), coll::Root { index: root(call, set, pe_root), to_itself: true });
                0
            }
            #[export_name = $c]
            pub extern "C" fn collect(t: *mut c_void, dest: *mut c_void, source: *const c_void, nelems: usize) -> c_int {
                let call = $c;
                let (set, area) = on_team(call, t);
                coll::collect(call, set, area, dest, source, bytes(call, nelems, $z), Some($z));
                0
            }
            #[export_name = $f]
            pub extern "C" fn fcollect(t: *mut c_void, dest: *mut c_void, source: *const c_void, nelems: usize) -> c_int {
                let call = $f;
                let (set, area) = on_team(call, t);
                coll::collect(call, set, area, dest, source, bytes(call, nelems, $z), None);
                0
            }
            #[export_name = $as]
            pub extern "C" fn alltoalls(t: *mut c_void, dest: *mut c_void, source: *const c_void, dst: isize, sst: isize, nelems: usize) -> c_int {
                let call = $as;
                let (set, area) = on_team(call, t);
                coll::alltoalls(call, (set, area), dest, source, (dst, sst), nelems, $z);
                0
            }
            #[export_name = $a]
            pub extern "C" fn alltoall(t: *mut c_void, dest: *mut c_void, source: *const c_void, nelems: usize) -> c_int {
                let call = $a;
                let (set, area) = on_team(call, t);
                coll::alltoall(call, set, area, dest, source, bytes(call, nelems, $z));
                0
            }
    };
}

mod mem {
    use super::*;
    team_typed!(@fns mem 1, "shmem_broadcastmem", "shmem_collectmem", "shmem_fcollectmem", "shmem_alltoallmem", "shmem_alltoallsmem");
}

// Table 5's types.
team_typed! {
    float 4, double 8, longdouble 16, char 1, schar 1, short 2, int 4, long 8, longlong 8,
    uchar 1, ushort 2, uint 4, ulong 8, ulonglong 8, int8 1, int16 2, int32 4, int64 8,
    uint8 1, uint16 2, uint32 4, uint64 8, size 8, ptrdiff 8,
}

/// Reductions: `shmem_NAME_OP_reduce` on teams and `shmem_NAME_OP_to_all` on active sets.
macro_rules! reductions {
    ($($name:ident $t:ty: $($op:ident $v:ident),+);* $(;)?) => {$($(
        const _: () = {
            #[export_name = concat!("shmem_", stringify!($name), "_", stringify!($op), "_reduce")]
            pub extern "C" fn reduce(t: *mut c_void, dest: *mut $t, source: *const $t, nreduce: usize) -> c_int {
                let call = concat!("shmem_", stringify!($name), "_", stringify!($op), "_reduce");
                let (set, area) = on_team(call, t);
                coll::reduce::<$t>(call, set, area, dest, source, nreduce, Op::$v);
                0
            }
            #[export_name = concat!("shmem_", stringify!($name), "_", stringify!($op), "_to_all")]
            pub extern "C" fn to_all(dest: *mut $t, source: *const $t, nreduce: c_int, start: c_int, log: c_int, size: c_int, _pwrk: *mut $t, psync: *mut c_long) {
                let call = concat!("shmem_", stringify!($name), "_", stringify!($op), "_to_all");
                let n = usize::try_from(nreduce).unwrap_or_else(|_| die(call, format_args!("nreduce {nreduce} is negative")));
                let (set, area) = active(call, start, log, size, psync);
                coll::reduce::<$t>(call, set, area, dest, source, n, Op::$v);
            }
        };
    )+)*};
}

// Table 10 of OpenSHMEM 1.5, the `_to_all` forms beside (harmless for types the deprecated
// forms never had); long double below.
reductions! {
    uchar u8: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    ushort u16: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    uint u32: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    ulong u64: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    ulonglong u64: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    int8 i8: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    int16 i16: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    int32 i32: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    int64 i64: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    uint8 u8: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    uint16 u16: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    uint32 u32: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    uint64 u64: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    size usize: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    short i16: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    int i32: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    long i64: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    longlong i64: and And, or Or, xor Xor, max Max, min Min, sum Sum, prod Prod;
    char i8: max Max, min Min, sum Sum, prod Prod;
    schar i8: max Max, min Min, sum Sum, prod Prod;
    ptrdiff isize: max Max, min Min, sum Sum, prod Prod;
    float f32: max Max, min Min, sum Sum, prod Prod;
    double f64: max Max, min Min, sum Sum, prod Prod;
    complexf coll::ComplexF: sum Sum, prod Prod;
    complexd coll::ComplexD: sum Sum, prod Prod;
}

/// `long double` reductions, where its arithmetic is the x87 unit's (x86-64).
#[cfg(target_arch = "x86_64")]
mod long_double {
    use super::*;
    reductions! {
        longdouble coll::LongDouble: max Max, min Min, sum Sum, prod Prod;
    }
}
