//! Non-blocking collectives: each takes its data by value, queues the collective on the team
//! and returns a [`CollHandle`] at once.
//!
//! A team runs its collectives one at a time in call order (the same on every member), so its
//! queue needs no matching: the collective at the front moves its messages whenever anything
//! drives the queue — testing, waiting on or awaiting any of the team's handles, or calling a
//! blocking collective of the team (which first finishes the queued ones). Dropping a handle
//! does not cancel its collective: the other members take part in it, so it still runs.

use super::call::Call;
use super::coll::{builtin, tag, Number, ReduceOp};
use super::counts::total_bytes;
use super::{Core, Team};
use crate::progress::Deps;
use crate::{Error, Pod, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

/// Where a queued collective leaves its result.
type Slot<R> = Arc<Mutex<Option<Result<R>>>>;

/// Handle of a non-blocking collective. Complete it with [`CollHandle::wait`], check it with
/// [`CollHandle::test`], or `.await` it (it is a `Future`, usable under any executor).
///
/// ```no_run
/// # use weft_runtime as weft;
/// # let world = weft_runtime::World::init()?;
/// let team = world.world_team()?;
/// let h = team.allreduce_nb(vec![1.0f64; 1024], weft::ReduceOp::Sum)?;
/// // ... compute; the collective moves when its team's handles are tested or awaited ...
/// let sum = h.wait()?;
/// assert_eq!(sum[0], world.size() as f64);
/// # Ok::<(), weft_runtime::Error>(())
/// ```
#[must_use = "a collective handle yields the result only when waited on, tested or awaited"]
pub struct CollHandle<R> {
    core: Arc<Core>,
    slot: Slot<R>,
    next_check: Option<Instant>,
}

impl<R> CollHandle<R> {
    /// True once the collective finished (or can no longer run: its team was dropped after a
    /// failure, which leaves the slot without its writer).
    fn ready(&self) -> bool {
        self.lock().is_some() || Arc::strong_count(&self.slot) == 1
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Result<R>>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self) -> Result<R> {
        self.lock()
            .take()
            .unwrap_or(Err(Error::Misuse("collective abandoned: its team was dropped after a failure")))
    }

    /// Blocks, making progress, until the collective is complete; returns its result.
    pub fn wait(self) -> Result<R> {
        let deps = |w: u32| self.core.needs(w);
        let deps = Deps::Team { needed: &deps, check: &|| self.core.check() };
        self.core.comm.wait(deps, "a non-blocking team collective", || {
            self.core.drive();
            self.ready()
        })?;
        self.take()
    }

    /// Makes progress once; true when the collective is complete ([`CollHandle::wait`] then
    /// returns its result at once).
    pub fn test(&mut self) -> Result<bool> {
        self.core.comm.poll()?;
        self.core.drive();
        Ok(self.ready())
    }
}

impl<R> Future for CollHandle<R> {
    type Output = Result<R>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<R>> {
        if let Err(e) = self.core.comm.poll() {
            return Poll::Ready(Err(e));
        }
        self.core.drive();
        if self.ready() {
            return Poll::Ready(self.take());
        }
        // A member the collective waits on may have died: look now and then.
        let now = Instant::now();
        let period = self.core.comm.cfg.peer_check;
        if *self.next_check.get_or_insert(now + period) <= now {
            self.next_check = Some(now + period);
            let deps = |w: u32| self.core.needs(w);
            let deps = Deps::Team { needed: &deps, check: &|| self.core.check() };
            if let Some(e) = self.core.comm.failed_peer(deps) {
                return Poll::Ready(Err(e));
            }
        }
        // Whatever makes progress (a wait, a poll, the progress thread) drives the team's queue
        // and wakes this handle (see `Comm::drive_teams`). Looked at again once the waker is
        // in place: progress may have finished the collective and taken the wakers between the
        // look above and the registration.
        self.core.await_progress(cx);
        if self.ready() {
            return Poll::Ready(self.take());
        }
        Poll::Pending
    }
}

impl Core {
    /// Registers the waker of a handle that went pending, and the team with its world's
    /// progress.
    fn await_progress(self: &Arc<Self>, cx: &Context<'_>) {
        {
            let mut w = self.wakers.lock().unwrap_or_else(|p| p.into_inner());
            if !w.iter().any(|k| k.will_wake(cx.waker())) {
                w.push(cx.waker().clone());
            }
        }
        self.comm.await_team(Arc::downgrade(self));
        self.comm.future_pending(cx);
    }

    /// Drives the queue and wakes the awaiting handles when it moved or emptied. Returns
    /// (collectives remain, handles were woken).
    pub(crate) fn drive_awaited(&self) -> (bool, bool) {
        let before = self.queued.load(Ordering::Acquire);
        let Some(empty) = self.try_drive() else {
            return (true, false);
        };
        let moved = empty || self.queued.load(Ordering::Acquire) != before;
        (!empty, moved && self.wake_awaiting())
    }

    /// Wakes the handles awaiting this team; whether there were any.
    fn wake_awaiting(&self) -> bool {
        let woken = std::mem::take(&mut *self.wakers.lock().unwrap_or_else(|p| p.into_inner()));
        let any = !woken.is_empty();
        woken.into_iter().for_each(std::task::Waker::wake);
        any
    }
}

impl crate::Comm {
    /// Lists a team whose handle a future awaits, for [`Comm::drive_teams`].
    fn await_team(&self, core: std::sync::Weak<Core>) {
        let mut t = self.awaited_teams.lock().unwrap_or_else(|p| p.into_inner());
        if !t.iter().any(|c| c.ptr_eq(&core)) {
            t.push(core);
        }
        self.any_awaited_team.store(true, Ordering::Release);
    }

    /// The teams listed as awaited that still exist.
    fn awaited_cores(&self) -> Vec<Arc<Core>> {
        let t = self.awaited_teams.lock().unwrap_or_else(|p| p.into_inner());
        t.iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    /// Wakes the handles awaiting teams a member of which is gone (their polls then report
    /// it): nothing else would, as no message will come. Run at liveness checks.
    pub(crate) fn wake_failed_teams(&self) {
        if !self.any_awaited_team.load(Ordering::Acquire) {
            return;
        }
        let teams = self.awaited_cores();
        for core in teams {
            // Liveness only: the team's own check reads peers' memory, which on the AM path
            // is a wait of its own (and would run this again); the woken handle checks it.
            let needed = |w: u32| core.needs(w);
            if self.failed_peer(Deps::Needed(&needed)).is_some() {
                core.wake_awaiting();
            }
        }
    }

    /// Wakes every handle a future awaits on a team (their polls see the world finalized).
    pub(crate) fn wake_awaited_teams(&self) {
        let teams = self.awaited_cores();
        for core in teams {
            core.wake_awaiting();
        }
    }

    /// Drives the queues of the teams whose handles futures await, waking those handles;
    /// forgets teams with nothing left queued. Run with the progress hooks. Returns how many
    /// teams woke handles (0 when nothing moved: a progress thread may sleep).
    pub(crate) fn drive_teams(&self) -> usize {
        if !self.any_awaited_team.load(Ordering::Acquire) {
            return 0;
        }
        let teams = self.awaited_cores();
        let (mut finished, mut woke) = (Vec::new(), 0);
        for core in &teams {
            let (remain, w) = core.drive_awaited();
            if !remain {
                finished.push(Arc::as_ptr(core));
            }
            woke += usize::from(w);
        }
        let mut t = self.awaited_teams.lock().unwrap_or_else(|p| p.into_inner());
        // Dropped teams and those left with nothing queued go; teams listed meanwhile stay,
        // and so do finished ones that queued a collective since (its handle, which found
        // the team still listed, did not list it again). `await_team` takes this lock too,
        // after its collective was queued: the two cannot miss each other.
        t.retain(|c| {
            c.upgrade().is_some_and(|core| {
                !finished.contains(&Arc::as_ptr(&core)) || core.queued.load(Ordering::Acquire) > 0
            })
        });
        self.any_awaited_team.store(!t.is_empty(), Ordering::Release);
        woke
    }
}

impl Team {
    /// Numbers `call`, queues `body`'s collective and moves its first messages. The call is
    /// published when it starts to run (the ones before it may still be queued), and its
    /// error makes the team unusable as a blocking call's does.
    fn start<R, F>(&self, call: Call, body: impl FnOnce(Arc<Core>) -> F) -> Result<CollHandle<R>>
    where
        R: Send + 'static,
        F: Future<Output = Result<R>> + Send + 'static,
    {
        let desc = self.core.number(call)?;
        let slot: Slot<R> = Arc::new(Mutex::new(None));
        let core = self.core.clone();
        let fut = body(self.core.clone());
        let writer = slot.clone();
        let queued = Box::pin(async move {
            let r = match core.poisoned() {
                Some(e) => Err(e),
                None => {
                    core.publish(desc);
                    let agreed = if core.strict { core.agree(desc).await } else { Ok(()) };
                    match agreed {
                        Ok(()) => core.close(fut.await),
                        Err(e) => core.close(Err(e)),
                    }
                }
            };
            *writer.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
        });
        self.core.enqueue(queued);
        self.core.drive();
        Ok(CollHandle { core: self.core.clone(), slot, next_check: None })
    }

    /// Non-blocking [`Team::barrier`].
    pub fn barrier_nb(&self) -> Result<CollHandle<()>> {
        self.start(Call::new(tag::BARRIER, None, 0), |c| async move { c.barrier().await })
    }

    /// Non-blocking [`Team::broadcast`]: the handle yields `buf`, holding the root's data.
    pub fn broadcast_nb<T: Pod>(&self, root: u32, mut buf: Vec<T>) -> Result<CollHandle<Vec<T>>> {
        self.core.check_root(root)?;
        self.start(Call::new(tag::BROADCAST, Some(root), size_of_val(&buf[..])), |c| async move {
            c.broadcast(root, &mut buf).await.map(|()| buf)
        })
    }

    /// Non-blocking [`Team::reduce`].
    pub fn reduce_nb<T: Number>(
        &self,
        root: u32,
        data: Vec<T>,
        op: ReduceOp,
    ) -> Result<CollHandle<Option<Vec<T>>>> {
        self.reduce_with_nb(root, data, builtin::<T>(op))
    }

    /// Non-blocking [`Team::reduce_with`].
    pub fn reduce_with_nb<T: Pod>(
        &self,
        root: u32,
        data: Vec<T>,
        f: impl Fn(&mut T, &T) + Send + Sync + 'static,
    ) -> Result<CollHandle<Option<Vec<T>>>> {
        self.core.check_root(root)?;
        let call = Call::new(tag::REDUCE, Some(root), size_of_val(&data[..]));
        self.start(call, |c| async move { c.reduce(root, &data, &f).await })
    }

    /// Non-blocking [`Team::allreduce`].
    pub fn allreduce_nb<T: Number>(&self, data: Vec<T>, op: ReduceOp) -> Result<CollHandle<Vec<T>>> {
        self.allreduce_with_nb(data, builtin::<T>(op))
    }

    /// Non-blocking [`Team::allreduce_with`].
    pub fn allreduce_with_nb<T: Pod>(
        &self,
        data: Vec<T>,
        f: impl Fn(&mut T, &T) + Send + Sync + 'static,
    ) -> Result<CollHandle<Vec<T>>> {
        let call = Call::new(tag::ALLREDUCE, None, size_of_val(&data[..]));
        self.start(call, |c| async move { c.allreduce(&data, &f).await })
    }

    /// Non-blocking [`Team::gather`].
    pub fn gather_nb<T: Pod>(&self, root: u32, data: Vec<T>) -> Result<CollHandle<Option<Vec<T>>>> {
        let counts = vec![data.len(); self.core.size()];
        self.gatherv_nb(root, data, counts)
    }

    /// Non-blocking [`Team::gatherv`].
    pub fn gatherv_nb<T: Pod>(
        &self,
        root: u32,
        data: Vec<T>,
        counts: Vec<usize>,
    ) -> Result<CollHandle<Option<Vec<T>>>> {
        self.core.check_root(root)?;
        let call = Call::new(tag::GATHER, Some(root), total_bytes::<T>(&counts));
        self.start(call, |c| async move { c.gatherv(root, &data, &counts).await })
    }

    /// Non-blocking [`Team::allgather`].
    pub fn allgather_nb<T: Pod>(&self, data: Vec<T>) -> Result<CollHandle<Vec<T>>> {
        let counts = vec![data.len(); self.core.size()];
        self.allgatherv_nb(data, counts)
    }

    /// Non-blocking [`Team::allgatherv`].
    pub fn allgatherv_nb<T: Pod>(&self, data: Vec<T>, counts: Vec<usize>) -> Result<CollHandle<Vec<T>>> {
        let call = Call::new(tag::ALLGATHER, None, total_bytes::<T>(&counts));
        self.start(call, |c| async move { c.allgatherv(&data, &counts).await })
    }

    /// Non-blocking [`Team::scatter`].
    pub fn scatter_nb<T: Pod>(
        &self,
        root: u32,
        data: Option<Vec<T>>,
        count: usize,
    ) -> Result<CollHandle<Vec<T>>> {
        self.core.check_root(root)?;
        let call = Call::new(tag::SCATTER, Some(root), count.saturating_mul(size_of::<T>()));
        self.start(call, |c| async move { c.scatter(root, data.as_deref(), count).await })
    }

    /// Non-blocking [`Team::alltoall`].
    pub fn alltoall_nb<T: Pod>(&self, data: Vec<T>) -> Result<CollHandle<Vec<T>>> {
        let counts = self.alltoall_counts(data.len())?;
        // Every member passes blocks of the same size: part of the call.
        let bytes = counts.first().map_or(0, |&b| b.saturating_mul(size_of::<T>()));
        let (send_counts, recv_counts) = (counts.clone(), counts);
        self.start(Call::new(tag::ALLTOALL, None, bytes), |c| async move {
            c.alltoallv(&data, &send_counts, &recv_counts).await
        })
    }

    /// Non-blocking [`Team::alltoallv`].
    pub fn alltoallv_nb<T: Pod>(
        &self,
        data: Vec<T>,
        send_counts: Vec<usize>,
        recv_counts: Vec<usize>,
    ) -> Result<CollHandle<Vec<T>>> {
        let call = Call::new(tag::ALLTOALL, None, 0);
        self.start(call, |c| async move { c.alltoallv(&data, &send_counts, &recv_counts).await })
    }

    /// Non-blocking [`Team::exscan`].
    pub fn exscan_nb<T: Number>(&self, data: Vec<T>, op: ReduceOp) -> Result<CollHandle<Option<Vec<T>>>> {
        self.exscan_with_nb(data, builtin::<T>(op))
    }

    /// Non-blocking [`Team::exscan_with`].
    pub fn exscan_with_nb<T: Pod>(
        &self,
        data: Vec<T>,
        f: impl Fn(&mut T, &T) + Send + Sync + 'static,
    ) -> Result<CollHandle<Option<Vec<T>>>> {
        let call = Call::new(tag::SCAN, None, size_of_val(&data[..]));
        self.start(call, |c| async move { c.exscan(&data, &f).await })
    }
}
