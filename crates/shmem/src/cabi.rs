//! The C boundary: the only `unsafe` of this crate. A C caller hands raw pointers; these
//! turn them into slices and values under the OpenSHMEM contract the caller accepted (a
//! source or destination is valid for the bytes the call names, and nobody else writes a
//! source or touches a destination while the call runs). Symmetric addresses are never
//! dereferenced here: they are checked and translated into global addresses
//! (`crate::state::Shmem::sym`) and reach memory through the runtime.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// `len` bytes from `src`, read by the call.
pub(crate) fn src_bytes<'a>(src: *const c_void, len: usize) -> &'a [u8] {
    if len == 0 || src.is_null() {
        return &[];
    }
    // SAFETY: the caller of the OpenSHMEM routine passes a source valid for `len` bytes that
    // nobody writes during the call (the routine's contract); null and empty are handled above.
    unsafe { std::slice::from_raw_parts(src.cast::<u8>(), len) }
}

/// `len` bytes at `dst`, written by the call.
pub(crate) fn dst_bytes<'a>(dst: *mut c_void, len: usize) -> &'a mut [u8] {
    if len == 0 || dst.is_null() {
        return &mut [];
    }
    // SAFETY: the caller passes a destination valid for `len` bytes that nobody reads or
    // writes during the call (the routine's contract); null and empty are handled above.
    unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), len) }
}

/// Writes `v` at `p` (a private, local address the caller owns).
pub(crate) fn write_value<T: Copy>(p: *mut T, v: T) {
    // SAFETY: the caller passes a valid, writable `T` (unaligned writes are allowed).
    unsafe { p.write_unaligned(v) }
}

/// Loads the 4 or 8 bytes at `addr` of this PE's own symmetric memory with acquire
/// ordering, as point-to-point synchronization does while peers write them.
pub(crate) fn load_local(addr: usize, size: usize) -> u64 {
    match size {
        // SAFETY: `addr` was checked to lie in this PE's mapped symmetric heap, aligned for
        // its size (`crate::state::Shmem::local_word`); peers write it only atomically or
        // with RMA, and an atomic load observes either.
        4 => unsafe { (*(addr as *const AtomicU32)).load(Ordering::Acquire) as u64 },
        // SAFETY: as above, for 8 bytes.
        _ => unsafe { (*(addr as *const AtomicU64)).load(Ordering::Acquire) },
    }
}

/// Copies `s` and a NUL into the caller's buffer of `cap` bytes (truncating).
pub(crate) fn put_c_str(dst: *mut c_char, cap: usize, s: &str) {
    if dst.is_null() || cap == 0 {
        return;
    }
    let n = s.len().min(cap - 1);
    let out = dst_bytes(dst.cast(), n + 1);
    out[..n].copy_from_slice(&s.as_bytes()[..n]);
    out[n] = 0;
}

/// Element `i` of the caller's array at `p`.
pub(crate) fn read_at<T: Copy>(p: *const T, i: usize) -> T {
    // SAFETY: the caller passes an array of at least `i + 1` elements (the routine's contract).
    unsafe { p.add(i).read_unaligned() }
}

/// Writes element `i` of the caller's array at `p`.
pub(crate) fn write_at<T: Copy>(p: *mut T, i: usize, v: T) {
    // SAFETY: the caller passes an array of at least `i + 1` elements (the routine's contract).
    unsafe { p.add(i).write_unaligned(v) }
}

/// Copies `len` bytes from `src` to `dst` (one of them a peer's mapped symmetric memory).
pub(crate) fn copy(src: *const u8, dst: *mut u8, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: the caller's buffer is valid for `len` bytes (the routine's contract); the
    // symmetric side was checked to lie within a peer's part mapped in this process
    // (`Shmem::direct`), which stays mapped until shmem_finalize. Peers may write the same
    // bytes concurrently only where the program has a race the specification leaves
    // undefined; the copy reads or writes each byte once.
    unsafe { std::ptr::copy(src, dst, len) }
}

/// A 32-bit atomic at `addr` (a peer's mapped symmetric memory, checked and 4-byte aligned).
pub(crate) fn atomic_u32<'a>(addr: usize) -> &'a std::sync::atomic::AtomicU32 {
    // SAFETY: `addr` lies within a mapped symmetric segment (`Shmem::direct` checked 4 bytes
    // there) and is 4-byte aligned (checked by the caller); the mapping lives until
    // shmem_finalize; every access to it from weft is atomic.
    unsafe { &*(addr as *const std::sync::atomic::AtomicU32) }
}

/// A 64-bit atomic at `addr` (as [`atomic_u32`], 8-byte aligned).
pub(crate) fn atomic_u64<'a>(addr: usize) -> &'a std::sync::atomic::AtomicU64 {
    // SAFETY: as for `atomic_u32`, for 8 aligned bytes.
    unsafe { &*(addr as *const std::sync::atomic::AtomicU64) }
}

/// C's `long double` on x86-64: the x87 80-bit format in 16 bytes, for which Rust has no
/// type. Sums, products and comparisons run on the x87 unit itself (extended precision, as
/// Linux sets it), so a reduction rounds exactly as C code on the same values does.
#[cfg(target_arch = "x86_64")]
pub(crate) mod x87 {
    use std::arch::asm;

    /// `a OP b` for the x87 instruction `$op` that combines st(1) with st and pops.
    macro_rules! binop {
        ($a:expr, $b:expr, $op:literal) => {{
            let mut out = [0u8; 16];
            // SAFETY: reads 10 bytes at `a` and `b` and writes 10 at `out`, all 16-byte arrays
            // borrowed for the block; the x87 stack is left as found (two loads, one popping
            // operation, one popping store) and every x87 register is declared clobbered.
            unsafe {
                asm!(
                    "fld tbyte ptr [{b}]",
                    "fld tbyte ptr [{a}]",
                    $op,
                    "fstp tbyte ptr [{o}]",
                    a = in(reg) $a.as_ptr(), b = in(reg) $b.as_ptr(), o = in(reg) out.as_mut_ptr(),
                    out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
                    out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
                    options(nostack),
                )
            }
            out
        }};
    }

    /// `a + b` (`mul`: `a * b`).
    pub(crate) fn arith(a: &[u8; 16], b: &[u8; 16], mul: bool) -> [u8; 16] {
        if mul {
            binop!(a, b, "fmulp st(1), st")
        } else {
            binop!(a, b, "faddp st(1), st")
        }
    }

    /// Whether `a < b`; `None` when they are unordered (either is a NaN).
    pub(crate) fn less(a: &[u8; 16], b: &[u8; 16]) -> Option<bool> {
        let (below, unordered): (u8, u8);
        // SAFETY: reads 10 bytes at `a` and `b` (borrowed 16-byte arrays); two loads, a
        // popping compare and a popping store to st(0) leave the x87 stack as found; every
        // x87 register and the flags are declared clobbered.
        unsafe {
            asm!(
                "fld tbyte ptr [{b}]",
                "fld tbyte ptr [{a}]",
                "fucomip st, st(1)",
                "fstp st(0)",
                "setb {lt}",
                "setp {un}",
                a = in(reg) a.as_ptr(), b = in(reg) b.as_ptr(),
                lt = out(reg_byte) below, un = out(reg_byte) unordered,
                out("st(0)") _, out("st(1)") _, out("st(2)") _, out("st(3)") _,
                out("st(4)") _, out("st(5)") _, out("st(6)") _, out("st(7)") _,
                options(nostack),
            )
        }
        (unordered == 0).then_some(below == 1)
    }
}
