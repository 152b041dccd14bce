//! Setup, exit, queries and the symmetric heap's C routines.

use crate::cabi;
use crate::heap::MALLOC_ALIGN;
use crate::state::{self, die, st, Shmem};
use std::ffi::{c_char, c_int, c_long, c_void};

/// `SHMEM_THREAD_MULTIPLE`: weft's world is used from any thread at once.
const THREAD_MULTIPLE: c_int = 3;
const MAJOR: c_int = 1;
const MINOR: c_int = 5;
const VENDOR: &str = "weft";
/// `SHMEM_MAX_NAME_LEN` of `shmem.h`.
const MAX_NAME_LEN: usize = 256;

#[no_mangle]
pub extern "C" fn shmem_init() {
    state::init("shmem_init", THREAD_MULTIPLE);
}

#[no_mangle]
pub extern "C" fn shmem_init_thread(requested: c_int, provided: *mut c_int) -> c_int {
    if !(0..=THREAD_MULTIPLE).contains(&requested) {
        die("shmem_init_thread", format_args!("thread level {requested} is not one of SHMEM_THREAD_*"));
    }
    state::init("shmem_init_thread", THREAD_MULTIPLE);
    if requested == THREAD_MULTIPLE {
        crate::watch::threads_may_share_calls();
    }
    if !provided.is_null() {
        cabi::write_value(provided, st("shmem_init_thread").thread_level);
    }
    0
}

#[no_mangle]
pub extern "C" fn shmem_query_thread(provided: *mut c_int) {
    let level = st("shmem_query_thread").thread_level;
    if !provided.is_null() {
        cabi::write_value(provided, level);
    }
}

#[no_mangle]
pub extern "C" fn shmem_finalize() {
    state::finalize();
}

#[no_mangle]
pub extern "C" fn shmem_global_exit(status: c_int) {
    // What a process can report (a multiple of 256 that is not 0 would read as success).
    let code = match status & 0xff {
        0 if status != 0 => 1,
        c => c,
    };
    // The launcher ends the job with it where it can (`weft run`, a PMIx launcher). Elsewhere
    // a failure status makes any launcher stop every other PE: 0 becomes 1.
    // Started without a launcher: this process is the whole job. The job's shared files go
    // first: the launcher may kill this process before it returns from asking.
    state::abandon();
    if weft_runtime::end_job(code) || !weft_runtime::launched() {
        std::process::exit(code);
    }
    let code = code.max(1);
    if code != status {
        let who = st("shmem_global_exit").me;
        eprintln!("weft shmem: PE {who}: shmem_global_exit({status}): ending the job with status {code} (the launcher stops the other PEs on a failure status)");
    }
    std::process::exit(code);
}

#[no_mangle]
pub extern "C" fn shmem_my_pe() -> c_int {
    st("shmem_my_pe").me as c_int
}

#[no_mangle]
pub extern "C" fn shmem_n_pes() -> c_int {
    st("shmem_n_pes").n as c_int
}

#[no_mangle]
pub extern "C" fn shmem_pe_accessible(pe: c_int) -> c_int {
    let s = st("shmem_pe_accessible");
    (u32::try_from(pe).is_ok_and(|p| p < s.n)) as c_int
}

#[no_mangle]
pub extern "C" fn shmem_addr_accessible(addr: *const c_void, pe: c_int) -> c_int {
    let s = st("shmem_addr_accessible");
    (shmem_pe_accessible(pe) == 1 && s.symmetric(addr, 1)) as c_int
}

/// A load/store address of `dest` on `pe`: this PE's own memory, or a peer's mapped here (on
/// shared memory); null where the fabric does not map the peer's memory (the program then
/// uses RMA, as the specification allows).
#[no_mangle]
pub extern "C" fn shmem_ptr(dest: *const c_void, pe: c_int) -> *mut c_void {
    let call = "shmem_ptr";
    let s = st(call);
    let pe = s.pe(call, pe);
    if !s.symmetric(dest, 1) {
        return std::ptr::null_mut();
    }
    if pe == s.me {
        return dest.cast_mut();
    }
    let g = s.sym(call, dest, 1, pe as c_int);
    match s.comm.local_address(g, 1) {
        Ok(Some(a)) => a as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

#[no_mangle]
pub extern "C" fn shmem_info_get_version(major: *mut c_int, minor: *mut c_int) {
    if !major.is_null() {
        cabi::write_value(major, MAJOR);
    }
    if !minor.is_null() {
        cabi::write_value(minor, MINOR);
    }
}

#[no_mangle]
pub extern "C" fn shmem_info_get_name(name: *mut c_char) {
    cabi::put_c_str(name, MAX_NAME_LEN, VENDOR);
}

/// OpenSHMEM 1.0's start-up (deprecated); the argument is ignored, as the specification says.
#[no_mangle]
pub extern "C" fn start_pes(_npes: c_int) {
    state::init("start_pes", THREAD_MULTIPLE);
}

#[no_mangle]
pub extern "C" fn _my_pe() -> c_int {
    shmem_my_pe()
}

#[no_mangle]
pub extern "C" fn _num_pes() -> c_int {
    shmem_n_pes()
}

/// Checks that every PE made the same allocation call with the same result (a collective
/// that also waits for every PE, as the routines' implied barrier must). False where some
/// PE could not allocate (`None`) and others could: those undo theirs, and all return null.
fn agree(s: &Shmem, call: &str, size: usize, off: Option<usize>) -> bool {
    let off = off.map_or(u64::MAX, |o| o as u64);
    let mine = [size as u64, !(size as u64), off, !off];
    let all = s.allreduce_max(call, &mine);
    if all[0] != size as u64 || !all[1] != size as u64 {
        die(
            call,
            format_args!(
                "PEs asked for different sizes ({size} bytes here, {} to {} among the PEs)",
                !all[1], all[0]
            ),
        );
    }
    match (all[2] == off && !all[3] == off, all[2] == u64::MAX) {
        (true, _) => true,
        (false, true) => false,
        (false, false) => die(call, "PEs' symmetric heaps disagree (some PE allocated or freed differently)"),
    }
}

/// Heap offset `off`'s allocation backed by memory now (see `Shmem::back_heap`); `None`,
/// said on standard error and undone, where the system has no memory left for it.
fn backed(s: &Shmem, call: &str, off: Option<usize>) -> Option<usize> {
    let off = off?;
    let len = s.alloc.lock().unwrap_or_else(|p| p.into_inner()).len_of(off).unwrap_or(0);
    match s.back_heap(off, len) {
        Ok(()) => Some(off),
        Err(e) => {
            eprintln!(
                "weft shmem: PE {}: {call}: no memory for {len} bytes of the symmetric heap: {e}",
                s.me
            );
            s.alloc.lock().unwrap_or_else(|p| p.into_inner()).free(off);
            None
        }
    }
}

/// A collective allocation of `size` bytes aligned to `align` (zeroed if `zero`, before any
/// PE returns and may write it); null for 0 bytes, and when the heap is full or memory runs
/// out on some PE (said on standard error).
fn alloc_zeroed(call: &str, size: usize, align: usize, zero: bool) -> *mut c_void {
    let s = st(call);
    if size == 0 {
        agree(s, call, 0, None);
        return std::ptr::null_mut();
    }
    let off = s.alloc.lock().unwrap_or_else(|p| p.into_inner()).alloc(size, align);
    if off.is_none() {
        let heap = s.alloc.lock().unwrap_or_else(|p| p.into_inner());
        eprintln!(
            "weft shmem: PE {}: {call}: {size} bytes do not fit the symmetric heap ({} of {} bytes in use; set SHMEM_SYMMETRIC_SIZE)",
            s.me,
            heap.used_bytes(),
            heap.size()
        );
    }
    let off = backed(s, call, off);
    if let (Some(off), true) = (off, zero) {
        // Freed heap memory may hold old data: zeroed through this PE's own mapping.
        cabi::dst_bytes(s.local_addr(off), size).fill(0);
    }
    if !agree(s, call, size, off) {
        if let Some(off) = off {
            s.alloc.lock().unwrap_or_else(|p| p.into_inner()).free(off);
        }
        return std::ptr::null_mut();
    }
    off.map_or(std::ptr::null_mut(), |o| s.local_addr(o))
}

fn alloc(call: &str, size: usize, align: usize) -> *mut c_void {
    alloc_zeroed(call, size, align, false)
}

#[no_mangle]
pub extern "C" fn shmem_malloc(size: usize) -> *mut c_void {
    alloc("shmem_malloc", size, MALLOC_ALIGN)
}

#[no_mangle]
pub extern "C" fn shmem_malloc_with_hints(size: usize, _hints: c_long) -> *mut c_void {
    alloc("shmem_malloc_with_hints", size, MALLOC_ALIGN)
}

#[no_mangle]
pub extern "C" fn shmem_align(alignment: usize, size: usize) -> *mut c_void {
    if !alignment.is_power_of_two() {
        die("shmem_align", format_args!("alignment {alignment} is not a power of two"));
    }
    if alignment > crate::state::MAX_ALIGN {
        eprintln!(
            "weft shmem: shmem_align: alignment {alignment} is above the largest the symmetric heap gives ({})",
            crate::state::MAX_ALIGN
        );
        return alloc("shmem_align", 0, MALLOC_ALIGN);
    }
    alloc("shmem_align", size, alignment.max(MALLOC_ALIGN))
}

#[no_mangle]
pub extern "C" fn shmem_calloc(count: usize, size: usize) -> *mut c_void {
    let Some(bytes) = count.checked_mul(size) else {
        // As shmem_malloc of a size that does not fit: null on every PE.
        eprintln!("weft shmem: shmem_calloc: {count} × {size} bytes does not fit a size_t");
        return alloc("shmem_calloc", 0, MALLOC_ALIGN);
    };
    alloc_zeroed("shmem_calloc", bytes, MALLOC_ALIGN, true)
}

#[no_mangle]
pub extern "C" fn shmem_free(ptr: *mut c_void) {
    let call = "shmem_free";
    let s = st(call);
    if ptr.is_null() {
        agree(s, call, 0, None);
        return;
    }
    // Operations on the object complete before it is reused (the routine's implied quiet).
    s.check(call, s.comm.sync_nbi());
    let off = s.offset(ptr, 1).filter(|&o| s.alloc.lock().unwrap_or_else(|p| p.into_inner()).free(o));
    match off {
        Some(o) => {
            agree(s, call, 0, Some(o));
        }
        None => die(call, format_args!("{ptr:p} is not an object of the symmetric heap (freed twice?)")),
    }
}

#[no_mangle]
pub extern "C" fn shmem_realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    let call = "shmem_realloc";
    if ptr.is_null() {
        return alloc(call, size, MALLOC_ALIGN);
    }
    if size == 0 {
        shmem_free(ptr);
        return std::ptr::null_mut();
    }
    let s = st(call);
    s.check(call, s.comm.sync_nbi());
    let old =
        s.offset(ptr, 1).filter(|&o| s.alloc.lock().unwrap_or_else(|p| p.into_inner()).len_of(o).is_some());
    let Some(old) = old else {
        die(call, format_args!("{ptr:p} is not an object of the symmetric heap"));
    };
    let mut heap = s.alloc.lock().unwrap_or_else(|p| p.into_inner());
    let have = heap.len_of(old).unwrap_or(0);
    if heap.resize_in_place(old, size) {
        let now = heap.len_of(old).unwrap_or(0);
        drop(heap);
        if now > have {
            if let Err(e) = s.back_heap(old + have, now - have) {
                die(call, format_args!("no memory to grow an object to {size} bytes: {e}"));
            }
        }
        agree(s, call, size, Some(old));
        return ptr;
    }
    let new = heap.alloc(size, MALLOC_ALIGN);
    drop(heap);
    let new = backed(s, call, new);
    if let Some(new) = new {
        let n = have.min(size);
        cabi::dst_bytes(s.local_addr(new), n).copy_from_slice(cabi::src_bytes(ptr, n));
    }
    // Every PE copies its own part before any PE returns (and writes to the new object).
    if !agree(s, call, size, new) {
        if let Some(new) = new {
            s.alloc.lock().unwrap_or_else(|p| p.into_inner()).free(new);
        }
        return std::ptr::null_mut();
    }
    if new.is_some() {
        s.alloc.lock().unwrap_or_else(|p| p.into_inner()).free(old);
    }
    new.map_or(std::ptr::null_mut(), |o| s.local_addr(o))
}

/// OpenSHMEM 1.0's name of `shmem_malloc` (deprecated; existing programs call it).
#[no_mangle]
pub extern "C" fn shmalloc(size: usize) -> *mut c_void {
    alloc("shmalloc", size, MALLOC_ALIGN)
}

/// OpenSHMEM 1.0's name of `shmem_free`.
#[no_mangle]
pub extern "C" fn shfree(ptr: *mut c_void) {
    shmem_free(ptr)
}

/// OpenSHMEM 1.0's name of `shmem_align`.
#[no_mangle]
pub extern "C" fn shmemalign(alignment: usize, size: usize) -> *mut c_void {
    shmem_align(alignment, size)
}

/// OpenSHMEM 1.0's name of `shmem_realloc`.
#[no_mangle]
pub extern "C" fn shrealloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    shmem_realloc(ptr, size)
}
