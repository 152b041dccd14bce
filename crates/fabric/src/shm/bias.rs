//! Biased locking for the ring ends of one fabric: while a single thread of the process uses
//! the fabric, it takes and releases their locks with plain loads and stores; the first other
//! thread revokes the bias for good, and from then on every thread takes them with a locked
//! compare-and-swap.
//!
//! Why: a locked instruction costs about 6 ns on the machines weft is measured on, and an AM
//! round trip takes four (send and deliver, on each side). Without them a same-rank round trip
//! took 47 instead of 70 ns. Most programs drive communication from one thread (or funnel it),
//! where those locks only ever protect against nobody.
//!
//! How (an asymmetric Dekker handshake, as userspace RCU does it):
//! - The owner marks `busy` around each acquisition, then checks it is still the owner; only a
//!   compiler fence separates the two, no fence instruction.
//! - A revoker sets the owner to [`SHARED`], then calls `membarrier`, which runs a full barrier
//!   on every running thread of the process. After it, either the owner's `busy` store is
//!   visible to the revoker, which waits for it to clear, or the owner's check sees [`SHARED`]
//!   and takes the locked path. The revoker then sets `settled`.
//! - Threads that find the bias revoked wait for `settled` before their first locked
//!   acquisition, so nobody's compare-and-swap can race an owner's plain acquisition.
//! - A lock the owner took with a plain store is released with a release store either way, so
//!   a lock held across the revocation stays held until its holder lets go.
//!
//! Where `membarrier` is refused (old kernels, seccomp), the bias starts revoked.
//!
//! **Loans.** The runtime's on-demand progress thread serves messages only while the program's
//! threads are away from weft. Revoking the bias for that would end the fast path for the
//! rest of the run, so it borrows it ([`Bias::borrow`]): it takes ownership from the owner
//! with the same handshake as a revocation (CAS to itself, membarrier, wait for the owner's
//! open acquisition), acquires plainly meanwhile with a `busy` flag of its own, and hands
//! ownership back when done ([`Bias::give_back`]). The owner coming back during the loan
//! waits a bounded while for it to end; past that it revokes as usual (waiting for both
//! flags), and the loan ends in the shared state.

use super::spin::relax;
use crate::os;
use std::cell::Cell;
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU64, Ordering};

/// No thread has taken a lock yet.
const NOBODY: u64 = 0;
/// More than one thread has: every acquisition is a compare-and-swap.
const SHARED: u64 = u64::MAX;
/// Turns of [`relax`] a lender waits for its bias to come back from a loan before it revokes
/// it instead (spins, then yields: a bound, so that no wait on the borrower can deadlock).
const LOAN_WAIT: u32 = 1000;

/// This thread's id for [`Bias`]: never 0 or [`SHARED`], never reused.
#[inline]
fn thread_id() -> u64 {
    thread_local! {
        static ID: Cell<u64> = const { Cell::new(NOBODY) };
    }
    ID.with(|id| match id.get() {
        NOBODY => {
            static NEXT: AtomicU64 = AtomicU64::new(1);
            let fresh = NEXT.fetch_add(1, Ordering::Relaxed);
            id.set(fresh);
            fresh
        }
        known => known,
    })
}

/// The bias state of one fabric's locks (on a cache line of its own: the owner writes `busy`
/// on every acquisition).
#[repr(align(64))]
pub struct Bias {
    owner: AtomicU64,
    busy: AtomicBool,
    settled: AtomicBool,
    /// The thread that holds the bias on loan (0: none); its acquisitions mark `guest_busy`.
    guest: AtomicU64,
    guest_busy: AtomicBool,
    /// The owner the loan came from, to whom it goes back.
    lender: AtomicU64,
}

/// An open plain acquisition by the owner; closing it (drop) publishes the acquisition.
pub struct Plain<'a>(&'a AtomicBool);

impl Drop for Plain<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Bias {
    /// A bias no thread holds yet; revoked from the start when `membarrier` is unavailable.
    pub fn new() -> Self {
        let usable = os::membarrier_register();
        Bias {
            owner: AtomicU64::new(if usable { NOBODY } else { SHARED }),
            busy: AtomicBool::new(false),
            settled: AtomicBool::new(!usable),
            guest: AtomicU64::new(NOBODY),
            guest_busy: AtomicBool::new(false),
            lender: AtomicU64::new(NOBODY),
        }
    }

    /// Whether the bias still stands (one thread has used the locks, or none).
    pub fn holds(&self) -> bool {
        self.owner.load(Ordering::Relaxed) != SHARED
    }

    /// `Some` if this thread may acquire with plain loads and stores (it owns the bias), for
    /// as long as the returned value lives; `None` after making sure a compare-and-swap is safe.
    #[inline]
    pub fn plain(&self) -> Option<Plain<'_>> {
        let me = thread_id();
        if self.owner.load(Ordering::Relaxed) == me {
            // The owner's flag, or the borrower's (each flag has one writer).
            let busy = if self.guest.load(Ordering::Relaxed) == me { &self.guest_busy } else { &self.busy };
            busy.store(true, Ordering::Relaxed);
            // The light side of the handshake (see the module documentation): the revoker's
            // membarrier orders the store above before the load below.
            compiler_fence(Ordering::SeqCst);
            if self.owner.load(Ordering::Relaxed) == me {
                return Some(Plain(busy));
            }
            busy.store(false, Ordering::Release);
        }
        self.locked_path(me)
    }

    /// Not the owner: claim the bias if nobody holds it, revoke it if somebody else does, and
    /// wait until the revocation has settled.
    #[inline(never)]
    fn locked_path(&self, me: u64) -> Option<Plain<'_>> {
        let mut owner = self.owner.load(Ordering::Acquire);
        if owner != NOBODY && owner != SHARED && owner == self.guest.load(Ordering::Acquire) {
            if self.lender.load(Ordering::Acquire) == me && self.await_return(me, owner) {
                return self.plain();
            }
            owner = self.owner.load(Ordering::Acquire);
        }
        if owner == NOBODY {
            match self.owner.compare_exchange(NOBODY, me, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return self.plain(),
                Err(now) => owner = now,
            }
        }
        if owner != SHARED
            && self.owner.compare_exchange(owner, SHARED, Ordering::AcqRel, Ordering::Acquire).is_ok()
        {
            self.revoke();
        }
        let mut spins = 0u32;
        while !self.settled.load(Ordering::Acquire) {
            relax(&mut spins);
        }
        None
    }

    /// The lender found its bias on loan: wait a little for it to come back (a loan lasts one
    /// round of progress) rather than end the fast path for good. True once it is back.
    #[cold]
    fn await_return(&self, me: u64, guest: u64) -> bool {
        let mut spins = 0u32;
        while spins < LOAN_WAIT {
            match self.owner.load(Ordering::Acquire) {
                now if now == me => return true,
                now if now != guest => return false,
                _ => relax(&mut spins),
            }
        }
        false
    }

    /// The heavy side: after the barrier the old owner either sees [`SHARED`] or its `busy`
    /// store is visible here; wait until its open acquisition (if any) is published.
    #[cold]
    fn revoke(&self) {
        self.handshake();
        self.settled.store(true, Ordering::Release);
    }

    /// After changing the owner: make every thread's view of it agree with its `busy` stores,
    /// then wait until the open plain acquisitions (the owner's and a borrower's) are closed.
    fn handshake(&self) {
        if !os::membarrier_all_threads() {
            // Registered, yet refused: a full fence here cannot reach the owner's CPU, so only
            // waiting helps. Acquisitions are a handful of instructions; give the owner ample
            // time to see the new owner before anyone relies on it.
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut spins = 0u32;
        while self.busy.load(Ordering::Acquire) || self.guest_busy.load(Ordering::Acquire) {
            relax(&mut spins);
        }
    }

    /// Takes the bias on loan for this thread (see the module documentation): true if this
    /// thread now acquires plainly until [`Bias::give_back`]; false if the bias is revoked
    /// (acquisitions are locked anyway) or already this thread's.
    #[cold]
    pub fn borrow(&self) -> bool {
        let me = thread_id();
        let owner = self.owner.load(Ordering::Acquire);
        if owner == SHARED || owner == me {
            return false;
        }
        // Named before it owns anything: its acquisitions must mark the borrower's flag.
        self.guest.store(me, Ordering::Relaxed);
        if self.owner.compare_exchange(owner, me, Ordering::AcqRel, Ordering::Acquire).is_err() {
            return false;
        }
        self.lender.store(owner, Ordering::Relaxed);
        if owner != NOBODY {
            // The lender may be inside a plain acquisition: wait until it has left it (it sees
            // the new owner at its next one and takes the locked path).
            self.handshake();
        }
        true
    }

    /// Ends this thread's loan ([`Bias::borrow`] returned true), with no acquisition open:
    /// ownership goes back to the lender, unless somebody revoked the bias meanwhile.
    #[cold]
    pub fn give_back(&self) {
        let me = thread_id();
        let lender = self.lender.load(Ordering::Relaxed);
        // Release: the borrower's acquisitions and releases happen before the lender's next.
        let _ = self.owner.compare_exchange(me, lender, Ordering::AcqRel, Ordering::Relaxed);
    }
}

impl Default for Bias {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn first_thread_owns_second_revokes() {
        let bias = Arc::new(Bias::new());
        if !bias.holds() {
            return; // membarrier refused here: nothing to test but the locked path
        }
        assert!(bias.plain().is_some(), "the first thread takes the bias");
        assert!(bias.plain().is_some(), "and keeps it");
        let b = bias.clone();
        let other = std::thread::spawn(move || b.plain().is_some()).join().unwrap();
        assert!(!other, "a second thread never acquires plainly");
        assert!(!bias.holds());
        assert!(bias.plain().is_none(), "the owner lost the bias for good");
    }

    /// A lock built on the bias, bumping a counter with non-atomic read-modify-writes: a lost
    /// update shows a broken mutual exclusion.
    struct Lock {
        bias: Bias,
        locked: AtomicBool,
        count: AtomicUsize,
    }

    impl Lock {
        fn new() -> Arc<Self> {
            Arc::new(Lock { bias: Bias::new(), locked: AtomicBool::new(false), count: AtomicUsize::new(0) })
        }
        fn acquire(&self) {
            loop {
                if let Some(_p) = self.bias.plain() {
                    if !self.locked.load(Ordering::Acquire) {
                        self.locked.store(true, Ordering::Relaxed);
                        return;
                    }
                } else if self
                    .locked
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
                std::hint::spin_loop();
            }
        }
        fn bump(&self) {
            self.acquire();
            let v = self.count.load(Ordering::Relaxed);
            self.count.store(v + 1, Ordering::Relaxed);
            self.locked.store(false, Ordering::Release);
        }
    }

    /// Mutual exclusion across the revocation.
    #[test]
    fn revocation_keeps_mutual_exclusion() {
        for _ in 0..20 {
            let lock = Lock::new();
            let per = 20_000;
            let threads: Vec<_> = (0..3)
                .map(|_| {
                    let l = lock.clone();
                    std::thread::spawn(move || (0..per).for_each(|_| l.bump()))
                })
                .collect();
            (0..per).for_each(|_| lock.bump());
            threads.into_iter().for_each(|t| t.join().unwrap());
            assert_eq!(lock.count.load(Ordering::Relaxed), 4 * per);
        }
    }

    #[test]
    fn a_loan_goes_back() {
        let lock = Lock::new();
        if !lock.bias.holds() {
            return;
        }
        lock.bump();
        assert!(lock.bias.plain().is_some(), "the first thread owns the bias");
        let l = lock.clone();
        let lent = std::thread::spawn(move || {
            let lent = l.bias.borrow();
            let plain = l.bias.plain().is_some();
            l.bump();
            l.bias.give_back();
            (lent, plain)
        })
        .join()
        .unwrap();
        assert_eq!(lent, (true, true), "the borrower acquires plainly");
        assert!(lock.bias.holds(), "a loan revokes nothing");
        assert!(lock.bias.plain().is_some(), "the owner has its fast path back");
        lock.bump();
        assert_eq!(lock.count.load(Ordering::Relaxed), 3);
    }

    /// The owner keeps bumping while a borrower takes loans and bumps during each (the owner
    /// comes back mid-loan and revokes, or finds the bias returned); later a third thread
    /// joins. No update is lost.
    #[test]
    fn loans_keep_mutual_exclusion() {
        for round in 0..10 {
            let lock = Lock::new();
            let per = 20_000;
            lock.bump();
            let l = lock.clone();
            let borrower = std::thread::spawn(move || {
                for _ in 0..200 {
                    let lent = l.bias.borrow();
                    (0..50).for_each(|_| l.bump());
                    if lent {
                        l.bias.give_back();
                    }
                }
            });
            let third = (round % 2 == 1).then(|| {
                let l = lock.clone();
                std::thread::spawn(move || (0..per).for_each(|_| l.bump()))
            });
            (0..per).for_each(|_| lock.bump());
            borrower.join().unwrap();
            let extra = third.map_or(0, |t| {
                t.join().unwrap();
                per
            });
            assert_eq!(lock.count.load(Ordering::Relaxed), 1 + per + 200 * 50 + extra);
        }
    }
}
