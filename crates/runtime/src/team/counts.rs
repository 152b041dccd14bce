//! Element counts of the collectives that take them (gatherv, allgatherv, alltoallv,
//! scatter): checked sums, and result buffers sized only after a check against memory.

use crate::{Error, Pod, Result};
use std::mem::size_of;

/// Bytes of `counts` elements of `T` in all (saturating: a descriptor's code of it).
pub(super) fn total_bytes<T>(counts: &[usize]) -> usize {
    counts.iter().fold(0usize, |t, &c| t.saturating_add(c)).saturating_mul(size_of::<T>())
}

/// The sum of `counts`, `None` if it overflows.
pub(super) fn sum(counts: &[usize]) -> Option<usize> {
    counts.iter().try_fold(0usize, |t, &c| t.checked_add(c))
}

/// A zeroed buffer of `elems` `T`s (`None`: a count that overflowed), its size checked
/// before anything is allocated: it must be addressable and, where the kernel says, fit the
/// memory available. Too large is `Err(TooLarge)`, never an abort.
pub(super) fn zeroed_buf<T: Pod>(elems: Option<usize>, what: &'static str) -> Result<Vec<T>> {
    let bytes = elems.and_then(|e| e.checked_mul(size_of::<T>())).filter(|&b| b <= isize::MAX as usize);
    let Some((elems, bytes)) = elems.zip(bytes) else {
        return Err(Error::TooLarge { what, len: usize::MAX, max: isize::MAX as usize });
    };
    // Only a buffer large enough to matter reads /proc (a system call and a parse, on every
    // call of a collective that allocates its result).
    if bytes > 256 << 20 {
        if let Some(avail) = weft_fabric::os::mem_available() {
            if bytes as u64 > avail {
                return Err(Error::TooLarge { what, len: bytes, max: avail as usize });
            }
        }
    }
    let mut v = Vec::new();
    v.try_reserve_exact(elems).map_err(|_| Error::TooLarge { what, len: bytes, max: 0 })?;
    v.resize(elems, T::zeroed());
    Ok(v)
}

pub(super) fn check_counts(
    counts: &[usize],
    n: usize,
    me: usize,
    mine: usize,
    what: &'static str,
) -> Result<()> {
    if counts.len() != n {
        return Err(Error::Misuse(what));
    }
    if sum(counts).and_then(|t| t.checked_mul(8)).is_none() {
        return Err(Error::Misuse("collective: the counts' sum overflows"));
    }
    if counts[me] != mine {
        return Err(Error::Mismatch(format!(
            "team rank {me} passes {mine} elements but its count says {}",
            counts[me]
        )));
    }
    Ok(())
}
