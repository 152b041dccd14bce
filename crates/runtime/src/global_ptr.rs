//! Global pointers: a typed (rank, segment, byte offset) address, checked where it is used.

use std::marker::PhantomData;

/// A typed address in some rank's segment: (rank, segment, byte offset). Creating one never
/// fails; every operation checks rank, bounds and alignment and returns an error instead of
/// touching memory outside a segment.
pub struct GlobalPtr<T> {
    pub(crate) rank: u32,
    pub(crate) seg: u32,
    pub(crate) byte_offset: usize,
    pub(crate) _t: PhantomData<fn() -> T>,
}

impl<T> Clone for GlobalPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for GlobalPtr<T> {}

impl<T> std::fmt::Debug for GlobalPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GlobalPtr(rank {}, segment {}, byte {})", self.rank, self.seg, self.byte_offset)
    }
}

/// Byte offset [`OVERFLOWED`] stands for: an address past every segment, whatever its size.
/// Address arithmetic saturates to it instead of wrapping round to a valid offset.
pub(crate) const OVERFLOWED: usize = usize::MAX;

/// `a + b` bytes, or [`OVERFLOWED`] when it does not fit (or `a` already overflowed).
fn offset_add(a: usize, b: usize) -> usize {
    a.checked_add(b).unwrap_or(OVERFLOWED)
}

/// The bytes of `n` elements of `size` bytes, or [`OVERFLOWED`].
pub(crate) fn elements(n: usize, size: usize) -> usize {
    n.checked_mul(size).unwrap_or(OVERFLOWED)
}

/// `p + n`: the address `n` elements further (past every segment if that overflows; checked
/// when used).
impl<T> std::ops::Add<usize> for GlobalPtr<T> {
    type Output = GlobalPtr<T>;
    fn add(self, n: usize) -> Self {
        GlobalPtr { byte_offset: offset_add(self.byte_offset, elements(n, size_of::<T>())), ..self }
    }
}

impl<T> GlobalPtr<T> {
    /// The address of byte `byte_offset` of segment `segment` on `rank` (as carried in
    /// messages). Every use is checked, so a bad address is an error, not a stray access.
    pub fn new(rank: u32, segment: u32, byte_offset: usize) -> Self {
        GlobalPtr { rank, seg: segment, byte_offset, _t: PhantomData }
    }
    /// Owning rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }
    /// Id of the segment it points into.
    pub fn segment_id(&self) -> u32 {
        self.seg
    }
    /// Offset in bytes from the start of the rank's part of the segment.
    pub fn byte_offset(&self) -> usize {
        self.byte_offset
    }
    /// The address `bytes` bytes further (may become misaligned or pass every segment;
    /// checked when used).
    pub fn byte_add(self, bytes: usize) -> Self {
        GlobalPtr { byte_offset: offset_add(self.byte_offset, bytes), ..self }
    }
    /// The same element offset on another rank.
    pub fn on(self, rank: u32) -> Self {
        GlobalPtr { rank, ..self }
    }
    /// Reinterprets the address as pointing to `U` (alignment is checked when used).
    pub fn cast<U>(self) -> GlobalPtr<U> {
        GlobalPtr { rank: self.rank, seg: self.seg, byte_offset: self.byte_offset, _t: PhantomData }
    }
}
