//! The caller's API: calls and posts, their futures and "sent" signals.

use super::*;

/// The result of a call: `.await` it (any executor), [`CallFuture::wait`] for it, or test it.
#[must_use = "a call's result arrives only through its future"]
pub struct CallFuture<'c, R> {
    comm: &'c Comm,
    /// The RPC layer while the call is in flight (`None` once finished or failed early).
    rpc: Option<&'c Rpc>,
    id: u64,
    early: Option<Error>,
    _r: PhantomData<fn() -> R>,
}

impl<R: serde::de::DeserializeOwned> CallFuture<'_, R> {
    /// Blocks (making progress) until the result is here.
    pub fn wait(mut self) -> Result<R> {
        if let Some(e) = self.early.take() {
            return Err(e);
        }
        let rpc = self.rpc.ok_or(Error::Misuse("call already finished"))?;
        let id = self.id;
        let mut seen = u64::MAX;
        let mut outcome = None;
        self.comm.wait_until(|| {
            // Look at the table only when some result arrived since the last look, and take
            // the outcome out in that same look.
            let now = rpc.results.load(Ordering::Acquire);
            if now == seen {
                return false;
            }
            seen = now;
            let mut calls = lock(&rpc.calls);
            match calls.get_mut(id) {
                Some(s) if s.outcome.is_none() => false,
                _ => {
                    outcome = calls.remove(id).and_then(|s| s.outcome);
                    true
                }
            }
        })?;
        self.rpc = None;
        decode_outcome(rpc, outcome)
    }

    fn finish(&mut self) -> Result<R> {
        let rpc = self.rpc.take().ok_or(Error::Misuse("call already finished"))?;
        let outcome = lock(&rpc.calls).remove(self.id).and_then(|s| s.outcome);
        decode_outcome(rpc, outcome)
    }
}

/// The caller's side of a delivered outcome: the result, or the remote error.
fn decode_outcome<R: serde::de::DeserializeOwned>(rpc: &Rpc, outcome: Option<Outcome>) -> Result<R> {
    let Some((ok, index, chunks)) = outcome else {
        return Err(Error::Misuse("call result missing"));
    };
    let source = Pulled(RefCell::new(chunks));
    if ok {
        let pool = rpc.pool.get().map(|p| p.blocks().clone());
        with_decode_pool(pool, || archive::decode::<R>(&index, &source))
            .map_err(|e| Error::Remote(format!("result does not decode: {e}")))
    } else {
        let why: String =
            archive::decode(&index, &source).unwrap_or_else(|e| format!("undecodable error: {e}"));
        Err(Error::Remote(why))
    }
}

impl<R: serde::de::DeserializeOwned> Future for CallFuture<'_, R> {
    type Output = Result<R>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<R>> {
        if let Some(e) = self.early.take() {
            return Poll::Ready(Err(e));
        }
        if let Err(e) = self.comm.poll() {
            return Poll::Ready(Err(e));
        }
        let Some(rpc) = self.rpc else {
            return Poll::Ready(Err(Error::Misuse("call already finished")));
        };
        let done = {
            let mut calls = lock(&rpc.calls);
            match calls.get_mut(self.id) {
                Some(s) if s.outcome.is_none() => {
                    s.waker = Some(cx.waker().clone());
                    false
                }
                _ => true,
            }
        };
        if done {
            return Poll::Ready(self.finish());
        }
        if !self.comm.config().progress_thread {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

impl<R> Drop for CallFuture<'_, R> {
    fn drop(&mut self) {
        if let Some(rpc) = self.rpc {
            lock(&rpc.calls).remove(self.id);
        }
    }
}

/// Completes when the arguments of a call have left the caller's memory (eager: at once;
/// rendezvous: when the target has pulled every chunk) — HPX's `async_cb`.
pub struct Sent<'c> {
    comm: &'c Comm,
    state: Option<Arc<SentState>>,
}

impl Sent<'_> {
    /// Blocks (making progress) until the arguments may be reused.
    pub fn wait(self) -> Result<()> {
        match &self.state {
            None => Ok(()),
            Some(s) => self.comm.wait_until(|| s.done.load(Ordering::Acquire)),
        }
    }
}

impl Future for Sent<'_> {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let Some(s) = &self.state else { return Poll::Ready(Ok(())) };
        if let Err(e) = self.comm.poll() {
            return Poll::Ready(Err(e));
        }
        if s.done.load(Ordering::Acquire) {
            return Poll::Ready(Ok(()));
        }
        *lock(&s.waker) = Some(cx.waker().clone());
        if !self.comm.config().progress_thread {
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}

/// Calling remote functions: implemented for [`Comm`] (and so for a `World`).
pub trait RpcExt {
    /// Runs `f(args)` on `rank`; the future gives its result (or the remote error or panic).
    fn call<F: RemoteFn>(&self, rank: u32, f: F, args: F::Args) -> CallFuture<'_, F::Output>;
    /// As [`RpcExt::call`], also returning the "sent" signal; `threshold` overrides the
    /// world's chunk threshold for this call.
    fn call_with<F: RemoteFn>(
        &self,
        rank: u32,
        f: F,
        args: F::Args,
        threshold: Option<usize>,
    ) -> (Sent<'_>, CallFuture<'_, F::Output>);
    /// Runs `f(args)` on `rank` without a result (errors there are counted, not reported).
    fn post<F: RemoteFn>(&self, rank: u32, f: F, args: F::Args) -> Result<Sent<'_>>;
}

impl RpcExt for Comm {
    fn call<F: RemoteFn>(&self, rank: u32, f: F, args: F::Args) -> CallFuture<'_, F::Output> {
        self.call_with(rank, f, args, None).1
    }

    fn call_with<F: RemoteFn>(
        &self,
        rank: u32,
        _f: F,
        args: F::Args,
        threshold: Option<usize>,
    ) -> (Sent<'_>, CallFuture<'_, F::Output>) {
        let mut medium = |d, h, a: &[u64], p: &[u8]| self.am_request_medium(d, h, a, p);
        start_call::<F>(self, &mut medium, rank, args, threshold)
    }

    fn post<F: RemoteFn>(&self, rank: u32, _f: F, args: F::Args) -> Result<Sent<'_>> {
        let mut medium = |d, h, a: &[u64], p: &[u8]| self.am_request_medium(d, h, a, p);
        start_post::<F>(self, &mut medium, rank, args)
    }
}

/// Sends a call through `medium`; the result comes back on the world's default path.
fn start_call<'c, F: RemoteFn>(
    comm: &'c Comm,
    medium: &mut Medium<'_>,
    rank: u32,
    args: F::Args,
    threshold: Option<usize>,
) -> (Sent<'c>, CallFuture<'c, F::Output>) {
    let fail = |e: Error| {
        (Sent { comm, state: None }, CallFuture { comm, rpc: None, id: 0, early: Some(e), _r: PhantomData })
    };
    let rpc = match Rpc::get(comm) {
        Ok(r) => r,
        Err(e) => return fail(e),
    };
    let id = lock(&rpc.calls).insert(CallSlot { target: rank, outcome: None, waker: None });
    let th = threshold.unwrap_or_else(|| rpc.threshold());
    match rpc.send_via(comm, medium, rank, call_head(CALL, F::ID, id), Value(args), th) {
        Ok(sent) => (
            Sent { comm, state: sent },
            CallFuture { comm, rpc: Some(rpc), id, early: None, _r: PhantomData },
        ),
        Err(e) => {
            lock(&rpc.calls).remove(id);
            fail(e)
        }
    }
}

fn start_post<'c, F: RemoteFn>(
    comm: &'c Comm,
    medium: &mut Medium<'_>,
    rank: u32,
    args: F::Args,
) -> Result<Sent<'c>> {
    let rpc = Rpc::get(comm)?;
    let th = rpc.threshold();
    let sent = rpc.send_via(comm, medium, rank, call_head(POST, F::ID, 0), Value(args), th)?;
    Ok(Sent { comm, state: sent })
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
pub trait EndpointRpcExt<'c> {
    /// Runs `f(args)` on `rank`; the future gives its result.
    fn call<F: RemoteFn>(&mut self, rank: u32, f: F, args: F::Args) -> CallFuture<'c, F::Output>;
    /// Runs `f(args)` on `rank` without a result.
    fn post<F: RemoteFn>(&mut self, rank: u32, f: F, args: F::Args) -> Result<Sent<'c>>;
}

impl<'c> EndpointRpcExt<'c> for Endpoint<'c> {
    fn call<F: RemoteFn>(&mut self, rank: u32, _f: F, args: F::Args) -> CallFuture<'c, F::Output> {
        let comm = self.comm();
        let (_, future) = {
            let mut medium = |d, h, a: &[u64], p: &[u8]| self.am_request_medium(d, h, a, p);
            start_call::<F>(comm, &mut medium, rank, args, None)
        };
        match self.sync_nbi() {
            Ok(()) => future,
            Err(e) => CallFuture { comm, rpc: None, id: 0, early: Some(e), _r: PhantomData },
        }
    }

    fn post<F: RemoteFn>(&mut self, rank: u32, _f: F, args: F::Args) -> Result<Sent<'c>> {
        let comm = self.comm();
        let sent = {
            let mut medium = |d, h, a: &[u64], p: &[u8]| self.am_request_medium(d, h, a, p);
            start_post::<F>(comm, &mut medium, rank, args)?
        };
        self.sync_nbi()?;
        Ok(sent)
    }
}
