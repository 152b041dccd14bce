//! Puts and gets: `putmem`/`getmem`, the typed and sized forms, `p`/`g`, strided `iput`/`iget`
//! and the `_nbi` forms, all through weft's checked RMA on the symmetric heap's segment.
//!
//! A blocking put returns once the data is visible at the target (weft's `put`), which is
//! more than OpenSHMEM asks (the source reusable) and makes `shmem_quiet` cheap after it. A
//! `_nbi` put is weft's implicit put, completed by `shmem_quiet` on the thread that issued
//! it. A `_nbi` get completes before it returns.

use crate::cabi;
use crate::ctx::with_ctx;
use crate::ctx::Ctx;
use crate::state::{die, Shmem};
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

/// A put of `len` bytes on context `ctx`; `nbi`: weft's implicit put (completed by
/// `shmem_quiet`). On a context with an endpoint, the endpoint's put (its quiet completes it).
#[inline]
fn put_as(
    call: &str,
    ctx: *mut c_void,
    dest: *mut c_void,
    src: *const c_void,
    len: usize,
    pe: c_int,
    nbi: bool,
) {
    let (s, c, pe) = crate::ctx::target(call, ctx, pe);
    put_to(s, call, c, dest, src, len, pe, nbi)
}

/// [`put_as`] to world PE `pe` on resolved context `c`.
#[inline]
#[allow(clippy::too_many_arguments)]
fn put_to(
    s: &Shmem,
    call: &str,
    c: Ctx,
    dest: *mut c_void,
    src: *const c_void,
    len: usize,
    pe: c_int,
    nbi: bool,
) {
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
    let r = c.with_ep(|ep| ep.put_nbi(g, bytes));
    s.check(call, r.unwrap_or_else(|| if nbi { s.comm.put_nbi(g, bytes) } else { s.comm.put(g, bytes) }));
}

#[inline]
pub(crate) fn put(
    call: &str,
    ctx: *mut c_void,
    dest: *mut c_void,
    src: *const c_void,
    len: usize,
    pe: c_int,
) {
    put_as(call, ctx, dest, src, len, pe, false)
}

#[inline]
pub(crate) fn put_nbi(
    call: &str,
    ctx: *mut c_void,
    dest: *mut c_void,
    src: *const c_void,
    len: usize,
    pe: c_int,
) {
    put_as(call, ctx, dest, src, len, pe, true)
}

/// A get of `len` bytes on context `ctx`, complete at return.
#[inline]
pub(crate) fn get(
    call: &str,
    ctx: *mut c_void,
    dest: *mut c_void,
    src: *const c_void,
    len: usize,
    pe: c_int,
) {
    let (s, c, pe) = crate::ctx::target(call, ctx, pe);
    get_from(s, call, c, dest, src, len, pe)
}

/// [`get`] from world PE `pe` on resolved context `c`.
#[inline]
fn get_from(s: &Shmem, call: &str, c: Ctx, dest: *mut c_void, src: *const c_void, len: usize, pe: c_int) {
    if empty(call, dest, len) {
        s.pe(call, pe);
        return;
    }
    if let Some(from) = s.direct(src, len, pe) {
        return cabi::copy(from as *const u8, dest.cast(), len);
    }
    let g = s.sym(call, src, len, pe);
    let out = cabi::dst_bytes(dest, len);
    let r = match c.with_ep(|ep| ep.get(g, &mut *out)) {
        Some(r) => r,
        None => s.comm.get(g, out),
    };
    s.check(call, r);
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

/// `iput` (`to_peer`) or `iget` on context `ctx`: each element on its own, the whole
/// symmetric extent checked before anything moves.
pub(crate) fn strided_copy(
    call: &str,
    ctx: *mut c_void,
    to_peer: bool,
    d: *mut c_void,
    sr: *const c_void,
    x: Strides,
    pe: c_int,
) {
    let (dst, sst) = (stride(call, x.dst, "target"), stride(call, x.sst, "source"));
    let (s, c, pe) = crate::ctx::target(call, ctx, pe);
    if x.n == 0 {
        return;
    }
    let (sym_base, sym_stride) = if to_peer { (d as usize, dst) } else { (sr as usize, sst) };
    let last = strided(call, sym_base, x.n - 1, sym_stride, x.size);
    s.sym(call, last as *const c_void, x.size, pe);
    for i in 0..x.n {
        let at = strided(call, d as usize, i, dst, x.size) as *mut c_void;
        let from = strided(call, sr as usize, i, sst, x.size) as *const c_void;
        if to_peer {
            put_to(s, call, c, at, from, x.size, pe, true);
        } else {
            get_from(s, call, c, at, from, x.size, pe);
        }
    }
    if to_peer && ctx == crate::ctx::DEFAULT {
        // Complete at return, as the default context's blocking puts are.
        s.check(call, s.comm.sync_nbi());
    }
}

with_ctx!(call, ctx, "putmem", fn(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
    put(call, ctx, dest, source, nelems, pe)
});
with_ctx!(call, ctx, "getmem", fn(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
    get(call, ctx, dest, source, nelems, pe)
});
with_ctx!(call, ctx, "putmem_nbi", fn(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
    put_nbi(call, ctx, dest, source, nelems, pe)
});
with_ctx!(call, ctx, "getmem_nbi", fn(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
    get(call, ctx, dest, source, nelems, pe)
});

/// The typed routines of one standard RMA type: `shmem_NAME_{put,get,put_nbi,get_nbi,p,g,
/// iput,iget}` and their `shmem_ctx_` forms.
macro_rules! typed_rma {
    ($($name:ident: $t:ty),* $(,)?) => {$(
        #[allow(non_snake_case)]
        mod $name {
            use super::*;
            const Z: usize = std::mem::size_of::<$t>();
            with_ctx!(call, ctx, concat!(stringify!($name), "_put"), fn(dest: *mut $t, source: *const $t, nelems: usize, pe: c_int) {
                put(call, ctx, dest.cast(), source.cast(), bytes(call, nelems, Z), pe)
            });
            with_ctx!(call, ctx, concat!(stringify!($name), "_get"), fn(dest: *mut $t, source: *const $t, nelems: usize, pe: c_int) {
                get(call, ctx, dest.cast(), source.cast(), bytes(call, nelems, Z), pe)
            });
            with_ctx!(call, ctx, concat!(stringify!($name), "_put_nbi"), fn(dest: *mut $t, source: *const $t, nelems: usize, pe: c_int) {
                put_nbi(call, ctx, dest.cast(), source.cast(), bytes(call, nelems, Z), pe)
            });
            with_ctx!(call, ctx, concat!(stringify!($name), "_get_nbi"), fn(dest: *mut $t, source: *const $t, nelems: usize, pe: c_int) {
                get(call, ctx, dest.cast(), source.cast(), bytes(call, nelems, Z), pe)
            });
            with_ctx!(call, ctx, concat!(stringify!($name), "_p"), fn(dest: *mut $t, value: $t, pe: c_int) {
                put(call, ctx, dest.cast(), (&value as *const $t).cast(), Z, pe)
            });
            with_ctx!(call, ctx, concat!(stringify!($name), "_g"), fn(source: *const $t, pe: c_int) -> $t {
                let mut v: $t = Default::default();
                get(call, ctx, (&mut v as *mut $t).cast(), source.cast(), Z, pe);
                v
            });
            with_ctx!(call, ctx, concat!(stringify!($name), "_iput"), fn(dest: *mut $t, source: *const $t, dst: isize, sst: isize, nelems: usize, pe: c_int) {
                strided_copy(call, ctx, true, dest.cast(), source.cast(), Strides { dst, sst, n: nelems, size: Z }, pe)
            });
            with_ctx!(call, ctx, concat!(stringify!($name), "_iget"), fn(dest: *mut $t, source: *const $t, dst: isize, sst: isize, nelems: usize, pe: c_int) {
                strided_copy(call, ctx, false, dest.cast(), source.cast(), Strides { dst, sst, n: nelems, size: Z }, pe)
            });
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

/// The sized routines: `shmem_putSIZE`, `getSIZE`, `_nbi`, `iputSIZE`, `igetSIZE` and their
/// `shmem_ctx_` forms.
macro_rules! sized_rma {
    ($($m:ident $bits:literal: $z:literal),* $(,)?) => {$(
        mod $m {
            use super::*;
            with_ctx!(call, ctx, concat!("put", $bits), fn(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
                put(call, ctx, dest, source, bytes(call, nelems, $z), pe)
            });
            with_ctx!(call, ctx, concat!("get", $bits), fn(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
                get(call, ctx, dest, source, bytes(call, nelems, $z), pe)
            });
            with_ctx!(call, ctx, concat!("put", $bits, "_nbi"), fn(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
                put_nbi(call, ctx, dest, source, bytes(call, nelems, $z), pe)
            });
            with_ctx!(call, ctx, concat!("get", $bits, "_nbi"), fn(dest: *mut c_void, source: *const c_void, nelems: usize, pe: c_int) {
                get(call, ctx, dest, source, bytes(call, nelems, $z), pe)
            });
            with_ctx!(call, ctx, concat!("iput", $bits), fn(dest: *mut c_void, source: *const c_void, dst: isize, sst: isize, nelems: usize, pe: c_int) {
                strided_copy(call, ctx, true, dest, source, Strides { dst, sst, n: nelems, size: $z }, pe)
            });
            with_ctx!(call, ctx, concat!("iget", $bits), fn(dest: *mut c_void, source: *const c_void, dst: isize, sst: isize, nelems: usize, pe: c_int) {
                strided_copy(call, ctx, false, dest, source, Strides { dst, sst, n: nelems, size: $z }, pe)
            });
        }
    )*};
}

sized_rma! { s8 "8": 1, s16 "16": 2, s32 "32": 4, s64 "64": 8, s128 "128": 16 }
