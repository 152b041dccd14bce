//! Puts and gets: `putmem`/`getmem`, the typed and sized forms, `p`/`g`, strided `iput`/`iget`
//! and the `_nbi` forms, all through weft's checked RMA on the symmetric heap's segment.
//!
//! A blocking put returns once the data is visible at the target (weft's `put`), which is
//! more than OpenSHMEM asks (the source reusable) and makes `shmem_quiet` cheap after it. A
//! `_nbi` put is weft's implicit put, completed by `shmem_quiet` on the thread that issued
//! it. A `_nbi` get completes before it returns.

use crate::cabi;
use crate::state::{die, st};
use std::ffi::{c_int, c_void};

/// Bytes of `nelems` elements of `size` bytes, or the end of the job.
#[inline]
pub(crate) fn bytes(call: &str, nelems: usize, size: usize) -> usize {
    nelems
        .checked_mul(size)
        .unwrap_or_else(|| die(call, format_args!("{nelems} elements of {size} bytes overflow")))
}

/// Checks the caller's local buffer: NULL is refused where there are bytes to move. True
/// when there are none (the call then only checks its PE).
#[inline]
pub(crate) fn empty(call: &str, local: *const c_void, len: usize) -> bool {
    if len > 0 && local.is_null() {
        die(call, format_args!("the local buffer of {len} bytes is NULL"));
    }
    len == 0
}

/// A put of `len` bytes; `nbi`: weft's implicit put (completed by `shmem_quiet`).
#[inline]
fn put_as(call: &str, dest: *mut c_void, src: *const c_void, len: usize, pe: c_int, nbi: bool) {
    let s = st(call);
    if empty(call, src, len) {
        s.pe(call, pe);
        return;
    }
    if let Some(to) = s.direct(dest, len, pe) {
        // Shared memory: a copy into the peer's mapping, complete at return.
        return cabi::copy(src.cast(), to as *mut u8, len);
    }
    let g = s.sym(call, dest, len, pe);
    let bytes = cabi::src_bytes(src, len);
    s.check(call, if nbi { s.comm.put_nbi(g, bytes) } else { s.comm.put(g, bytes) });
}

#[inline]
pub(crate) fn put(call: &str, dest: *mut c_void, src: *const c_void, len: usize, pe: c_int) {
    put_as(call, dest, src, len, pe, false)
}

#[inline]
pub(crate) fn put_nbi(call: &str, dest: *mut c_void, src: *const c_void, len: usize, pe: c_int) {
    put_as(call, dest, src, len, pe, true)
}

#[inline]
pub(crate) fn get(call: &str, dest: *mut c_void, src: *const c_void, len: usize, pe: c_int) {
    let s = st(call);
    if empty(call, dest, len) {
        s.pe(call, pe);
        return;
    }
    if let Some(from) = s.direct(src, len, pe) {
        return cabi::copy(from as *const u8, dest.cast(), len);
    }
    let g = s.sym(call, src, len, pe);
    s.check(call, s.comm.get(g, cabi::dst_bytes(dest, len)));
}

/// Element `i` of a strided array (`stride` elements of `size` bytes apart) at `base`.
fn strided(call: &str, base: usize, i: usize, stride: isize, size: usize) -> usize {
    let step = (stride as i128) * (i as i128) * (size as i128);
    usize::try_from(base as i128 + step)
        .unwrap_or_else(|_| die(call, "a stride leads outside the address space"))
}

/// Checks a stride: positive, as the specification requires.
fn stride(call: &str, st: isize, which: &str) -> isize {
    if st < 1 {
        die(call, format_args!("{which} stride {st} is not positive"));
    }
    st
}

/// A strided transfer: `n` elements of `size` bytes, `dst` elements apart at the
/// destination and `sst` apart at the source.
pub(crate) struct Strides {
    pub dst: isize,
    pub sst: isize,
    pub n: usize,
    pub size: usize,
}

/// `iput` (`to_peer`) or `iget`: each element on its own, the whole symmetric extent checked
/// before anything moves.
pub(crate) fn strided_copy(
    call: &str,
    to_peer: bool,
    d: *mut c_void,
    sr: *const c_void,
    x: Strides,
    pe: c_int,
) {
    let (dst, sst) = (stride(call, x.dst, "target"), stride(call, x.sst, "source"));
    if x.n == 0 {
        return;
    }
    let s = st(call);
    let (sym_base, sym_stride) = if to_peer { (d as usize, dst) } else { (sr as usize, sst) };
    let last = strided(call, sym_base, x.n - 1, sym_stride, x.size);
    s.sym(call, last as *const c_void, x.size, pe);
    let at = |i| strided(call, d as usize, i, dst, x.size);
    let from = |i| strided(call, sr as usize, i, sst, x.size);
    let r = s.comm.nbi(|scope| {
        for i in 0..x.n {
            if to_peer {
                let g = s.sym(call, at(i) as *const c_void, x.size, pe);
                scope.put(g, cabi::src_bytes(from(i) as *const c_void, x.size))?;
            } else {
                let g = s.sym(call, from(i) as *const c_void, x.size, pe);
                s.comm.get(g, cabi::dst_bytes(at(i) as *mut c_void, x.size))?;
            }
        }
        Ok(())
    });
    s.check(call, r);
}

#[no_mangle]
pub extern "C" fn shmem_putmem(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
    put("shmem_putmem", dest, source, nelems, pe)
}
#[no_mangle]
pub extern "C" fn shmem_getmem(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
    get("shmem_getmem", dest, source, nelems, pe)
}
#[no_mangle]
pub extern "C" fn shmem_putmem_nbi(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
    put_nbi("shmem_putmem_nbi", dest, source, nelems, pe)
}
#[no_mangle]
pub extern "C" fn shmem_getmem_nbi(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
    get("shmem_getmem_nbi", dest, source, nelems, pe)
}

/// The typed routines of one standard RMA type: `shmem_NAME_{put,get,put_nbi,get_nbi,p,g,
/// iput,iget}`.
macro_rules! typed_rma {
    ($($name:ident: $t:ty),* $(,)?) => {$(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            const Z: usize = std::mem::size_of::<$t>();
            #[export_name = concat!("shmem_", stringify!($name), "_put")]
            pub extern "C" fn put_(dest: *mut $t, source: *const $t, nelems: usize, pe: c_int) {
                let call = concat!("shmem_", stringify!($name), "_put");
                put(call, dest.cast(), source.cast(), bytes(call, nelems, Z), pe)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_get")]
            pub extern "C" fn get_(dest: *mut $t, source: *const $t, nelems: usize, pe: c_int) {
                let call = concat!("shmem_", stringify!($name), "_get");
                get(call, dest.cast(), source.cast(), bytes(call, nelems, Z), pe)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_put_nbi")]
            pub extern "C" fn put_nbi_(dest: *mut $t, source: *const $t, nelems: usize, pe: c_int) {
                let call = concat!("shmem_", stringify!($name), "_put_nbi");
                put_nbi(call, dest.cast(), source.cast(), bytes(call, nelems, Z), pe)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_get_nbi")]
            pub extern "C" fn get_nbi_(dest: *mut $t, source: *const $t, nelems: usize, pe: c_int) {
                let call = concat!("shmem_", stringify!($name), "_get_nbi");
                get(call, dest.cast(), source.cast(), bytes(call, nelems, Z), pe)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_p")]
            pub extern "C" fn p_(dest: *mut $t, value: $t, pe: c_int) {
                let call = concat!("shmem_", stringify!($name), "_p");
                put(call, dest.cast(), (&value as *const $t).cast(), Z, pe)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_g")]
            pub extern "C" fn g_(source: *const $t, pe: c_int) -> $t {
                let call = concat!("shmem_", stringify!($name), "_g");
                let mut v: $t = Default::default();
                get(call, (&mut v as *mut $t).cast(), source.cast(), Z, pe);
                v
            }
            #[export_name = concat!("shmem_", stringify!($name), "_iput")]
            pub extern "C" fn iput_(dest: *mut $t, source: *const $t, dst: isize, sst: isize, nelems: usize, pe: c_int) {
                let x = Strides { dst, sst, n: nelems, size: Z };
                strided_copy(concat!("shmem_", stringify!($name), "_iput"), true, dest.cast(), source.cast(), x, pe)
            }
            #[export_name = concat!("shmem_", stringify!($name), "_iget")]
            pub extern "C" fn iget_(dest: *mut $t, source: *const $t, dst: isize, sst: isize, nelems: usize, pe: c_int) {
                let x = Strides { dst, sst, n: nelems, size: Z };
                strided_copy(concat!("shmem_", stringify!($name), "_iget"), false, dest.cast(), source.cast(), x, pe)
            }
        }
    )*};
}

// Table 5 of OpenSHMEM 1.5 (LP64), but `longdouble`: the header defines its routines inline
// over the 128-bit ones (Rust has no x87 type to pass by value to `p` or return from `g`).
typed_rma! {
    float: f32, double: f64, char: i8, schar: i8, short: i16, int: i32, long: i64, longlong: i64,
    uchar: u8, ushort: u16, uint: u32, ulong: u64, ulonglong: u64,
    int8: i8, int16: i16, int32: i32, int64: i64, uint8: u8, uint16: u16, uint32: u32, uint64: u64,
    size: usize, ptrdiff: isize,
}

/// The sized routines: `shmem_putSIZE`, `getSIZE`, `_nbi`, `iputSIZE`, `igetSIZE`.
macro_rules! sized_rma {
    ($($m:ident $bits:literal: $z:literal),* $(,)?) => {$(
        mod $m {
            use super::*;
            #[export_name = concat!("shmem_put", $bits)]
            pub extern "C" fn put_(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
                let call = concat!("shmem_put", $bits);
                put(call, dest, source, bytes(call, nelems, $z), pe)
            }
            #[export_name = concat!("shmem_get", $bits)]
            pub extern "C" fn get_(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
                let call = concat!("shmem_get", $bits);
                get(call, dest, source, bytes(call, nelems, $z), pe)
            }
            #[export_name = concat!("shmem_put", $bits, "_nbi")]
            pub extern "C" fn put_nbi_(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
                let call = concat!("shmem_put", $bits, "_nbi");
                put_nbi(call, dest, source, bytes(call, nelems, $z), pe)
            }
            #[export_name = concat!("shmem_get", $bits, "_nbi")]
            pub extern "C" fn get_nbi_(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
                let call = concat!("shmem_get", $bits, "_nbi");
                get(call, dest, source, bytes(call, nelems, $z), pe)
            }
            #[export_name = concat!("shmem_iput", $bits)]
            pub extern "C" fn iput_(dest: *mut c_void, source: *const c_void, dst: isize, sst: isize, nelems: usize, pe: c_int) {
                strided_copy(concat!("shmem_iput", $bits), true, dest, source, Strides { dst, sst, n: nelems, size: $z }, pe)
            }
            #[export_name = concat!("shmem_iget", $bits)]
            pub extern "C" fn iget_(dest: *mut c_void, source: *const c_void, dst: isize, sst: isize, nelems: usize, pe: c_int) {
                strided_copy(concat!("shmem_iget", $bits), false, dest, source, Strides { dst, sst, n: nelems, size: $z }, pe)
            }
        }
    )*};
}

sized_rma! { s8 "8": 1, s16 "16": 2, s32 "32": 4, s64 "64": 8, s128 "128": 16 }
