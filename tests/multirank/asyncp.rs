//! Futures without spinning, and a rank whose threads are all outside weft still serving
//! (the default on-demand progress thread).

use super::*;
use life::cpu_time;

weft::remote! {
    fn asyncp_echo(x: u64) -> u64 { x }
}
weft::remote! {
    /// An `async` function: it runs from the progress hook, not inside the handler.
    async fn asyncp_async_echo(x: u64) -> u64 { x }
}
weft::remote! {
    /// Holds the target's serving thread for `ms` milliseconds.
    fn asyncp_nap(ms: u64) -> u64 { std::thread::sleep(Duration::from_millis(ms)); ms }
}

/// Calls rank 0 100 times at once and awaits them all: the results come back in order within
/// 200 ms (`whom` describes rank 0 for the failure message).
fn hundred_calls_to_0(w: &World, whom: &str) -> Res {
    use weft::RpcExt;
    let t0 = Instant::now();
    let calls: Vec<_> = (0..100u64).map(|i| w.call(0, asyncp_echo, (i,))).collect();
    let got = weft::block_on(async {
        let mut v = vec![];
        for c in calls {
            v.push(c.await?);
        }
        Ok::<_, weft::Error>(v)
    })?;
    let wall = t0.elapsed();
    ck(got == (0..100).collect::<Vec<_>>(), || "results out of order".into())?;
    ck(wall < Duration::from_millis(200), || format!("100 calls to {whom} took {wall:?}"))
}

/// Rank 0's main thread sleeps 400 ms without calling weft while the others call it: the calls
/// are answered within a bounded time: its progress thread serves them.
pub(crate) fn busy_target_serves() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    w.barrier()?;
    let asleep = Duration::from_millis(400);
    if w.rank() == 0 {
        std::thread::sleep(asleep);
    } else {
        // Let rank 0 get to its sleep first.
        std::thread::sleep(Duration::from_millis(50));
        hundred_calls_to_0(&w, &format!("a rank outside weft (its sleep: {asleep:?})"))?;
        // Functions that run later (async, so queued by the handler) are served as well.
        let t1 = Instant::now();
        let calls: Vec<_> = (0..20u64).map(|i| w.call(0, asyncp_async_echo, (i,))).collect();
        for (i, c) in calls.into_iter().enumerate() {
            ck(weft::block_on(c)? == i as u64, || "async echo differs".into())?;
        }
        let wall = t1.elapsed();
        ck(wall < Duration::from_millis(150), || {
            format!("20 async calls to a rank outside weft took {wall:?} (its sleep: {asleep:?})")
        })?;
    }
    w.barrier()?;
    Ok(())
}

/// A future that stays pending for 300 ms (its target naps in the remote function) costs its
/// process little CPU: neither the awaiting thread nor the progress thread spins.
pub(crate) fn pending_future_sleeps() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    w.barrier()?;
    if w.rank() == 1 {
        let (t0, c0) = (Instant::now(), cpu_time()?);
        let r = weft::block_on(w.call(0, asyncp_nap, (300,)))?;
        let (wall, cpu) = (t0.elapsed(), cpu_time()? - c0);
        ck(r == 300 && wall >= Duration::from_millis(300), || format!("nap gave {r} after {wall:?}"))?;
        ck(cpu < wall / 5, || format!("awaiting a call for {wall:?} used {cpu:?} of CPU"))?;
    }
    w.barrier()?;
    Ok(())
}

/// A non-blocking collective awaited as a future while a member arrives 300 ms late: the
/// waiting ranks use little CPU (progress drives the team and wakes the handle).
pub(crate) fn pending_collective_sleeps() -> Res {
    let w = World::init()?;
    let team = w.world_team()?;
    w.barrier()?;
    if w.rank() == 0 {
        std::thread::sleep(Duration::from_millis(300));
    }
    let (t0, c0) = (Instant::now(), cpu_time()?);
    let sum = weft::block_on(team.allreduce_nb(vec![1u64; 4], weft::ReduceOp::Sum)?)?;
    let (wall, cpu) = (t0.elapsed(), cpu_time()? - c0);
    ck(sum == vec![w.size() as u64; 4], || format!("allreduce gave {sum:?}"))?;
    if w.rank() != 0 {
        ck(cpu < wall / 5 + Duration::from_millis(20), || {
            format!("awaiting a collective for {wall:?} used {cpu:?} of CPU")
        })?;
    }
    w.barrier()?;
    Ok(())
}

/// Rank 0 computes in 1 ms spells and posts a call to rank 1 after each, for 400 ms: sending
/// is not serving, so its progress thread must still answer the calls rank 1 makes meanwhile.
pub(crate) fn sending_rank_serves() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    w.barrier()?;
    let spell = Duration::from_millis(400);
    if w.rank() == 0 {
        let t0 = Instant::now();
        while t0.elapsed() < spell {
            let until = Instant::now() + Duration::from_millis(1);
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            w.post(1, asyncp_echo, (1,))?;
        }
    } else if w.rank() == 1 {
        std::thread::sleep(Duration::from_millis(50));
        hundred_calls_to_0(&w, &format!("a rank that computes and sends (its spell: {spell:?})"))?;
    }
    w.barrier()?;
    Ok(())
}

weft::remote! {
    /// Ends the process without answering or finalizing (as a lost node would).
    fn asyncp_vanish() -> u64 { std::process::exit(0) }
}

/// Rank 0 awaits a call whose target vanishes while running it: the future fails with
/// `PeerFailed` within seconds instead of hanging (no wait loop checks an awaited future's
/// peer: the liveness checks do). Then a get from the gone rank ends as well.
pub(crate) fn awaited_call_target_vanishes() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let seg = w.alloc_segment::<u64>(4)?;
    w.barrier()?;
    // Every other rank says it left the barrier before rank 0 calls: a call that ends rank 1
    // while it still waits in the barrier (handlers run in every wait) would rightly fail the
    // barrier of a rank that needs rank 1's last message.
    if w.rank() != 0 {
        w.fetch_add(seg.at(0, 0), 1)?;
    }
    match w.rank() {
        0 => {
            let others = u64::from(w.size() - 1);
            w.wait_until(|| seg.local().atomic(0).load(std::sync::atomic::Ordering::Acquire) == others)?;
            let t = Instant::now();
            let r = weft::block_on(w.call(1, asyncp_vanish, ()));
            ck(matches!(&r, Err(Error::PeerFailed { rank: 1, .. })), || {
                format!("call to a vanished rank: {r:?}")
            })?;
            ck(t.elapsed() < Duration::from_secs(5), || format!("detection took {:?}", t.elapsed()))?;
            let mut buf = [0u64; 4];
            let r = w.get_nb(seg.at(1, 0), &mut buf).and_then(weft::block_on);
            let am_path = std::env::var("WEFT_RMA").is_ok_and(|v| v == "am");
            ck(!am_path || r.is_err(), || format!("an AM-path get from a vanished rank gave {r:?}"))?;
        }
        // Ends in the call above within milliseconds (polling: with `WEFT_PROGRESS_THREAD=0`
        // nothing else would run it).
        1 => {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(20) {
                w.poll()?;
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        _ => {}
    }
    Ok(())
}

/// Runs `fut` on this thread, parking until its waker fires (no periodic re-poll, unlike
/// `weft::block_on`: what an executor with nothing else to do does); `None` after `limit`.
fn park_on<F: std::future::Future>(fut: F, limit: Duration) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    let end = Instant::now() + limit;
    loop {
        if let std::task::Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        let now = Instant::now();
        if now >= end {
            return None;
        }
        std::thread::park_timeout(end - now);
    }
}

/// A 1 MiB allreduce awaited by an executor that polls only when woken, while the others
/// call the blocking form: the progress thread drives it to the end (its data comes as puts,
/// which need not wake anyone).
pub(crate) fn awaited_large_collective() -> Res {
    let w = World::init()?;
    let team = w.world_team()?;
    let words = 1 << 17;
    for round in 0..3 {
        let want = (w.size() as u64) * (round + 1);
        let got = if w.rank() == 0 {
            let h = team.allreduce_nb(vec![round + 1; words], weft::ReduceOp::Sum)?;
            park_on(h, Duration::from_secs(10))
                .ok_or_else(|| format!("round {round}: still pending after 10 s"))??
        } else {
            team.allreduce(&vec![round + 1; words], weft::ReduceOp::Sum)?
        };
        ck(got.len() == words && got.iter().all(|&x| x == want), || format!("round {round}: wrong sum"))?;
    }
    w.barrier().map_err(Failure::from)
}

/// A collective awaited (parked executor) while a member vanishes: the future fails with
/// `PeerFailed` within seconds. Then a future awaited when the World is dropped ends with
/// the finalized error.
pub(crate) fn awaited_collective_member_vanishes() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let team = w.world_team()?;
    w.barrier()?;
    if w.rank() == 1 {
        // Out of the barrier, so every message of it was sent: the others finish it.
        std::process::exit(0);
    }
    if w.rank() != 0 {
        return Ok(());
    }
    let t = Instant::now();
    let h = team.allreduce_nb(vec![1u64; 8], weft::ReduceOp::Sum)?;
    let r = park_on(h, Duration::from_secs(10)).ok_or("the collective was still pending after 10 s")?;
    ck(matches!(&r, Err(Error::PeerFailed { .. })), || format!("collective with a vanished member: {r:?}"))?;
    ck(t.elapsed() < Duration::from_secs(5), || format!("detection took {:?}", t.elapsed()))?;
    // A call's future that outlives its World (to rank 0 itself, which will not answer now).
    let fut = w.call(0, asyncp_nap, (1000,));
    drop(team);
    drop(w);
    let r = park_on(fut, Duration::from_secs(10)).ok_or("a future outliving its World stayed pending")?;
    ck(r.is_err(), || format!("a call future after finalize gave {r:?}"))
}
