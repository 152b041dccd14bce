//! The program's own static data as a region ([`crate::Fabric::adopt_program_data`]): the
//! writable data of the main executable (`.data`, `.bss`, after the part made read-only once
//! relocated), reachable by peers as OpenSHMEM's symmetric static data must be.
//!
//! On shared memory the pages move into a file of the job: their bytes are copied into it,
//! then the file's mapping replaces the pages at the same address (`mremap`), so the program
//! keeps using its variables where they are while peers map the same file. A network fabric
//! registers the pages in place. Dropped, the region puts private memory with the same bytes
//! back (`restore`). A write by another thread between the copy and the move would be lost:
//! adopt before the program's threads write its statics. A signal handler's write is not:
//! the caller blocks asynchronous signals over the copy and the move, and weft's own threads
//! block them always (`signals::spawn_quiet`). weft's own statics must not be among
//! the pages (weft linked statically into the program): that is refused.

use crate::os::{MapKind, Mapping};
use crate::{FabricError, FabricResult};
use std::sync::atomic::Ordering;

const PAGE: usize = 4096;

/// Something weft writes while it runs: where it lies tells whether weft's statics are part
/// of the program's data.
static MARKER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

/// The main program's writable static data after its RELRO part, whole pages: (start, bytes).
/// `None` when it has none.
pub fn program_data() -> Option<(usize, usize)> {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        out: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the dynamic linker passes a valid `dl_phdr_info` whose `dlpi_phdr` points to
        // `dlpi_phnum` program headers, for the duration of the call; `out` is the
        // `Option<(usize, usize)>` that `program_data` passed.
        let (info, out) = unsafe { (&*info, &mut *out.cast::<Option<(usize, usize)>>()) };
        let phdrs = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: see above.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) }
        };
        let bias = info.dlpi_addr as usize;
        let relro_end = phdrs
            .iter()
            .find(|p| p.p_type == libc::PT_GNU_RELRO)
            .map_or(0, |p| (bias + p.p_vaddr as usize + p.p_memsz as usize) / PAGE * PAGE);
        // Writable segments less their RELRO part (GNU ld makes one writable segment that
        // starts with it; lld a RELRO segment and another), merged where adjacent; the last.
        let mut range: Option<(usize, usize)> = None;
        for p in phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD && p.p_flags & libc::PF_W != 0) {
            let start = ((bias + p.p_vaddr as usize) / PAGE * PAGE).max(relro_end);
            let end = (bias + p.p_vaddr as usize + p.p_memsz as usize).next_multiple_of(PAGE);
            if end > start {
                range = match range {
                    Some((s, e)) if e == start => Some((s, end)),
                    _ => Some((start, end)),
                };
            }
        }
        *out = range.map(|(s, e)| (s, e - s));
        // The first object is the main program: stop there.
        1
    }
    let mut out: Option<(usize, usize)> = None;
    // SAFETY: `first` matches the callback type and only writes `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut out as *mut Option<(usize, usize)>).cast()) };
    out
}

/// The program's data range, refused where weft's own statics lie in it.
pub(crate) fn adoptable() -> FabricResult<(usize, usize)> {
    let (start, len) = program_data().ok_or(FabricError::Unsupported {
        what: "symmetric static data: the program has no writable data",
    })?;
    let marker = &MARKER as *const _ as usize;
    if (start..start + len).contains(&marker) {
        return Err(FabricError::Unsupported {
            what: "symmetric static data with weft linked into the program (link the shared library instead)",
        });
    }
    Ok((start, len))
}

/// Copies the program's bytes at `start..start + dst.len()` into `dst`.
pub(crate) fn copy_in(start: usize, dst: *mut u8, len: usize) {
    // SAFETY: `start..start + len` is the program's mapped, readable data (from `adoptable`);
    // `dst` is a fresh mapping of `len` bytes; the two do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(start as *const u8, dst, len) }
}

/// Moves `map` (a fresh shared mapping holding a copy of the program's data) over the
/// program's pages at `start`, which it replaces.
pub(crate) fn move_over(map: Mapping, start: usize) -> FabricResult<Mapping> {
    let len = map.len;
    let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
    // SAFETY: `map` is a mapping of `len` bytes that this call consumes (forgotten below, not
    // unmapped); the destination is the program's own data pages, whose bytes `map` holds.
    let p = unsafe { libc::mremap(map.ptr.cast(), len, len, flags, start as *mut libc::c_void) };
    if p == libc::MAP_FAILED {
        return Err(FabricError::last_os(format!(
            "moving shared memory over the program's {len} bytes of static data"
        )));
    }
    std::mem::forget(map);
    note_adopted(start, len);
    Ok(Mapping { ptr: p.cast(), len, kind: MapKind::Adopted })
}

/// The program's data, registered in place (for fabrics that need no file).
#[cfg_attr(not(feature = "ofi"), allow(dead_code))]
pub(crate) fn borrow(start: usize, len: usize) -> Mapping {
    Mapping { ptr: start as *mut u8, len, kind: MapKind::Borrowed }
}

/// Puts private memory with the bytes of `ptr..ptr + len` back at the same address. Where no
/// memory is left for the copy the shared mapping stays (the bytes are still there). Only
/// system calls and copies: it also runs in a child right after `fork`.
pub(crate) fn restore(ptr: *mut u8, len: usize) {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // SAFETY: a fresh private mapping anywhere, touching no existing memory.
    let keep = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, anon, -1, 0) };
    if keep == libc::MAP_FAILED {
        return;
    }
    // SAFETY: `ptr..ptr + len` is the adopted mapping, alive here; `keep` is `len` fresh bytes.
    unsafe { std::ptr::copy_nonoverlapping(ptr, keep.cast::<u8>(), len) };
    // SAFETY: moves the copy over exactly the adopted pages, which nothing else owns.
    let p = unsafe {
        libc::mremap(keep, len, len, libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, ptr.cast::<libc::c_void>())
    };
    if p == libc::MAP_FAILED {
        // SAFETY: the copy is ours and unused.
        unsafe { libc::munmap(keep, len) };
    }
}

/// The adopted range (start, length; 0: none), for a child of `fork`.
static ADOPTED: [std::sync::atomic::AtomicUsize; 2] =
    [std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicUsize::new(0)];

/// In a child of `fork`: the program's data becomes private again (its writes must not reach
/// the parent's variables through the shared file).
extern "C" fn after_fork_in_child() {
    let (start, len) = (ADOPTED[0].load(Ordering::Relaxed), ADOPTED[1].load(Ordering::Relaxed));
    if len > 0 {
        restore(start as *mut u8, len);
        ADOPTED[1].store(0, Ordering::Relaxed);
    }
}

/// Remembers the adopted range for `fork` (registers the child handler once).
pub(crate) fn note_adopted(start: usize, len: usize) {
    static HANDLER: std::sync::Once = std::sync::Once::new();
    ADOPTED[0].store(start, Ordering::Relaxed);
    ADOPTED[1].store(len, Ordering::Relaxed);
    HANDLER.call_once(|| {
        // SAFETY: registers a handler that only makes system calls and copies (see `restore`).
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_program_has_data_and_weft_is_in_it() {
        let (start, len) = program_data().expect("a Rust test program has static data");
        assert_eq!(start % PAGE, 0);
        assert_eq!(len % PAGE, 0);
        MARKER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // This test links weft statically: adoption is refused, nothing moves.
        assert!(matches!(adoptable(), Err(FabricError::Unsupported { .. })));
    }
}
