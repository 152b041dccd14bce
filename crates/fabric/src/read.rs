//! Destinations a fabric may write after the call that started a get has returned.
//!
//! A non-blocking get that reads straight into the caller's memory is sound only while that
//! memory cannot be freed, read or written before the read completes. A slice borrowed by a
//! handle cannot promise it: a handle can be forgotten (`mem::forget`), after which the
//! borrow ends while the network still writes. Two owners can, and [`Fabric::get_into`]
//! reads in place only into them:
//! - a [`ReadScope`] ([`read_scope`]): slices borrowed for the scope, which does not end
//!   before every read into them has completed, also when its closure panics (as
//!   `std::thread::scope` does for threads);
//! - a [`ReadBuf`]: a vector the fabric holds a share of until the read completes, so a
//!   forgotten handle leaks it and never frees it.

use crate::pod::{bytes_of_mut, Pod};
use crate::Fabric;
use std::any::Any;
use std::marker::PhantomData;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

/// What keeps a destination's memory alive and unshared while a fabric holds it.
type Keep = Arc<dyn Any + Send + Sync>;

/// The destination of [`Fabric::get_into`]: bytes that stay valid, and touched by nobody
/// else, for as long as the fabric holds what this gives it.
pub struct ReadDst<'a> {
    addr: usize,
    len: usize,
    keep: Keep,
    _borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> ReadDst<'a> {
    /// Bytes to read.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether there is nothing to read.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The bytes as a slice, for a fabric that fills them before returning (or a caller
    /// that takes another path): the fabric keeps nothing then.
    pub fn into_slice(self) -> &'a mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `addr..addr + len` is a live slice this value borrows exclusively for 'a
        // (a scope's `&'a mut [u8]`, or a `ReadBuf` borrowed mutably for 'a whose share
        // nobody else holds: `ReadBuf::dst` checks it).
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
    /// The bytes for a fabric that writes them later: valid while the [`Landing`] lives
    /// (and this value too, if it is not given up: [`ReadDst::into_slice`] is sound only
    /// once no landing of it is left).
    #[cfg_attr(not(feature = "ofi"), allow(dead_code))]
    pub(crate) fn landing(&self) -> Landing {
        Landing { addr: self.addr, len: self.len, _keep: self.keep.clone() }
    }
}

/// A destination held by a fabric's operation in flight: `addr..addr + len` may be written
/// until the last clone is dropped (drop it before reporting the completion).
#[derive(Clone)]
#[cfg_attr(not(feature = "ofi"), allow(dead_code))]
pub(crate) struct Landing {
    pub addr: usize,
    pub len: usize,
    _keep: Keep,
}

/// Slices that gets may read into until the scope ends (see [`read_scope`]). Invariant in
/// `'env`, so a slice must be borrowed for the whole scope.
pub struct ReadScope<'env> {
    mark: Arc<()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'env> ReadScope<'env> {
    /// A destination for [`Fabric::get_into`]: `buf`, borrowed until the scope ends. The
    /// destination itself cannot leave the scope's closure (it would keep the scope open):
    ///
    /// ```compile_fail
    /// # fn demo(fabric: &dyn weft_fabric::Fabric) {
    /// let mut buf = vec![0u8; 64];
    /// let kept = weft_fabric::read::read_scope(fabric, |s| s.dst(&mut buf));
    /// # }
    /// ```
    pub fn dst<'s>(&'s self, buf: &'env mut [u8]) -> ReadDst<'s> {
        ReadDst {
            addr: buf.as_mut_ptr() as usize,
            len: buf.len(),
            keep: self.mark.clone(),
            _borrow: PhantomData,
        }
    }
    /// True once no fabric holds a destination of this scope: every read into its slices
    /// has completed, and its bytes are visible to this thread.
    pub fn settled(&self) -> bool {
        let settled = Arc::strong_count(&self.mark) == 1;
        if settled {
            // Pairs with the release of the fabric's drop of its clone after the read.
            fence(Ordering::Acquire);
        }
        settled
    }
}

/// Runs `f` with a [`ReadScope`] and returns once every read into the scope's slices has
/// completed ([`Fabric::wait_reads`]), also when `f` panics.
///
/// Gets into the scope's slices must go through `fabric` (or a fabric that `fabric`'s
/// progress completes): the scope waits for them however long it takes, and never ends
/// before they have completed, also when `wait_reads` returns early.
///
/// ```
/// use weft_fabric::read::read_scope;
/// # fn demo(fabric: &dyn weft_fabric::Fabric, src: &weft_fabric::RemoteRegion) -> weft_fabric::FabricResult<()> {
/// let mut buf = vec![0u8; 1 << 20];
/// read_scope(fabric, |s| fabric.get_into(src, 0, s.dst(&mut buf), 7).map(drop))?;
/// // The read has completed: `buf` holds the bytes.
/// # Ok(()) }
/// ```
pub fn read_scope<'env, R>(fabric: &dyn Fabric, f: impl FnOnce(&ReadScope<'env>) -> R) -> R {
    struct End<'f, 'env>(&'f dyn Fabric, ReadScope<'env>);
    impl Drop for End<'_, '_> {
        fn drop(&mut self) {
            // `wait_reads` is safe code a fabric implements: trust only `settled`.
            let mut rounds = 0u32;
            loop {
                self.0.wait_reads(&self.1);
                if self.1.settled() {
                    return;
                }
                rounds = rounds.saturating_add(1);
                if rounds == 10_000 {
                    eprintln!(
                        "weft: a read scope waits for gets its fabric ({}) does not complete",
                        self.0.name()
                    );
                }
                if rounds > 64 {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
    let end = End(fabric, ReadScope { mark: Arc::new(()), _env: PhantomData });
    f(&end.1)
}

/// A vector that gets may read into while a handle that owns it is in flight: the fabric
/// holds a share of it until the read completes, so dropping or forgetting the handle early
/// never frees memory the network still writes.
pub struct ReadBuf {
    inner: Arc<BufInner>,
}

struct BufInner {
    vec: Box<dyn PodVec>,
    /// Where the vector's bytes lie (on the heap: moving the vector does not move them).
    addr: usize,
    len: usize,
}

trait PodVec: Send + Sync {
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn bytes(&mut self) -> &mut [u8];
}

impl<T: Pod> PodVec for Vec<T> {
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn bytes(&mut self) -> &mut [u8] {
        bytes_of_mut(self.as_mut_slice())
    }
}

impl ReadBuf {
    /// Wraps `v`.
    pub fn new<T: Pod>(mut v: Vec<T>) -> Self {
        let bytes = bytes_of_mut(v.as_mut_slice());
        let (addr, len) = (bytes.as_mut_ptr() as usize, bytes.len());
        ReadBuf { inner: Arc::new(BufInner { vec: Box::new(v), addr, len }) }
    }
    /// A destination for [`Fabric::get_into`] of the whole vector; `None` while a fabric
    /// still holds it.
    pub fn dst(&mut self) -> Option<ReadDst<'_>> {
        Arc::get_mut(&mut self.inner)?;
        let keep: Keep = self.inner.clone();
        Some(ReadDst { addr: self.inner.addr, len: self.inner.len, keep, _borrow: PhantomData })
    }
    /// The bytes; `None` while a fabric still holds them.
    pub fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        Arc::get_mut(&mut self.inner).map(|i| i.vec.bytes())
    }
    /// Takes the vector out (leaving an empty one): `None` while a fabric still holds it or
    /// if it is not a `Vec<T>`.
    pub fn take<T: Pod>(&mut self) -> Option<Vec<T>> {
        let inner = Arc::get_mut(&mut self.inner)?;
        let v = std::mem::take(inner.vec.as_any_mut().downcast_mut::<Vec<T>>()?);
        inner.len = 0;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_buffer_is_neither_lent_nor_taken() {
        let mut b = ReadBuf::new(vec![1u32, 2, 3]);
        let held = b.dst().unwrap().landing();
        assert_eq!(held.len, 12);
        assert!(b.dst().is_none() && b.bytes_mut().is_none() && b.take::<u32>().is_none());
        drop(held);
        assert_eq!(b.bytes_mut().unwrap().len(), 12);
        assert!(b.take::<u64>().is_none(), "another element type");
        assert_eq!(b.take::<u32>().unwrap(), vec![1, 2, 3]);
        assert_eq!(b.dst().unwrap().len(), 0);
    }

    #[test]
    fn a_scope_is_settled_once_nothing_holds_its_slices() {
        let mut a = [0u8; 4];
        let s = ReadScope { mark: Arc::new(()), _env: PhantomData };
        let held = s.dst(&mut a).landing();
        assert!(!s.settled());
        drop(held);
        assert!(s.settled());
    }
}
