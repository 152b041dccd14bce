//! Maps in a loaded object's code at start-up, so that a routine's first call does not stall
//! on page faults for the code it runs.
//!
//! A shared library's code is mapped from its file page by page, at first touch; in a
//! virtual machine each such fault is costly, so the first call of each routine of a program
//! is many times slower than the next, and a program's first timed loop pays it.
//! `MADV_POPULATE_READ` (Linux 5.14) fills in the page tables of the executable segments at
//! once, at start-up (figures in the commit that added this).

use std::ffi::c_void;

/// The page size weft assumes (x86-64 Linux); on a machine with larger pages the `madvise`
/// fails on the alignment and nothing changes.
const PAGE: usize = 4096;

/// Populates the page tables of the executable segments of the loaded object (program or
/// shared library) that holds address `addr`; returns the bytes populated.
///
/// # Errors
///
/// No loaded object holds `addr`, or the kernel refused (older than 5.14, for one). Nothing
/// changes then: the code is mapped at first touch as before.
///
/// ```
/// let here = weft_fabric::prefault::populate_code as *const () as usize;
/// let bytes = weft_fabric::prefault::populate_code(here).unwrap_or(0);
/// println!("{bytes} bytes of code mapped in");
/// ```
pub fn populate_code(addr: usize) -> Result<usize, String> {
    struct Search {
        addr: usize,
        /// The executable segments of the object found, page-aligned.
        code: Vec<(usize, usize)>,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> libc::c_int {
        // SAFETY: the dynamic linker passes a valid `dl_phdr_info` whose `dlpi_phdr` points to
        // `dlpi_phnum` program headers for the duration of the call; `data` is the `Search`
        // that `populate_code` passed.
        let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
        if info.dlpi_phdr.is_null() {
            return 0;
        }
        // SAFETY: see above.
        let phdrs = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
        let bias = info.dlpi_addr as usize;
        let span = |p: &libc::Elf64_Phdr| {
            let start = bias.wrapping_add(p.p_vaddr as usize);
            (start, start.saturating_add(p.p_memsz as usize))
        };
        let loads = phdrs.iter().filter(|p| p.p_type == libc::PT_LOAD);
        if !loads.clone().any(|p| (span(p).0..span(p).1).contains(&search.addr)) {
            return 0;
        }
        search.code = loads
            .filter(|p| p.p_flags & libc::PF_X != 0)
            .map(|p| {
                let (s, e) = span(p);
                (s / PAGE * PAGE, e.next_multiple_of(PAGE))
            })
            .collect();
        1
    }
    let mut search = Search { addr, code: vec![] };
    // SAFETY: `each` matches the callback type and only writes `search`, which outlives the
    // call.
    unsafe { libc::dl_iterate_phdr(Some(each), (&mut search as *mut Search).cast()) };
    if search.code.is_empty() {
        return Err(format!("no loaded object holds code at {addr:#x}"));
    }
    let mut bytes = 0;
    for (start, end) in search.code {
        // SAFETY: `start..end` is a mapped, executable (so readable) segment of a loaded
        // object, page-aligned; MADV_POPULATE_READ only faults its pages in, as reading them
        // would, and changes no contents.
        let r = unsafe { libc::madvise(start as *mut c_void, end - start, libc::MADV_POPULATE_READ) };
        if r != 0 {
            return Err(format!("madvise(MADV_POPULATE_READ): {}", std::io::Error::last_os_error()));
        }
        bytes += end - start;
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::populate_code;

    #[test]
    fn populates_this_objects_code_and_refuses_other_addresses() {
        let bytes = populate_code(populate_code as *const () as usize).expect("this test's own code");
        assert!(bytes >= super::PAGE, "{bytes} bytes");
        assert!(populate_code(8).is_err(), "no object holds address 8");
    }
}
