//! Plain-old-data element types and safe views of registered memory.
//!
//! Registered memory is written by peers at any time (that is what one-sided communication
//! means), so handing out `&[T]` or `&mut [T]` over it cannot be checked by the compiler.
//! [`LocalView`] offers element reads and writes that are always sound, atomics, and `unsafe`
//! slice views for zero-copy compute when the program's synchronisation (a barrier, a flag)
//! guarantees that no peer writes the range meanwhile.

use crate::LocalRegion;
use std::marker::PhantomData;
use std::sync::atomic::AtomicU64;

/// Types that may live in registered memory and travel as raw bytes: `Copy`, no pointers, no
/// padding-dependent invariants, and every bit pattern is a valid value.
///
/// # Safety
/// Implement only for types for which every bit pattern of `size_of::<T>()` bytes is a valid
/// value and which contain no references, pointers or interior mutability.
pub unsafe trait Pod: Copy + Send + Sync + 'static {
    /// The all-zero value.
    fn zeroed() -> Self {
        // SAFETY: implementors promise that every bit pattern, zero included, is a valid value.
        unsafe { std::mem::zeroed() }
    }
}

macro_rules! pod {
    ($($t:ty),*) => { $(
        // SAFETY: primitive numeric types accept every bit pattern.
        unsafe impl Pod for $t {}
    )* };
}
pod!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);
// SAFETY: an array of Pod elements has no padding and accepts every bit pattern.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// The bytes of a slice of `Pod` values.
pub fn bytes_of<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: T is Pod (no padding invariants), the byte length is the slice's size in memory,
    // and u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

/// The bytes of a mutable slice of `Pod` values (any bytes written form valid values).
pub fn bytes_of_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as bytes_of; every bit pattern written is a valid T because T is Pod.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

/// The first `len` elements of type `T` laid over `words`, if they fit and `T` needs no more
/// than 8-byte alignment: a typed scratch that can live on the stack.
///
/// ```
/// let mut words = [0u64; 4];
/// let s: &mut [f32] = weft_fabric::pod::words_as_mut(&mut words, 8).unwrap();
/// s[7] = 1.5;
/// assert!(weft_fabric::pod::words_as_mut::<f32>(&mut words, 9).is_none());
/// ```
pub fn words_as_mut<T: Pod>(words: &mut [u64], len: usize) -> Option<&mut [T]> {
    if std::mem::align_of::<T>() > 8 || len.checked_mul(std::mem::size_of::<T>())? > words.len() * 8 {
        return None;
    }
    // SAFETY: the words are 8-aligned, which is enough for T (checked), and `len` Ts fit in
    // them (checked); every bit pattern is a valid T (Pod), and the result borrows `words`
    // mutably for its whole life.
    Some(unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<T>(), len) })
}

/// A typed view of this rank's part of a registered region (see the module documentation).
pub struct LocalView<'a, T: Pod> {
    ptr: *mut T,
    len: usize,
    _region: PhantomData<&'a LocalRegion>,
}

// SAFETY: the view is an address range in memory kept alive by the borrowed region; all safe
// accesses are volatile element copies or atomics.
unsafe impl<T: Pod> Send for LocalView<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Pod> Sync for LocalView<'_, T> {}

impl<'a, T: Pod> LocalView<'a, T> {
    /// Views `region` as `len` elements of `T`; `None` if it does not fit or is misaligned.
    pub fn new(region: &'a LocalRegion, len: usize) -> Option<Self> {
        let ptr = region.as_ptr().cast::<T>();
        let fits = len.checked_mul(std::mem::size_of::<T>()).is_some_and(|b| b <= region.len);
        (fits && (ptr as usize).is_multiple_of(std::mem::align_of::<T>())).then_some(LocalView {
            ptr,
            len,
            _region: PhantomData,
        })
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if the view has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Reads element `i`; panics if `i` is out of range.
    pub fn read(&self, i: usize) -> T {
        assert!(i < self.len, "index {i} out of range for a segment of {} elements", self.len);
        // SAFETY: i is in range of live memory; a volatile read tolerates concurrent peers.
        unsafe { self.ptr.add(i).read_volatile() }
    }
    /// Writes element `i`; panics if `i` is out of range.
    pub fn write(&self, i: usize, v: T) {
        assert!(i < self.len, "index {i} out of range for a segment of {} elements", self.len);
        // SAFETY: as read.
        unsafe { self.ptr.add(i).write_volatile(v) }
    }
    /// Copies `out.len()` elements starting at `start` into `out`; panics if out of range.
    pub fn copy_out(&self, start: usize, out: &mut [T]) {
        assert!(start.checked_add(out.len()).is_some_and(|e| e <= self.len), "range out of bounds");
        // SAFETY: the source range is in bounds of live memory; out is an exclusive slice.
        unsafe {
            crate::copy::copy_bytes(self.ptr.add(start).cast(), out.as_mut_ptr().cast(), size_of_val(out))
        }
    }
    /// Copies `src` into the view starting at `start`; panics if out of range.
    pub fn copy_in(&self, start: usize, src: &[T]) {
        assert!(start.checked_add(src.len()).is_some_and(|e| e <= self.len), "range out of bounds");
        // SAFETY: the destination range is in bounds of live memory; src is a live slice.
        unsafe { crate::copy::copy_bytes(src.as_ptr().cast(), self.ptr.add(start).cast(), size_of_val(src)) }
    }
    /// Address of the first element (this process's mapping of the memory), for code that
    /// hands the memory to C or compares addresses with it.
    pub fn as_ptr(&self) -> *mut T {
        self.ptr
    }
    /// The whole view as a slice.
    ///
    /// # Safety
    /// No peer (and no other thread) may write this memory while the slice is alive.
    pub unsafe fn as_slice(&self) -> &[T] {
        // SAFETY: in bounds and alive; exclusivity of writers is the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    /// The whole view as a mutable slice.
    ///
    /// # Safety
    /// No peer (and no other thread) may read or write this memory while the slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [T] {
        // SAFETY: in bounds and alive; exclusivity is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: Pod> LocalView<'_, T> {
    /// Element `i` of a view whose elements are 8-byte aligned, as an atomic: the right way to
    /// read a flag or counter that peers update with RMA or remote atomics.
    pub fn atomic(&self, i: usize) -> &AtomicU64 {
        assert!(std::mem::size_of::<T>() == 8, "atomic access needs 8-byte elements");
        assert!(i < self.len, "index {i} out of range for a segment of {} elements", self.len);
        // SAFETY: the element is in bounds, 8 bytes and 8-aligned (the region is page-aligned
        // and T is 8 bytes); AtomicU64 has the layout of u64; the memory outlives the borrow.
        unsafe { &*self.ptr.add(i).cast::<AtomicU64>() }
    }

    /// The whole view of 8-byte elements as atomics (for code that updates many elements:
    /// one bounds check per index, no per-element assertion on the size).
    pub fn atomics(&self) -> &[AtomicU64] {
        assert!(std::mem::size_of::<T>() == 8, "atomic access needs 8-byte elements");
        // SAFETY: the view's elements are in bounds, 8 bytes and 8-aligned (as `atomic`);
        // AtomicU64 has the layout of u64 and every access through it is atomic, so peers'
        // concurrent RMA and atomics are no data race; the memory outlives the borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<AtomicU64>(), self.len) }
    }
}

/// A heap buffer aligned to 16 bytes (the largest alignment of a number type), viewable as a
/// slice of any [`Pod`] type of that alignment or less (for data that arrives as bytes and is
/// used as `[T]` without another copy).
#[derive(Clone)]
pub struct AlignedBuf {
    words: Vec<u128>,
    len: usize,
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

impl AlignedBuf {
    /// `len` zero bytes. A zero-filled `Vec` of numbers comes from `calloc`: a large buffer's
    /// fresh pages stay untouched until written, so one costs nothing before it is filled.
    pub fn zeroed(len: usize) -> Self {
        AlignedBuf { words: vec![0u128; len.div_ceil(16)], len }
    }
    /// [`AlignedBuf::zeroed`], or `None` where the memory cannot be had (an address-space or
    /// memory limit) instead of an abort.
    pub fn try_zeroed(len: usize) -> Option<Self> {
        let n = len.div_ceil(16);
        if n == 0 {
            return Some(AlignedBuf { words: Vec::new(), len });
        }
        let layout = std::alloc::Layout::array::<u128>(n).ok()?;
        // SAFETY: the layout has a non-zero size (n > 0).
        let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u128>();
        if p.is_null() {
            return None;
        }
        // SAFETY: p was allocated by the global allocator with the layout of `n` u128s, all of
        // them initialised (zero), which is what a Vec of length and capacity n owns.
        let words = unsafe { Vec::from_raw_parts(p, n, n) };
        Some(AlignedBuf { words, len })
    }
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `words` holds ≥ len initialised bytes, contiguous.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<u8>(), self.len) }
    }
    /// The bytes, mutably.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast::<u8>(), self.len) }
    }
    /// The first `n` elements of `T` (panics if they do not fit or T needs more than 16-byte
    /// alignment).
    pub fn as_slice<T: Pod>(&self, n: usize) -> &[T] {
        assert!(
            n.checked_mul(std::mem::size_of::<T>()).is_some_and(|b| b <= self.len),
            "view exceeds the buffer"
        );
        assert!(std::mem::align_of::<T>() <= 16, "alignment above 16 bytes");
        // SAFETY: in bounds and aligned (checked; a Vec<u128> is 16-aligned); T is Pod so any
        // bytes are a valid T.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast::<T>(), n) }
    }
}

/// The [`TypeId`](std::any::TypeId) of any type, `'static` or not, with its lifetimes erased
/// (two types that differ only in lifetimes get the same key).
///
/// Serde hands a serializer its values through generic parameters that are not `'static`; this
/// key lets the archive recognise, for example, the iterator of a `Vec<f64>` and copy its
/// elements as one block.
///
/// ```
/// use weft_fabric::pod::type_key;
/// assert_eq!(type_key::<&str>(), type_key::<&'static str>());
/// assert_ne!(type_key::<Vec<u8>>(), type_key::<Vec<i8>>());
/// ```
pub fn type_key<T: ?Sized>() -> std::any::TypeId {
    typeid::of::<T>()
}

/// The elements a slice iterator has yet to yield, if `I` is `std::slice::Iter<'_, P>`;
/// `None` for any other type.
///
/// ```
/// use weft_fabric::pod::remaining_slice;
/// let v = vec![1.5f64, 2.5, 3.5];
/// let mut it = v.iter();
/// it.next();
/// assert_eq!(remaining_slice::<_, f64>(&it), Some(&[2.5, 3.5][..]));
/// assert_eq!(remaining_slice::<_, u64>(&it), None);
/// ```
pub fn remaining_slice<I, P: Pod>(it: &I) -> Option<&[P]> {
    if type_key::<I>() != type_key::<std::slice::Iter<'static, P>>() {
        return None;
    }
    // SAFETY: the keys are equal with lifetimes erased, so `I` is `slice::Iter<'x, P>` for some
    // 'x. `&I` being valid for the borrow means 'x outlives it, so the slice (shortened to the
    // borrow) stays valid; the cast only renames the lifetime.
    let it = unsafe { &*(it as *const I).cast::<std::slice::Iter<'_, P>>() };
    Some(it.as_slice())
}

/// `v` as a value of type `T`, if `T` is `Vec<P>`; gives `v` back otherwise.
///
/// A deserializer uses this to return a `Vec<P>` it built in one block where serde's generic
/// signature only says "the visitor's value".
///
/// ```
/// use weft_fabric::pod::vec_as;
/// let back: Vec<u16> = vec_as(vec![1u16, 2]).unwrap();
/// assert_eq!(back, [1, 2]);
/// assert!(vec_as::<u16, Vec<i16>>(vec![1u16]).is_err());
/// ```
pub fn vec_as<P: Pod, T>(v: Vec<P>) -> Result<T, Vec<P>> {
    if type_key::<T>() != type_key::<Vec<P>>() {
        return Err(v);
    }
    let v = std::mem::ManuallyDrop::new(v);
    // SAFETY: `Vec<P>` has no lifetime parameters (P: 'static), so a type whose key equals its
    // key is `Vec<P>` itself; the value is moved out of the ManuallyDrop exactly once.
    Ok(unsafe { std::ptr::read((&*v as *const Vec<P>).cast::<T>()) })
}

/// A `Vec<P>` holding the elements whose native-order bytes are `bytes` (one copy).
///
/// Panics if `bytes` is not a whole number of elements.
///
/// ```
/// use weft_fabric::pod::vec_from_bytes;
/// assert_eq!(vec_from_bytes::<u16>(&[1, 0, 2, 0]), [1, 2]);
/// ```
pub fn vec_from_bytes<P: Pod>(bytes: &[u8]) -> Vec<P> {
    let size = std::mem::size_of::<P>();
    assert!(size > 0 && bytes.len().is_multiple_of(size), "not a whole number of elements");
    let mut v = vec![P::zeroed(); bytes.len() / size];
    bytes_of_mut(&mut v).copy_from_slice(bytes);
    v
}

/// `v` as a `Vec<B>` without copying, if `A` and `B` have the same size and alignment (so the
/// allocation's layout is the same); gives `v` back otherwise.
///
/// ```
/// use weft_fabric::pod::vec_cast;
/// let f: Vec<f64> = vec_cast(vec![0x3ff0_0000_0000_0000u64]).unwrap();
/// assert_eq!(f, [1.0]);
/// assert!(vec_cast::<u64, u32>(vec![1]).is_err());
/// ```
pub fn vec_cast<A: Pod, B: Pod>(v: Vec<A>) -> Result<Vec<B>, Vec<A>> {
    if std::mem::size_of::<A>() != std::mem::size_of::<B>()
        || std::mem::align_of::<A>() != std::mem::align_of::<B>()
    {
        return Err(v);
    }
    let mut v = std::mem::ManuallyDrop::new(v);
    let (ptr, len, cap) = (v.as_mut_ptr(), v.len(), v.capacity());
    // SAFETY: the allocation was made for `cap` elements of A, whose size and alignment B
    // shares, so its layout is that of `cap` elements of B; the first `len` hold initialised
    // bytes, which are valid B values because B is Pod. `v` is not used or dropped again.
    Ok(unsafe { Vec::from_raw_parts(ptr.cast::<B>(), len, cap) })
}
