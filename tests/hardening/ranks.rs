//! Rank programs: run as this executable with `WEFT_HARDEN_CASE` set.

use super::*;

/// Addresses whose byte offset overflows are out of bounds: they never wrap round onto a
/// valid element (`seg.at(r, 2^61 + j)` of a `u64` segment used to write element j).
pub(crate) fn wrapping_indexes() -> Res {
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let seg = w.alloc_segment::<u64>(16)?;
    for i in 0..16 {
        seg.local().write(i, 7);
    }
    w.barrier()?;
    let to = (me + 1) % n;
    let bad = [
        ("at(2^61 + 3)", seg.at(to, (1usize << 61) + 3)),
        ("at(usize::MAX)", seg.at(to, usize::MAX)),
        ("at(0) + usize::MAX", seg.at(to, 0) + usize::MAX),
        ("at(1) + (2^61 - 1)", seg.at(to, 1) + ((1usize << 61) - 1)),
        ("byte_add(usize::MAX - 7)", seg.at(to, 1).byte_add(usize::MAX - 7)),
    ];
    for (what, p) in bad {
        let put = w.put(p, &[99u64]);
        ck(matches!(put, Err(Error::OutOfBounds { .. })), || format!("put at {what}: {put:?}"))?;
        let mut got = [0u64];
        let get = w.get(p, &mut got);
        ck(matches!(get, Err(Error::OutOfBounds { .. })), || format!("get at {what}: {get:?}"))?;
        let add = w.fetch_add(p, 1);
        ck(matches!(add, Err(Error::OutOfBounds { .. })), || format!("fetch_add at {what}: {add:?}"))?;
        let nbi = w.put_nbi(p, &[99u64]);
        ck(matches!(nbi, Err(Error::OutOfBounds { .. })), || format!("put_nbi at {what}: {nbi:?}"))?;
        // Good data, bad signal: nothing is written (on every path).
        let sig = w.put_signal(seg.at(to, 0), &[99u64], p, 1);
        ck(matches!(sig, Err(Error::OutOfBounds { .. })), || {
            format!("put_signal, signal at {what}: {sig:?}")
        })?;
    }
    w.sync_nbi()?;
    w.barrier()?;
    let local = seg.local();
    let changed: Vec<usize> = (0..16).filter(|&i| local.read(i) != 7).collect();
    ck(changed.is_empty(), || format!("elements {changed:?} were written by rejected operations"))?;
    w.barrier().map_err(Failure::from)
}

/// Rank 1 stops itself with SIGSTOP for 3 s (a shell it started sends SIGCONT); rank 0 waits
/// for it in a barrier and must say so after `WEFT_HANG_WARN_S`, naming rank 1.
pub(crate) fn stopped_rank() -> Res {
    let w = World::init()?;
    w.barrier()?;
    if w.rank() == 1 {
        let pid = std::process::id();
        Command::new("sh")
            .args(["-c", &format!("sleep 3; kill -CONT {pid}")])
            .spawn()
            .map_err(|e| format!("sh: {e}"))?;
        weft::fabric::os::kill(pid, 19); // SIGSTOP
    }
    w.barrier().map_err(Failure::from)
}

weft::remote! {
    /// Holds its rank for `ms` milliseconds.
    fn harden_slow(ms: u64) -> u64 { std::thread::sleep(std::time::Duration::from_millis(ms)); ms }
}

/// Rank 1 calls a remote function that holds rank 0 for 2 s, twice: waiting for the call, and
/// blocking on its future; with `WEFT_HANG_WARN_S=1` each wait names the function.
pub(crate) fn slow_remote_fn() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    if w.rank() == 1 {
        ck(w.call(0, harden_slow, (2000,)).wait()? == 2000, || "the call's result".into())?;
        ck(weft::block_on(w.call(0, harden_slow, (2001,)))? == 2001, || "the future's result".into())?;
    }
    w.barrier().map_err(Failure::from)
}

/// Joins the job and leaves (for the start-up checks).
pub(crate) fn init_only() -> Res {
    let w = World::init()?;
    w.barrier().map_err(Failure::from)
}

/// Rank 1 dies of SIGBUS while rank 0 waits for it (and then fails with an error of its
/// own): the launcher must name rank 1's signal, not rank 0's exit status.
pub(crate) fn sigbus_rank() -> Res {
    let w = World::init()?;
    w.barrier()?;
    if w.rank() == 1 {
        if let Ok(go) = std::env::var("WEFT_GO_FILE") {
            std::fs::write(format!("{go}.ready"), b"").map_err(|e| format!("ready file: {e}"))?;
            while !std::path::Path::new(&go).exists() {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // Rust's runtime catches the first SIGBUS (its stack-overflow handler), puts the
        // default action back and returns: the second one ends the process.
        for _ in 0..2 {
            weft::fabric::os::kill(std::process::id(), 7); // SIGBUS
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(5));
    }
    w.barrier().map_err(Failure::from)
}

pub(crate) static NESTED_WORLD: std::sync::OnceLock<World> = std::sync::OnceLock::new();

weft::remote! {
    fn harden_add(a: u64, b: u64) -> u64 { a + b }
}
weft::remote! {
    /// Calls the next rank from inside a remote function (a nested call), awaiting it.
    async fn harden_nested(x: u64) -> u64 {
        use weft::RpcExt;
        let w = NESTED_WORLD.get().expect("world");
        let next = (w.rank() + 1) % w.size();
        w.call(next, harden_add, (x, 1)).await.unwrap_or(u64::MAX)
    }
}

/// Async remote functions that call another rank, many at once from several threads per rank
/// (each thread's waits run the progress hook, so hooks poll tasks concurrently): every call
/// completes. A wake-up that lands while its task is being polled used to be lost, hanging a
/// call (4 ranks, 7 of 56 runs).
pub(crate) fn nested_async_calls() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let w = NESTED_WORLD.get_or_init(|| w);
    // Every rank's remote functions find the world before any call can reach them.
    w.barrier()?;
    let (me, n) = (w.rank(), w.size());
    for round in 0..20u64 {
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..4u64)
                .map(|t| {
                    s.spawn(move || -> Res {
                        let to = (me + 1 + t as u32) % n;
                        let calls: Vec<_> =
                            (0..50u64).map(|i| (i, w.call(to, harden_nested, (round * 1000 + i,)))).collect();
                        for (i, c) in calls {
                            let got = c.wait()?;
                            ck(got == round * 1000 + i + 1, || format!("nested call {i} gave {got}"))?;
                        }
                        Ok(())
                    })
                })
                .collect();
            workers.into_iter().try_for_each(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
        })?;
        w.barrier()?;
    }
    Ok(())
}

weft::remote! {
    /// One level of a chain of nested calls between two ranks: calls the other rank one level
    /// deeper and awaits the answer; the deepest level instead wakes itself `yields` times, each
    /// wake-up taken while every level above it waits in its rank's task queue.
    async fn harden_chain(depth: u64, yields: u64) -> u64 {
        use weft::RpcExt;
        if depth == 0 {
            for _ in 0..yields {
                yield_once().await;
            }
            return 0;
        }
        let w = NESTED_WORLD.get().expect("world");
        let next = (w.rank() + 1) % w.size();
        w.call(next, harden_chain, (depth - 1, yields)).await.map_or(u64::MAX, |d| d.saturating_add(1))
    }
}

/// Wakes its task and returns `Pending`, once: one wake-up for the task queue.
async fn yield_once() {
    let mut woke = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut woke, true) {
            return std::task::Poll::Ready(());
        }
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await
}

/// Wake-ups of the deepest level of [`harden_chain`] per level.
const CHAIN_YIELDS: u64 = 50;

/// A chain of nested async calls 10 times as deep, whose deepest call wakes itself 10 times as
/// often, takes about 10 times as long: at most 30 (the margin is for loaded machines). Each
/// wake-up used to move every task waiting in its rank's queue (half the chain), so the time
/// grew with the square of the depth, to about 100 times. The best of up to three runs of each
/// counts. 10,000 levels also check that a future polled inside a hook runs no hooks (each
/// level's poll used to nest in the one before, until a stack overflowed).
pub(crate) fn nested_chain_linear() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let w = NESTED_WORLD.get_or_init(|| w);
    // Every rank's remote functions find the world before any call can reach them.
    w.barrier()?;
    if w.rank() == 0 {
        let time = |depth: u64| -> Res<Duration> {
            let t = Instant::now();
            let got = w.call(1, harden_chain, (depth, CHAIN_YIELDS * depth)).wait()?;
            let took = t.elapsed();
            ck(got == depth, || format!("a chain {depth} deep gave {got}"))?;
            Ok(took)
        };
        time(1_000)?; // warm-up
        let (mut short, mut long, mut ratio) = (Duration::MAX, Duration::MAX, f64::MAX);
        for _ in 0..3 {
            short = short.min(time(1_000)?);
            long = long.min(time(10_000)?);
            ratio = long.as_secs_f64() / short.as_secs_f64();
            if ratio <= 30.0 {
                break;
            }
        }
        ck(ratio <= 30.0, || {
            format!("a chain 10,000 deep took {long:?}, {ratio:.0} times one 1,000 deep ({short:?})")
        })?;
    }
    w.barrier().map_err(Failure::from)
}

weft::remote! {
    /// Calls the rank two places on (a third rank) from inside a remote function.
    async fn harden_via_third(x: u64) -> u64 {
        use weft::RpcExt;
        let w = NESTED_WORLD.get().expect("world");
        let third = (w.rank() + 2) % w.size();
        w.call(third, harden_add, (x, 1)).await.unwrap_or(u64::MAX)
    }
}

/// 1000 calls per rank spawned on a multi-thread tokio runtime, each one's remote function
/// awaiting a call to a third rank: every result is right. Each future's poll used to run the
/// hooks, which polled remote functions' tasks, whose calls' polls ran the hooks again, until
/// a tokio worker's stack overflowed (2 of 92 runs).
pub(crate) fn nested_calls_under_tokio() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let w = NESTED_WORLD.get_or_init(|| w);
    // Every rank's remote functions find the world before any call can reach them.
    w.barrier()?;
    let (me, n) = (w.rank(), w.size());
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().map_err(|e| e.to_string())?;
    let comm = w.arc();
    let results = rt.block_on(async move {
        let to = (me + 1) % n;
        let tasks: Vec<_> =
            (0..1000u64).map(|i| tokio::spawn(comm.call(to, harden_via_third, (i,)))).collect();
        let mut out = Vec::with_capacity(tasks.len());
        for t in tasks {
            out.push(t.await);
        }
        out
    });
    for (i, r) in results.into_iter().enumerate() {
        let got = r.map_err(|e| format!("task {i}: {e}"))??;
        ck(got == i as u64 + 1, || format!("call {i} gave {got}"))?;
    }
    w.barrier().map_err(Failure::from)
}

/// Peak resident memory of this process (`VmHWM`), in bytes.
pub(crate) fn peak_rss() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// A rendezvous descriptor with one pointer chunk of `len` bytes at `addr` (the index inline
/// and empty).
pub(crate) fn descriptor(addr: u64, len: u64) -> Vec<u8> {
    let mut d = 1u64.to_le_bytes().to_vec(); // one chunk
    d.push(1); // the index is inline
    d.extend_from_slice(&0u64.to_le_bytes()); // of 0 bytes
    d.push(0); // a pointer chunk of bytes
    for word in [len, addr, 0] {
        d.extend_from_slice(&word.to_le_bytes());
    }
    d
}

/// Forged RPC descriptors (a rank that lies): one declaring 8 GiB, and a stream of 2000
/// declaring 512 MiB each at an address that cannot be read, to a real function, to an
/// unknown one, and as results of calls the target never made. Each is refused or fails
/// without touching memory: the target keeps serving at once and its peak memory stays flat
/// (one 8 GiB descriptor used to drive a target to 6 GB, a stream of them to stall it).
pub(crate) fn forged_rpc_flood() -> Res {
    use weft::rpc::proto::{Header, CALL, POST, RENDEZVOUS, RESULT_OK};
    use weft::rpc::RemoteFn;
    use weft::RpcExt;
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let peer = (me + 1) % n;
    let h = w.handler_named("weft.rpc.msg").ok_or("no RPC message handler")?;
    let add = weft::rpc::fn_id(harden_add::NAME);
    let before = peak_rss();
    w.barrier()?;
    let head = |kind, fn_id, call_id, ack_id| {
        let (words, k) = Header { kind, mode: RENDEZVOUS, fn_id, call_id, ack_id }.encode();
        words[..k].to_vec()
    };
    let huge = descriptor(0x1000, 8 << 30);
    w.am_request_medium(peer, h, &head(CALL, add, 77, 1), &huge)?;
    let big = descriptor(0x1000, 512 << 20);
    let t = Instant::now();
    for i in 0..2000u64 {
        let (kind, f) = [(CALL, add), (POST, add), (CALL, 0xdead), (RESULT_OK, 0)][i as usize % 4];
        w.am_request_medium(peer, h, &head(kind, f, 1_000_000 + i, 2 + i), &big)?;
    }
    // Served after all of the above (messages from one rank arrive in order).
    let r = w.call(peer, harden_add, (2, 3)).wait()?;
    let took = t.elapsed();
    ck(r == 5, || format!("a call after the forged ones gave {r}"))?;
    ck(took < Duration::from_secs(20), || format!("the target took {took:?} to serve 2001 messages"))?;
    w.barrier()?;
    let grew = peak_rss().saturating_sub(before);
    ck(grew < 256 << 20, || format!("peak memory grew by {} MiB under forged descriptors", grew >> 20))?;
    let rpc = weft::rpc::Rpc::of(&w)?;
    let bad = rpc.stats.malformed.load(std::sync::atomic::Ordering::SeqCst)
        + rpc.stats.unknown_function.load(std::sync::atomic::Ordering::SeqCst);
    ck(bad >= 2001, || format!("only {bad} forged messages counted"))?;
    w.barrier().map_err(Failure::from)
}

weft::remote! {
    fn harden_sum(v: Vec<u64>) -> u64 { v.iter().sum() }
}

/// A third rank forges what only an operation's target may send (tokens and ids are
/// sequential): RMA completions of the AM path, RPC results and RPC acknowledgements. Rank 0
/// runs atomics and a call on rank 2 while rank 2 sleeps outside weft (and runs no progress
/// thread, which would serve the call meanwhile) and rank 1 forges:
/// none is taken, every atomic and the call give the true values, and the call's arguments
/// are not released before rank 2 has pulled them.
pub(crate) fn forged_completions() -> Res {
    use std::future::Future;
    use weft::rpc::proto::{Header, EAGER, RESULT_OK};
    use weft::RpcExt;
    let w = World::init()?;
    let me = w.rank();
    let seg = w.alloc_segment::<u64>(1)?;
    let flag = w.alloc_segment::<u64>(1)?;
    let local = flag.local();
    let signal =
        |to: u32| w.atomic_store(flag.at(to, 0), 1).and_then(|()| w.notify(to)).map_err(Failure::from);
    let signalled = || {
        w.wait_until(|| local.atomic(0).load(std::sync::atomic::Ordering::Acquire) == 1)
            .map_err(Failure::from)
    };
    w.barrier()?;
    match me {
        0 => {
            let k = 100u64;
            let handles: Vec<_> = (0..k)
                .map(|_| w.atomic_nb(seg.at(2, 0), weft::AtomicOp::FetchAdd(1)))
                .collect::<weft::Result<_>>()?;
            let (sent, result) = w.call_with(2, harden_sum, (vec![1u64; 1 << 16],), None);
            signal(1)?;
            signalled()?;
            let mut sent = std::pin::pin!(sent);
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            let mut wrong = Vec::new();
            if sent.as_mut().poll(&mut cx).is_ready() {
                wrong.push("a forged ack released the call's arguments".to_string());
            }
            let got: Vec<weft::Result<u64>> = handles.into_iter().map(|h| h.wait()).collect();
            let bad = got.iter().zip(0..).filter(|(g, i)| !matches!(g, Ok(v) if v == i)).count();
            if bad > 0 {
                wrong.push(format!("{bad} of {k} fetch-adds under forged completions were wrong"));
            }
            match result.wait() {
                Ok(r) if r == 1 << 16 => {}
                r => wrong.push(format!("the call under forged results gave {r:?}")),
            }
            ck(wrong.is_empty(), || wrong.join("; "))?;
        }
        1 => {
            signalled()?;
            let done = w.handler_named("weft.rma.done").ok_or("no weft.rma.done")?;
            let ack = w.handler_named("weft.rpc.ack").ok_or("no weft.rpc.ack")?;
            let msg = w.handler_named("weft.rpc.msg").ok_or("no weft.rpc.msg")?;
            for tok in 1..=1000u64 {
                w.am_request_short(0, done, &[tok, 0xdead_beef, 0, 0])?;
            }
            for id in 0..1000u64 {
                w.am_request_short(0, ack, &[id])?;
            }
            for call_id in (1..=4u64).flat_map(|g| (0..64u64).map(move |i| g << 32 | i)) {
                let (words, n) =
                    Header { kind: RESULT_OK, mode: EAGER, fn_id: 0, call_id, ack_id: 0 }.encode();
                w.am_request_medium(0, msg, &words[..n], &666u64.to_le_bytes())?;
            }
            // Everything forged has been handled on rank 0 before it hears this (one ring).
            signal(0)?;
        }
        _ => std::thread::sleep(Duration::from_millis(1500)),
    }
    w.barrier().map_err(Failure::from)
}

/// A partner that sends world-barrier messages ahead of time (forged arrivals): a partner may
/// be one barrier ahead, so rank 0 may pass a barrier or two on them, but the rest are
/// refused and reported: within four barriers rank 0 waits for the real partner or hears of
/// the forgery (it used to pass all four at once).
pub(crate) fn forged_barrier() -> Res {
    let w = World::init()?;
    if w.rank() == 1 {
        w.barrier()?;
        let h = w.handler_named("weft.barrier").ok_or("no weft.barrier")?;
        // Round 0 of the world's barrier, for world calls 1 to 8: some before rank 0's,
        // some ahead of any live partner's.
        for call in 1..=8 {
            w.am_request_short(0, h, &[0, 0, call])?;
        }
        std::thread::sleep(Duration::from_millis(1000));
        // Rank 0 may have stopped at the forgery: its end is no error here.
        let _ = w.barrier();
        return Ok(());
    }
    // The first barrier, which rank 1 may forge for as soon as it has left it.
    for i in 0..5 {
        let t = Instant::now();
        match w.barrier() {
            Err(Error::Remote(m)) if m.contains("barrier") || m.contains("world collective") => return Ok(()),
            Ok(()) if t.elapsed() >= Duration::from_millis(500) => return Ok(()),
            Ok(()) => {}
            Err(e) => return Err(format!("barrier {i} after forged arrivals: {e}").into()),
        }
    }
    Err("the first and four more barriers passed at once on forged arrivals".into())
}

/// Exchange contributions of made-up exchanges, more than a member can have outstanding:
/// refused and reported, not kept without bound.
pub(crate) fn forged_exchange_flood() -> Res {
    let w = World::init()?;
    w.barrier()?;
    if w.rank() == 1 {
        let h = w.handler_named("weft.exchange").ok_or("no weft.exchange")?;
        for seq in 0..200u64 {
            // Rank 0 may stop at the flood and leave.
            if w.am_request_medium(0, h, &[1_000_000 + seq, 0xbad], &[7u8; 4096]).is_err() {
                break;
            }
        }
        // Rank 0 stops at the flood: its end is no error here.
        let _ = w.barrier();
        return Ok(());
    }
    // Rank 1's barrier message comes after its flood: this barrier ends once all is here.
    match w.barrier() {
        Err(Error::Remote(m)) if m.contains("exchange") => Ok(()),
        r => Err(format!("after a flood of forged exchange contributions: {r:?}").into()),
    }
}

/// Barriers 20 ms apart, `WEFT_LOOP_MS / 20` of them (default 1000: some 20 s).
pub(crate) fn barrier_loop() -> Res {
    let w = World::init()?;
    let ms: u64 = std::env::var("WEFT_LOOP_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    // A count, not each rank's own clock: a rank whose time ran out first would leave while
    // a slower one entered one more barrier (1 run in 6 on a loaded machine).
    for _ in 0..ms / 20 {
        // Every rank: the barrier's waits stay short (below a peer-check period).
        std::thread::sleep(Duration::from_millis(20));
        w.barrier()?;
    }
    Ok(())
}

/// Another user's process: holds (`WEFT_CLAIM_HOLD`) or knocks on (`WEFT_CLAIM_KNOCK`) the
/// abstract socket that claims a rank of a job.
pub(crate) fn stranger() -> Res {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
    let var = |v: &str| std::env::var(v).ok();
    if let Some(name) = var("WEFT_CLAIM_HOLD") {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| e.to_string())?;
        let _l = UnixListener::bind_addr(&addr).map_err(|e| format!("bind @{name}: {e}"))?;
        println!("holding");
        std::thread::sleep(Duration::from_secs(10));
    } else if let Some(name) = var("WEFT_CLAIM_KNOCK") {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).map_err(|e| e.to_string())?;
        for _ in 0..50 {
            UnixStream::connect_addr(&addr).map_err(|e| format!("connect @{name}: {e}"))?;
        }
    }
    Ok(())
}

/// Rank 0 allocates a segment 2 s after rank 1, which publishes its part and waits.
pub(crate) fn alloc_late() -> Res {
    let w = World::init()?;
    if w.rank() == 0 {
        std::thread::sleep(Duration::from_secs(2));
    }
    w.alloc_segment::<u64>(1 << 20)?;
    w.barrier().map_err(Failure::from)
}

weft::remote! {
    /// The sum of `v`'s bytes, and whether `v` arrived in this rank's pool.
    fn harden_byte_sum(v: weft::RmaVec<u8>) -> (u64, bool) {
        (v.iter().map(|&b| b as u64).sum(), v.in_pool())
    }
}

/// Asks the RPC pool for more than the (small) `/dev/shm` holds: no SIGBUS, and no error
/// either: the vector lives on the heap, and travels as a plain chunk (an example's 8 MiB
/// `RmaVec`s on Docker's 64 MiB /dev/shm failed its call before).
pub(crate) fn pool_beyond_shm() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let mut big = weft::RmaVec::<u8>::with_capacity(&w, 48 << 20)?;
    ck(!big.in_pool(), || "48 MiB of the pool on a 16 MiB /dev/shm".into())?;
    big.extend_from_slice(&vec![3u8; 20 << 20])?;
    // Smaller blocks still go into the pool.
    let v = weft::RmaVec::<u8>::from_slice(&w, &[7u8; 4096])?;
    ck(v.iter().all(|&b| b == 7) && v.in_pool(), || "a 4 KiB block after the heap's".into())?;
    // 20 MiB to the peer, whose pool cannot take it either.
    let peer = (w.rank() + 1) % w.size();
    let (sum, in_pool) = w.call(peer, harden_byte_sum, (big,)).wait()?;
    ck(sum == 3 * (20 << 20) && !in_pool, || format!("20 MiB argument: sum {sum}, in the pool {in_pool}"))?;
    let (sum, in_pool) = w.call(peer, harden_byte_sum, (v,)).wait()?;
    ck(sum == 7 * 4096 && in_pool, || format!("4 KiB argument: sum {sum}, in the pool {in_pool}"))?;
    w.barrier().map_err(Failure::from)
}

/// A segment that fits the small `/dev/shm` for one rank but not for both: every rank gets
/// an error (a rank whose own reservation failed used to leave before the allocation's
/// barrier, so the ranks' world collectives came apart for good), and the world goes on.
pub(crate) fn partial_alloc() -> Res {
    let w = World::init()?;
    // Rank 0 reserves its part first (a registration precedes the allocation's exchange).
    if w.rank() == 1 {
        std::thread::sleep(Duration::from_millis(300));
    }
    let big = w.alloc_segment::<u8>(40 << 20);
    ck(big.is_err(), || "40 MiB on two ranks of a 64 MiB /dev/shm".into())?;
    for _ in 0..3 {
        w.barrier()?;
    }
    let small = w.alloc_segment::<u64>(1024)?;
    w.put(small.at((w.rank() + 1) % w.size(), 5), &[9])?;
    let team = w.world_team()?;
    team.barrier()?;
    ck(small.local().read(5) == 9, || "put after the failed allocation".into())?;
    // And the same size again: the memory of the failed try came back.
    let again = w.alloc_segment::<u8>(40 << 20);
    ck(again.is_err(), || "40 MiB again".into())?;
    w.barrier().map_err(Failure::from)
}

pub(crate) fn late_rank() -> Res {
    if std::env::var("WEFT_RANK").as_deref() == Ok("1") {
        std::thread::sleep(Duration::from_secs(30));
    }
    init_only()
}

/// A 1 TiB segment on a 64 MiB /dev/shm: refused at once on every rank with an error that
/// says what is available, nothing of it left behind, and the world still usable.
pub(crate) fn huge_segment() -> Res {
    let w = World::init()?;
    let shm = std::path::Path::new("/dev/shm");
    let before = weft::fabric::os::fs_used_bytes(shm)?;
    let t = Instant::now();
    let r = w.alloc_segment::<u8>(1 << 40);
    let took = t.elapsed();
    let Err(e) = r else { return Err("a 1 TiB segment was allocated".into()) };
    ck(took < Duration::from_secs(1), || format!("the refusal took {took:?}"))?;
    let text = e.to_string();
    ck(text.contains("1099511627776") || text.contains("TiB") || text.contains("/dev/shm"), || {
        format!("the error does not name the request or the space: {text}")
    })?;
    let after = weft::fabric::os::fs_used_bytes(shm)?;
    ck(after <= before + (1 << 20), || {
        format!("/dev/shm grew by {} bytes for a refused segment", after - before)
    })?;
    let small = w.alloc_segment::<u64>(1024)?;
    w.put(small.at((w.rank() + 1) % w.size(), 0), &[7u64])?;
    w.barrier().map_err(Failure::from)
}
