//! Progress and waiting: polling, the back-off policy, liveness checks, the progress thread.

use crate::{Comm, Error, Result};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};
use weft_fabric::{PeerState, PollSet};

/// Which peers a wait depends on: if one of them dies (or leaves, where it matters) the wait
/// fails with [`Error::PeerFailed`] instead of hanging.
#[derive(Clone, Copy)]
pub(crate) enum Deps<'a> {
    /// One rank, which must stay in the job.
    Rank(u32),
    /// The ranks for which the predicate says "still needed" must stay in the job; any rank
    /// dying is fatal. (Collectives: a member that did its part and finalized is no failure.)
    Needed(&'a dyn Fn(u32) -> bool),
    /// Only a rank dying is fatal (waits on user conditions).
    AnyDead,
    /// A team's wait: as [`Deps::Needed`], and at every peer check `check` may end the wait
    /// with an error (the team's members disagree on the call).
    Team { needed: &'a dyn Fn(u32) -> bool, check: &'a dyn Fn() -> Option<Error> },
}

/// How long waits yield the processor before they start sleeping.
const YIELD_WINDOW: Duration = Duration::from_millis(1);
/// Longest single sleep of a waiting thread.
const MAX_SLEEP: Duration = Duration::from_millis(2);
/// Longest sleep of [`Comm::wait_until_written`].
pub const RMA_WAIT_SLEEP: Duration = Duration::from_micros(100);

/// Counts a thread in [`Comm::waiting`] while it lives.
struct Waiting<'a>(&'a Comm);

impl<'a> Waiting<'a> {
    fn enter(comm: &'a Comm) -> Self {
        comm.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(comm)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Comm {
    /// Runs `f`, a call that waits inside the fabric (a blocking get, a put with signal, a
    /// pull of an exposed chunk), counted as a waiting thread on a network: the progress
    /// thread stands aside meanwhile, as for the runtime's own waits, and leaves the cores and
    /// the completion queue to the thread that polls for its completion.
    pub(crate) fn fabric_wait<R>(&self, f: impl FnOnce() -> R) -> R {
        let _waiting = (!self.caps.load_store).then(|| Waiting::enter(self));
        f()
    }
}

/// Polls of a wait before its first call of the slow part of [`Backoff::snooze`] (with
/// cores of its own): most waits end within them. A power of two.
const FIRST_POLLS: u32 = 64;

/// Spin, then yield, then sleep on the fabric's doorbell with growing timeouts.
///
/// Made on every wait that does not end at once (every AM round trip, for one), so making one
/// costs two stores: the clock and the configuration are read at its first slow call.
pub(crate) struct Backoff {
    iters: u32,
    /// Polls between two calls of the slow part, less one (a power of two less one, so the
    /// test is a mask, not a division): 64 when waits spin first; 4 when they yield at once
    /// (more ranks than cores), so a waiter soon hands the core to the peer it waits for.
    stride_mask: u32,
    slow: Option<Slow>,
    /// Longest sleep on the doorbell ([`MAX_SLEEP`], or less where what is awaited rings none).
    max_sleep: Duration,
}

/// The part of a [`Backoff`] its slow calls use.
struct Slow {
    /// When the current spell of waiting began (`None`: at the next slow call).
    start: Option<Instant>,
    sleep: Duration,
    next_check: Instant,
    /// The first slow call: about when the wait began (never reset).
    began: Instant,
    /// The wait has said that it hangs (once).
    warned: bool,
}

/// First sleep on the doorbell (it doubles up to [`MAX_SLEEP`]).
const FIRST_SLEEP: Duration = Duration::from_micros(50);

impl Backoff {
    #[inline]
    pub(crate) fn new(comm: &Comm) -> Self {
        let stride = if comm.cfg.spin.is_zero() { 4 } else { FIRST_POLLS };
        Backoff { iters: 0, stride_mask: stride - 1, slow: None, max_sleep: MAX_SLEEP }
    }

    /// Back to the spinning phase (after activity).
    #[inline]
    pub(crate) fn reset(&mut self) {
        if let Some(s) = &mut self.slow {
            s.reset();
        }
    }

    /// True once the wait got past its first [`FIRST_POLLS`] polls.
    #[inline]
    pub(crate) fn spun(&self) -> bool {
        self.iters >= FIRST_POLLS - 1
    }

    /// Waits a little; returns true when it is time to check the peers.
    #[inline]
    pub(crate) fn snooze(&mut self, comm: &Comm) -> bool {
        self.snooze_until(comm, &mut || false)
    }

    /// [`Backoff::snooze`] of a wait for `ready`, which a sleep checks again once it is
    /// announced (see [`weft_fabric::Fabric::wait_incoming`]).
    pub(crate) fn snooze_until(&mut self, comm: &Comm, ready: &mut dyn FnMut() -> bool) -> bool {
        self.iters = self.iters.wrapping_add(1);
        if self.iters & self.stride_mask != 0 {
            // No PAUSE here: a poll of the rings is delay enough, and PAUSE (tens of ns on
            // current cores) would add to every message's detection latency.
            return false;
        }
        self.pause(comm, ready)
    }

    /// The slow part of [`Backoff::snooze`], every `stride`th call.
    #[inline(never)]
    fn pause(&mut self, comm: &Comm, ready: &mut dyn FnMut() -> bool) -> bool {
        comm.touch();
        let now = Instant::now();
        let s = self.slow.get_or_insert_with(|| Slow {
            start: None,
            sleep: FIRST_SLEEP,
            next_check: now + comm.cfg.peer_check,
            began: now,
            warned: false,
        });
        let spin = comm.cfg.spin;
        let waited = now - *s.start.get_or_insert(now);
        if waited < spin {
            std::hint::spin_loop();
        } else if waited < spin + YIELD_WINDOW {
            std::thread::yield_now();
            self.iters = self.iters.wrapping_add(63);
        } else {
            if comm.fabric.wait_incoming(s.sleep, ready) {
                // Woken by traffic: the peers are talking, poll eagerly again.
                s.reset();
            } else {
                s.sleep = (s.sleep * 2).min(self.max_sleep);
            }
            self.iters = self.iters.wrapping_add(63);
        }
        if now >= s.next_check {
            s.next_check = now + comm.cfg.peer_check;
            return true;
        }
        false
    }
}

impl Backoff {
    /// How long the wait has lasted, once: the first time this is called after `limit` (the
    /// configured `hang_warn`) has passed; `None` before and after.
    pub(crate) fn overdue(&mut self, limit: Option<Duration>) -> Option<Duration> {
        let (s, limit) = (self.slow.as_mut()?, limit?);
        let waited = s.began.elapsed();
        if s.warned || waited < limit {
            return None;
        }
        s.warned = true;
        Some(waited)
    }
}

impl Slow {
    /// Back to spinning: the next slow call starts the clock again.
    #[inline]
    fn reset(&mut self) {
        self.start = None;
        self.sleep = FIRST_SLEEP;
    }
}

impl Comm {
    /// Makes progress: runs the handlers of arrived active messages and completes operations. Returns
    /// how many events were handled. Inside an AM handler only replies are handled; inside a progress
    /// hook (an `async` remote function) the hooks do not run again. Replies come first: a call that
    /// handled replies may leave arrived requests to the next call (poll in a loop, as every wait does).
    pub fn poll(&self) -> Result<usize> {
        if self.stop.load(Ordering::Relaxed) {
            // Finalized: futures polled afterwards end with the error instead of pending
            // for ever (no progress thread runs any more).
            return Err(crate::am::FINALIZED);
        }
        if crate::am::in_fork_child() {
            return Err(crate::am::FORK_CHILD);
        }
        self.touch();
        self.flush()?;
        let n = self.fabric.progress(self, crate::am::poll_set())?;
        self.take_error()?;
        Ok(n + self.run_hooks()?)
    }

    /// Makes progress until `cond` holds (for example a flag in a local segment that a peer
    /// sets with a put). Fails instead of hanging if a peer dies meanwhile.
    ///
    /// A waiter that found nothing for a while sleeps on its rank's doorbell. AMs ring it;
    /// one-sided writes do not, so the writer of a flag should call [`Comm::notify`] on the
    /// flag's rank, or the waiter notices only at its next timeout (up to 2 ms).
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let flags = world.alloc_segment::<u64>(1)?;
    /// world.wait_until(|| flags.local().atomic(0).load(std::sync::atomic::Ordering::Acquire) == 1)?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn wait_until(&self, cond: impl FnMut() -> bool) -> Result<()> {
        self.wait(Deps::AnyDead, "wait_until", cond)
    }

    /// [`Comm::wait_until`] for a condition that rank `rank` makes true (a library's signal
    /// word, say): the wait fails once that rank has died or finalized without making it
    /// true, and the hang warning names it and `what`.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let flags = world.alloc_segment::<u64>(1)?;
    /// let ready = || flags.local().atomic(0).load(std::sync::atomic::Ordering::Acquire) == 1;
    /// world.wait_until_from(0, "waiting for rank 0's flag", ready)?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn wait_until_from(&self, rank: u32, what: &str, cond: impl FnMut() -> bool) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::NoSuchRank { rank, size: self.size() });
        }
        self.wait(Deps::Rank(rank), what, cond)
    }

    /// [`Comm::wait_until`] for a condition that peers' one-sided writes make true, whose
    /// writers do not call [`Comm::notify`] (a library's users' flags, as OpenSHMEM's
    /// `wait_until` awaits): its sleeps on the doorbell last at most [`RMA_WAIT_SLEEP`], so it
    /// sees such a write within about that, for a wake-up every so often while it waits long.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let flags = world.alloc_segment::<u64>(1)?;
    /// world.wait_until_written(|| flags.local().atomic(0).load(std::sync::atomic::Ordering::Acquire) == 1)?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn wait_until_written(&self, cond: impl FnMut() -> bool) -> Result<()> {
        self.wait_capped(Deps::AnyDead, "wait_until_written", crate::am::poll_set(), RMA_WAIT_SLEEP, cond)
    }

    /// [`Comm::wait_until_written`] for a condition that rank `rank` makes true, or lets
    /// another make true (the holder of a lock, say), named `what` in the hang warning. With
    /// `Some(rank)` the wait fails once that rank has died or finalized without making it
    /// true; with `None` it depends on no rank in particular (it fails if any dies).
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let flags = world.alloc_segment::<u64>(1)?;
    /// let set = || flags.local().atomic(0).load(std::sync::atomic::Ordering::Acquire) == 1;
    /// world.wait_until_written_from(Some(0), "the lock that rank 0 holds", set)?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn wait_until_written_from(
        &self,
        rank: Option<u32>,
        what: &str,
        cond: impl FnMut() -> bool,
    ) -> Result<()> {
        let deps = match rank {
            Some(r) if r >= self.size() => return Err(Error::NoSuchRank { rank: r, size: self.size() }),
            Some(r) => Deps::Rank(r),
            None => Deps::AnyDead,
        };
        self.wait_capped(deps, what, crate::am::poll_set(), RMA_WAIT_SLEEP, cond)
    }

    /// Wakes the threads of `rank` (this rank included) that sleep in a wait, for example after
    /// a put or atomic that sets a flag one of them waits on. Costs one load when nobody sleeps.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// let flags = world.alloc_segment::<u64>(1)?;
    /// world.atomic_store(flags.at(1, 0), 1)?;
    /// world.notify(1)?;
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn notify(&self, rank: u32) -> Result<()> {
        if rank >= self.size() {
            return Err(Error::NoSuchRank { rank, size: self.size() });
        }
        self.fabric.notify(rank);
        Ok(())
    }

    /// Before this process exits on an error without finalizing (which ends the job): removes
    /// what the job keeps where a launcher that knows nothing of weft (`mpirun`, `srun`)
    /// would leave it (on shared memory, the job's directory, once empty). Other ranks
    /// cannot make new segments from then on.
    ///
    /// ```no_run
    /// # let world = weft_runtime::World::init()?;
    /// if world.rank() == 0 && std::env::args().any(|a| a == "--fail") {
    ///     eprintln!("rank 0: bad argument");
    ///     world.abandon();
    ///     std::process::exit(1);
    /// }
    /// # Ok::<(), weft_runtime::Error>(())
    /// ```
    pub fn abandon(&self) {
        self.fabric.abandon();
    }

    /// Makes progress until `cond` holds; `what` names the operation for the hang warning.
    pub(crate) fn wait(&self, deps: Deps<'_>, what: &str, cond: impl FnMut() -> bool) -> Result<()> {
        self.wait_with(deps, what, crate::am::poll_set(), cond)
    }

    /// [`Comm::wait`] on a fabric call that answers `Ok(true)` when done; its error ends the
    /// wait and is returned.
    pub(crate) fn wait_fabric(
        &self,
        deps: Deps<'_>,
        what: &str,
        mut poll: impl FnMut() -> weft_fabric::FabricResult<bool>,
    ) -> Result<()> {
        let mut failed = None;
        self.wait(deps, what, || match poll() {
            Ok(done) => done,
            Err(e) => {
                failed = Some(e);
                true
            }
        })?;
        failed.map_or(Ok(()), |e| Err(e.into()))
    }

    pub(crate) fn wait_with(
        &self,
        deps: Deps<'_>,
        what: &str,
        set: PollSet,
        test: impl FnMut() -> bool,
    ) -> Result<()> {
        self.wait_capped(deps, what, set, MAX_SLEEP, test)
    }

    /// [`Comm::wait_with`] whose sleeps on the doorbell last at most `max_sleep`.
    fn wait_capped(
        &self,
        deps: Deps<'_>,
        what: &str,
        set: PollSet,
        max_sleep: Duration,
        mut test: impl FnMut() -> bool,
    ) -> Result<()> {
        if self.stop.load(Ordering::Relaxed) {
            return Err(crate::am::FINALIZED);
        }
        if crate::am::in_fork_child() {
            return Err(crate::am::FORK_CHILD);
        }
        // What this thread's layers hold back goes first: the wait may be for its effects.
        self.flush()?;
        // Tested in the loop and, before a sleep, by the fabric: once it held it is not tested
        // again (a test may poll a future, which must not be polled once it is ready).
        let mut met = false;
        let mut cond = move || {
            met = met || test();
            met
        };
        self.touch();
        // Already done (a send into free space, a message that is already here): no backoff
        // or waiter count to set up.
        if cond() {
            return Ok(());
        }
        let mut backoff = Backoff::new(self);
        backoff.max_sleep = max_sleep;
        // A thread waiting here delivers everything and sleeps on the fabric's doorbell, which
        // arriving traffic rings: the progress thread has nothing to add meanwhile. On shared
        // memory counted from the first back-off on: most waits end within a few polls, and
        // the count is an atomic read-modify-write on each side of the wait. Where a poll is
        // a system call (libfabric), counted at once: 64 polls outlast a round trip there, and
        // a progress thread polling beside the waiter fights it for the completion queue (tcp
        // on loopback, AM round trips: futex waits 1.4 -> 0.6 and sched_yield 0.6 -> 0.16 per
        // round trip, 21.3-22.7 -> 21.1-21.5 us).
        let mut waiting = None;
        loop {
            // A wait kept busy by a stream of messages may never back off: say it is here on
            // every round (a load while the flag is set).
            self.touch();
            if self.fabric.progress(self, set)? > 0 {
                // Activity: the peer is awake and talking, keep spinning.
                backoff.reset();
            }
            if set == PollSet::All && self.run_hooks_in_wait()? > 0 {
                backoff.reset();
            }
            self.take_error()?;
            if cond() {
                return Ok(());
            }
            if waiting.is_none() && set == PollSet::All && (backoff.spun() || !self.caps.load_store) {
                waiting = Some(Waiting::enter(self));
            }
            if backoff.snooze_until(self, &mut cond) {
                if self.stop.load(Ordering::Relaxed) {
                    // The World was dropped while this thread waited.
                    return Err(crate::am::FINALIZED);
                }
                if let Some(waited) = backoff.overdue(self.cfg.hang_warn) {
                    self.warn_hang(deps, what, waited);
                }
                if let Deps::Team { check, .. } = deps {
                    if let Some(e) = check() {
                        return Err(e);
                    }
                }
                self.fabric.check_claim()?;
                self.fail_awaited();
                if let Some((rank, e)) = self.check_peers(deps) {
                    // What the peer sent before it left may still be on its way through this
                    // rank (another thread may be delivering it right now): fail only once
                    // everything it sent has been handled.
                    self.fabric.progress(self, set)?;
                    if cond() {
                        return Ok(());
                    }
                    if self.fabric.peer_drained(rank) {
                        return if cond() { Ok(()) } else { Err(e) };
                    }
                }
            }
        }
    }

    /// The error to report if a peer that `deps` needs is gone and everything it sent has been
    /// handled (for waits that are not loops of [`Comm::wait`], such as futures).
    pub(crate) fn failed_peer(&self, deps: Deps<'_>) -> Option<Error> {
        if let Err(e) = self.fabric.check_claim() {
            return Some(e.into());
        }
        if let Deps::Team { check, .. } = deps {
            if let Some(e) = check() {
                return Some(e);
            }
        }
        let (rank, e) = self.check_peers(deps)?;
        self.fabric.peer_drained(rank).then_some(e)
    }

    /// Says on standard error that a wait in `what` has lasted `waited` with no end, and which
    /// ranks it waits for (they are alive, or the wait would have failed): a stopped or hung
    /// rank is named instead of hanging the job in silence.
    pub(crate) fn warn_hang(&self, deps: Deps<'_>, what: &str, waited: Duration) {
        let me = self.rank();
        let ranks: Vec<String> = match deps {
            Deps::Rank(r) => vec![r.to_string()],
            Deps::Needed(needed) | Deps::Team { needed, .. } => {
                (0..self.size()).filter(|&r| r != me && needed(r)).map(|r| r.to_string()).collect()
            }
            Deps::AnyDead => vec![],
        };
        let whom = match ranks.len() {
            0 => "another rank".to_string(),
            1 => format!("rank {}", ranks[0]),
            _ => format!("ranks {}", ranks.join(", ")),
        };
        eprintln!(
            "weft: rank {me} has waited {:.0} s in {what} for {whom}, which is alive but has not done what \
             this wait needs (stopped, computing, or waiting itself?); WEFT_HANG_WARN_S sets when this is said",
            waited.as_secs_f64()
        );
    }

    /// The first peer the wait depends on that is gone, with the error to report.
    fn check_peers(&self, deps: Deps<'_>) -> Option<(u32, Error)> {
        let judge = |r: u32, finalized_matters: bool| match self.fabric.peer_state(r) {
            PeerState::Running => None,
            PeerState::Finalized if !finalized_matters => None,
            PeerState::Finalized => Some((
                r,
                Error::PeerFailed {
                    rank: r,
                    reason: "has left the job (finalized) while this rank still waits on it".into(),
                },
            )),
            PeerState::Dead(why) => Some((
                r,
                Error::PeerFailed { rank: r, reason: format!("died ({why}) while this rank waits") },
            )),
        };
        let me = self.rank();
        match deps {
            Deps::Rank(r) if r == me => None,
            Deps::Rank(r) => judge(r, true),
            Deps::Needed(needed) | Deps::Team { needed, .. } => {
                (0..self.size()).filter(|&r| r != me).find_map(|r| judge(r, needed(r)))
            }
            Deps::AnyDead => (0..self.size()).filter(|&r| r != me).find_map(|r| judge(r, false)),
        }
    }
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to completion on the current thread. weft's handles drive progress when
/// polled, so this needs no other executor; any executor (tokio included) works as well.
///
/// ```no_run
/// # use weft_runtime as weft;
/// # let world = weft_runtime::World::init()?;
/// let seg = world.alloc_segment::<u64>(8)?;
/// let h = world.put_nb(seg.at(0, 0), &[1, 2, 3])?;
/// weft::block_on(h)?;
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(Duration::from_millis(1));
    }
}
