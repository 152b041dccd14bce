//! The caller's API: calls and posts, their futures and "sent" signals.

use super::*;

/// The result of a call: `.await` it (any executor), [`CallFuture::wait`] for it, or test it.
/// It holds its own reference to the world, so it can be moved anywhere (`tokio::spawn`).
#[must_use = "a call's result arrives only through its future"]
pub struct CallFuture<R> {
    /// The world, the call's slot and the rank called while the call is in flight (`None`
    /// once finished or failed early).
    live: Option<(Arc<Comm>, u64, u32)>,
    early: Option<Error>,
    /// The remote function's name, for hang warnings.
    name: &'static str,
    /// Since when a poll found it pending, and whether the hang warning was given.
    pending: Option<(std::time::Instant, bool)>,
    _r: PhantomData<fn() -> R>,
}

impl<R> CallFuture<R> {
    fn failed(e: Error) -> Self {
        CallFuture { live: None, early: Some(e), name: "", pending: None, _r: PhantomData }
    }

    /// What a caller waiting for the result waits on, in hang warnings.
    fn waiting_on(&self, target: u32) -> String {
        format!("the call of remote fn {} on rank {target} (it has not returned)", self.name)
    }
}

impl<R: serde::de::DeserializeOwned> CallFuture<R> {
    /// Blocks (making progress) until the result is here.
    pub fn wait(mut self) -> Result<R> {
        if let Some(e) = self.early.take() {
            return Err(e);
        }
        let (comm, id, target) = self.live.take().ok_or(Error::Misuse("call already finished"))?;
        let rpc = Rpc::get(&comm)?;
        let mut seen = u64::MAX;
        let mut slot = None;
        // The callee must stay in the job until it answered: one that finalizes or dies
        // first fails the wait.
        let what = self.waiting_on(target);
        let waited = comm.wait_on(target, &what, &mut || {
            // Look at the table only when some result arrived since the last look, and take
            // the outcome out in that same look.
            let now = rpc.results.load(Ordering::Acquire);
            if now == seen {
                return false;
            }
            seen = now;
            let mut calls = lock(&rpc.calls);
            match calls.get_mut(id) {
                Some(s) if !s.settled() => false,
                _ => {
                    slot = calls.remove(id);
                    true
                }
            }
        });
        if let Err(e) = waited {
            lock(&rpc.calls).remove(id);
            return Err(e);
        }
        settle(&comm, rpc, slot)
    }

    fn finish(&mut self) -> Result<R> {
        let (comm, id, _) = self.live.take().ok_or(Error::Misuse("call already finished"))?;
        let rpc = Rpc::get(&comm)?;
        let slot = lock(&rpc.calls).remove(id);
        settle(&comm, rpc, slot)
    }
}

/// A finished call's result from its slot: the target's failure, or the decoded outcome.
fn settle<R: serde::de::DeserializeOwned>(comm: &Comm, rpc: &Rpc, slot: Option<CallSlot>) -> Result<R> {
    match slot {
        Some(CallSlot { failed: Some(e), .. }) => Err(e),
        slot => decode_outcome(comm, rpc, slot.and_then(|s| s.outcome)),
    }
}

/// The caller's side of a delivered outcome: the result (decoded as `comm`'s, for the
/// [`weft_runtime::Dist`]s in it), or the remote error.
fn decode_outcome<R: serde::de::DeserializeOwned>(
    comm: &Comm,
    rpc: &Rpc,
    outcome: Option<Outcome>,
) -> Result<R> {
    let Some((ok, index, chunks)) = outcome else {
        return Err(Error::Misuse("call result missing"));
    };
    let source = Pulled(RefCell::new(chunks));
    if ok {
        let pool = rpc.pool.get().map(|p| p.blocks().clone());
        serving(comm, || with_decode_pool(pool, || archive::decode::<R>(&index, &source)))
            .map_err(|e| Error::Remote(format!("result does not decode: {e}")))
    } else {
        let why: String =
            archive::decode(&index, &source).unwrap_or_else(|e| format!("undecodable error: {e}"));
        Err(Error::Remote(why))
    }
}

impl<R: serde::de::DeserializeOwned> Future for CallFuture<R> {
    type Output = Result<R>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<R>> {
        if let Some(e) = self.early.take() {
            return Poll::Ready(Err(e));
        }
        let Some((comm, id, target)) = &self.live else {
            return Poll::Ready(Err(Error::Misuse("call already finished")));
        };
        let (comm, id, target) = (comm.clone(), *id, *target);
        let comm = &comm;
        if let Err(e) = comm.poll() {
            return Poll::Ready(Err(e));
        }
        let rpc = match Rpc::get(comm) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let done = {
            let mut calls = lock(&rpc.calls);
            match calls.get_mut(id) {
                Some(s) if !s.settled() => {
                    s.waker = Some(cx.waker().clone());
                    false
                }
                _ => true,
            }
        };
        if done {
            return Poll::Ready(self.finish());
        }
        let (began, mut warned) = *self.pending.get_or_insert((std::time::Instant::now(), false));
        if !warned {
            let what = || self.waiting_on(target);
            comm.warn_if_overdue(target, &what, began, &mut warned);
            self.pending = Some((began, warned));
        }
        comm.future_pending(cx);
        Poll::Pending
    }
}

impl<R> Drop for CallFuture<R> {
    fn drop(&mut self) {
        if let Some((comm, id, _)) = &self.live {
            if let Ok(rpc) = Rpc::get(comm) {
                lock(&rpc.calls).remove(*id);
            }
        }
    }
}

/// Completes when the arguments of a call have left the caller's memory (eager: at once;
/// rendezvous: when the target has pulled every chunk) — HPX's `async_cb`. Like the call's
/// future, it holds its own reference to the world.
pub struct Sent {
    /// The world, the signal and the target while the arguments are out.
    state: Option<(Arc<Comm>, Arc<SentState>, u32)>,
}

impl Sent {
    fn new(comm: &Comm, state: Option<Arc<SentState>>, rank: u32) -> Self {
        Sent { state: state.map(|s| (comm.arc(), s, rank)) }
    }

    /// Blocks (making progress) until the arguments may be reused; fails if the target dies
    /// or leaves the job first.
    pub fn wait(self) -> Result<()> {
        match &self.state {
            None => Ok(()),
            Some((comm, s, rank)) => {
                comm.wait_on(*rank, "a call's arguments", &mut || s.done.load(Ordering::Acquire))?;
                s.result()
            }
        }
    }
}

impl Future for Sent {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let Some((comm, s, _)) = &self.state else { return Poll::Ready(Ok(())) };
        if let Err(e) = comm.poll() {
            return Poll::Ready(Err(e));
        }
        if s.done.load(Ordering::Acquire) {
            return Poll::Ready(s.result());
        }
        *lock(&s.waker) = Some(cx.waker().clone());
        // Fired between the look and the waker's store: nobody will wake this poll.
        if s.done.load(Ordering::Acquire) {
            return Poll::Ready(s.result());
        }
        comm.future_pending(cx);
        Poll::Pending
    }
}

/// Calling remote functions: implemented for [`Comm`] (and so for a `World`).
pub trait RpcExt {
    /// Runs `f(args)` on `rank`; the future gives its result (or the remote error or panic).
    fn call<F: RemoteFn>(&self, rank: u32, f: F, args: F::Args) -> CallFuture<F::Output>;
    /// As [`RpcExt::call`], also returning the "sent" signal; `threshold` overrides the
    /// world's chunk threshold for this call.
    fn call_with<F: RemoteFn>(
        &self,
        rank: u32,
        f: F,
        args: F::Args,
        threshold: Option<usize>,
    ) -> (Sent, CallFuture<F::Output>);
    /// Runs `f(args)` on `rank` without a result (errors there are counted, not reported).
    fn post<F: RemoteFn>(&self, rank: u32, f: F, args: F::Args) -> Result<Sent>;
}

impl RpcExt for Comm {
    fn call<F: RemoteFn>(&self, rank: u32, f: F, args: F::Args) -> CallFuture<F::Output> {
        self.call_with(rank, f, args, None).1
    }

    fn call_with<F: RemoteFn>(
        &self,
        rank: u32,
        _f: F,
        args: F::Args,
        threshold: Option<usize>,
    ) -> (Sent, CallFuture<F::Output>) {
        let mut medium = |d, h, a: &[u64], p: &[u8]| self.am_request_medium(d, h, a, p);
        start_call::<F>(self, &mut medium, rank, args, threshold)
    }

    fn post<F: RemoteFn>(&self, rank: u32, _f: F, args: F::Args) -> Result<Sent> {
        let mut medium = |d, h, a: &[u64], p: &[u8]| self.am_request_medium(d, h, a, p);
        start_post::<F>(self, &mut medium, rank, args)
    }
}

/// Sends a call through `medium`; the result comes back on the world's default path.
fn start_call<F: RemoteFn>(
    comm: &Comm,
    medium: &mut Medium<'_>,
    rank: u32,
    args: F::Args,
    threshold: Option<usize>,
) -> (Sent, CallFuture<F::Output>) {
    let fail = |e: Error| (Sent { state: None }, CallFuture::failed(e));
    let rpc = match Rpc::get(comm) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let id = lock(&rpc.calls).insert(CallSlot { target: rank, outcome: None, waker: None, failed: None });
    let th = threshold.unwrap_or_else(|| rpc.threshold());
    match rpc.send_via(comm, medium, rank, call_head(CALL, F::ID, id), Value(args), th) {
        Ok(sent) => (
            Sent::new(comm, sent, rank),
            CallFuture {
                live: Some((comm.arc(), id, rank)),
                early: None,
                name: F::NAME,
                pending: None,
                _r: PhantomData,
            },
        ),
        Err(e) => {
            lock(&rpc.calls).remove(id);
            fail(e)
        }
    }
}

fn start_post<F: RemoteFn>(comm: &Comm, medium: &mut Medium<'_>, rank: u32, args: F::Args) -> Result<Sent> {
    let rpc = Rpc::get(comm)?;
    let th = rpc.threshold();
    let sent = rpc.send_via(comm, medium, rank, call_head(POST, F::ID, 0), Value(args), th)?;
    Ok(Sent::new(comm, sent, rank))
}

/// Calling remote functions through an [`Endpoint`]: the call leaves on the endpoint's own
/// transmit slot (published at once, so the future can complete without a flush); results
/// come back on the world's default path.
///
/// ```no_run
/// # use weft_rpc::{remote, EndpointRpcExt};
/// # use weft_runtime::{block_on, EndpointConfig, EndpointPolicy};
/// remote! { fn add(a: u64, b: u64) -> u64 { a + b } }
/// # let world = weft_runtime::World::init()?;
/// let mut set = world.endpoints(&EndpointConfig::new(EndpointPolicy::Dynamic, 1))?;
/// let mut ep = set.endpoints().remove(0);
/// assert_eq!(block_on(ep.call(1, add, (2, 3)))?, 5);
/// # Ok::<(), weft_runtime::Error>(())
/// ```
pub trait EndpointRpcExt {
    /// Runs `f(args)` on `rank`; the future gives its result.
    fn call<F: RemoteFn>(&mut self, rank: u32, f: F, args: F::Args) -> CallFuture<F::Output>;
    /// Runs `f(args)` on `rank` without a result.
    fn post<F: RemoteFn>(&mut self, rank: u32, f: F, args: F::Args) -> Result<Sent>;
}

impl EndpointRpcExt for Endpoint<'_> {
    fn call<F: RemoteFn>(&mut self, rank: u32, _f: F, args: F::Args) -> CallFuture<F::Output> {
        let comm = self.comm();
        let (_, future) = {
            let mut medium = |d, h, a: &[u64], p: &[u8]| self.am_request_medium(d, h, a, p);
            start_call::<F>(comm, &mut medium, rank, args, None)
        };
        match self.sync_nbi() {
            Ok(()) => future,
            Err(e) => CallFuture::failed(e),
        }
    }

    fn post<F: RemoteFn>(&mut self, rank: u32, _f: F, args: F::Args) -> Result<Sent> {
        let comm = self.comm();
        let sent = {
            let mut medium = |d, h, a: &[u64], p: &[u8]| self.am_request_medium(d, h, a, p);
            start_post::<F>(comm, &mut medium, rank, args)?
        };
        self.sync_nbi()?;
        Ok(sent)
    }
}

impl Rpc {
    /// Fails the calls whose target `gone` names and the transfers whose receiver it names,
    /// waking their futures, and drops what was kept alive for those transfers.
    pub(crate) fn fail_gone(&self, gone: &dyn Fn(u32) -> Option<Error>) -> usize {
        let mut n = 0;
        let mut calls = lock(&self.calls);
        for s in calls.values_mut().filter(|s| !s.settled()) {
            if let Some(e) = gone(s.target) {
                s.failed = Some(e);
                n += 1;
                if let Some(w) = s.waker.take() {
                    w.wake();
                }
            }
        }
        drop(calls);
        if n > 0 {
            // Blocking waiters look at the table only when this moved.
            self.results.fetch_add(1, Ordering::AcqRel);
        }
        let mut lost = vec![];
        lock(&self.kept).retain(|_, k| match gone(k.to) {
            Some(e) => {
                lost.push((k.sent.clone(), e));
                false
            }
            None => true,
        });
        for (sent, e) in &lost {
            *lock(&sent.lost) = Some(e.clone());
            sent.fire();
        }
        n + lost.len()
    }
}
