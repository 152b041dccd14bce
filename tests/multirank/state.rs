//! Handles that own their world, per-rank state (`Dist`) for handlers and remote functions.

use super::*;
use weft::Dist;

weft::remote! {
    /// Adds to the target's own counter; says which rank's world it ran in.
    fn state_bump(hits: Dist<AtomicU64>, by: u64) -> (u64, u32) {
        let before = hits.fetch_add(by, Ordering::SeqCst);
        (before, weft::current().map_or(u32::MAX, |w| w.rank()))
    }
}
weft::remote! {
    fn state_add(a: u64, b: u64) -> u64 { a + b }
}
weft::remote! {
    /// Sends back the target's instance (decoded at the caller as the caller's own).
    fn state_echo(hits: Dist<AtomicU64>) -> Dist<AtomicU64> { hits }
}
weft::remote! {
    /// The length of the target's text object.
    fn state_text(s: Dist<String>) -> u64 { s.len() as u64 }
}

/// Every handle and future moves into a thread that outlives the borrow it came from.
pub(crate) fn owned_handles() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let peer = (me + 1) % n;
    let seg = w.alloc_segment::<u64>(16)?;
    let put = w.put_nb(seg.at(peer, me as usize), &[100 + me as u64])?;
    let add = w.atomic_nb(seg.at(peer, 15), AtomicOp::FetchAdd(1))?;
    let call = w.call(peer, state_add, (me as u64, 1));
    let team = w.world_team()?;
    let sum = team.allreduce_nb(vec![me as u64], weft::ReduceOp::Sum)?;
    let t = std::thread::spawn(move || -> Res<(u64, u64)> {
        put.wait()?;
        add.wait()?;
        let r = call.wait()?;
        let s = sum.wait()?[0];
        // The team too: a collective on a thread of its own.
        let all = team.allreduce(&[1u64], weft::ReduceOp::Sum)?[0];
        ck(all == team.size() as u64, || format!("team of {} counted {all}", team.size()))?;
        Ok((r, s))
    });
    let (r, s) = t.join().map_err(|_| "handle thread panicked")??;
    ck(r == me as u64 + 1, || format!("call gave {r}"))?;
    ck(s == (0..n as u64).sum::<u64>(), || format!("allreduce gave {s}"))?;
    w.barrier()?;
    let from = (me + n - 1) % n;
    let got = seg.local().read(from as usize);
    ck(got == 100 + from as u64, || format!("put from {from} left {got}"))?;
    ck(seg.local().read(15) == 1, || "one fetch-add arrived".into())?;
    // An owned handle to the world, from a borrow (as inside a handler).
    let comm = w.arc();
    std::thread::spawn(move || comm.barrier()).join().map_err(|_| "barrier thread panicked")??;
    Ok(())
}

/// Per-rank state: made collectively, reached from AM handlers by id and from remote
/// functions as an argument; forged ids and wrong types are errors, not crashes.
pub(crate) fn dist_objects() -> Res {
    use weft::RpcExt;
    let mut b = World::builder();
    let found = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let a = acked.clone();
    let ack = b.handler("test.state.ack", move |_| {
        a.fetch_add(1, Ordering::SeqCst);
    });
    let f = found.clone();
    let bump = b.handler("test.state.bump", move |am| {
        match am.comm().dist_of::<AtomicU64>(am.args()[0]) {
            Ok(c) => {
                c.fetch_add(am.args()[1], Ordering::SeqCst);
            }
            Err(Error::NoSuchDist { .. }) => {
                f.fetch_add(1, Ordering::SeqCst);
            }
            Err(_) => {}
        }
        // Every message is answered once handled: the sender counts the answers.
        let _ = am.reply_short(ack, &[]);
    });
    let w = b.init()?;
    let (me, n) = (w.rank(), w.size());
    let peer = (me + 1) % n;
    ck(weft::current().is_none(), || "no world is current outside a remote function".into())?;
    let _first = w.dist(String::from("first"))?;
    let hits = w.dist(AtomicU64::new(0))?;
    ck(hits.id() == 1, || format!("second object has id {}", hits.id()))?;
    // AM: the id in the arguments; a forged id and a wrong type are counted, not applied.
    w.am_request_short(peer, bump, &[hits.id(), 10])?;
    w.am_request_short(peer, bump, &[999, 10])?;
    w.am_request_short(peer, bump, &[0, 10])?;
    w.wait_until(|| acked.load(Ordering::SeqCst) == 3)?;
    w.barrier()?;
    ck(hits.load(Ordering::SeqCst) == 10, || format!("counter reads {}", hits.load(Ordering::SeqCst)))?;
    ck(found.load(Ordering::SeqCst) == 2, || "both bad ids were refused".into())?;
    w.barrier()?;
    // RPC: the argument decodes into the target's instance; the function sees its world.
    let (before, ran_on) = w.call(peer, state_bump, (hits.clone(), 5)).wait()?;
    ck(ran_on == peer, || format!("ran in the world of rank {ran_on}"))?;
    ck(before >= 10, || format!("target's counter read {before}"))?;
    let back = w.call(peer, state_echo, (hits.clone(),)).wait()?;
    ck(back.id() == hits.id(), || format!("echo gave id {}", back.id()))?;
    ck(std::ptr::eq(&*back, &*hits), || "a returned Dist is the caller's own instance".into())?;
    let len = w.call(peer, state_text, (w.dist_of::<String>(0)?,)).wait()?;
    ck(len == 5, || format!("the target's text has {len} bytes"))?;
    // Forged: id 1 holds a counter, not a String.
    let forged = w.dist_of::<String>(1);
    ck(matches!(forged, Err(Error::NoSuchDist { id: 1, .. })), || format!("{forged:?}"))?;
    w.barrier()?;
    ck(hits.load(Ordering::SeqCst) == 15, || format!("counter reads {}", hits.load(Ordering::SeqCst)))?;
    // Ranks that make different objects are told, naming both.
    let e = if me == 0 { w.dist(1u32).map(drop) } else { w.dist(1u64).map(drop) };
    let text = e.err().map(|e| e.to_string()).unwrap_or_default();
    ck(text.contains("u32") && text.contains("u64"), || format!("mismatch said: {text:?}"))?;
    w.barrier()?;
    Ok(())
}

weft::remote! {
    /// Counts a post from `from` in the target's completion segment (object 0), after
    /// pulling its argument (a rendezvous: the function runs after the handler returned).
    fn wait_all_bump(data: weft::SerializeBuffer<u8>, from: u32) {
        if let Some(seg) = weft::current().and_then(|w| w.dist_of::<weft::Segment<u64>>(0).ok()) {
            seg.local().atomic(from as usize).fetch_add(data.len() as u64 / 100_000, Ordering::SeqCst);
        }
    }
}

weft::remote! {
    /// Counts a post from `from` after a round trip back to it (an `async` function, pending
    /// meanwhile: its request is held until it finishes).
    async fn wait_all_slow(from: u32) {
        use weft::RpcExt;
        let Some(w) = weft::current() else { return };
        if w.call(from, state_add, (1, 2)).await == Ok(3) {
            if let Ok(seg) = w.dist_of::<weft::Segment<u64>>(0) {
                seg.local().atomic(from as usize).fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

/// `wait_all`: when it returns, every AM (through the world and an endpoint) and every post
/// this rank sent has been handled at its target, though the handlers are slow and a peer
/// lied first with a forged "done" claim. Checked by reading the targets' counters with gets:
/// no barrier between.
pub(crate) fn wait_all_remote_completion() -> Res {
    use weft::RpcExt;
    let mut b = World::builder();
    let bump = b.handler("test.wait_all.bump", |am| {
        std::thread::sleep(Duration::from_micros(200));
        if let Ok(seg) = am.comm().dist_of::<weft::Segment<u64>>(0) {
            seg.local().atomic(am.src() as usize).fetch_add(1, Ordering::SeqCst);
        }
    });
    let w = b.init()?;
    let (me, n) = (w.rank(), w.size());
    let seg = w.dist(w.alloc_segment::<u64>(n as usize)?)?;
    // A lie: "I handled everything you will ever send me".
    let ok = w.handler_named("weft.done.ok").ok_or("no weft.done.ok handler")?;
    w.am_request_short((me + 1) % n, ok, &[u64::MAX])?;
    w.barrier()?;
    let per = 20u64;
    for r in (0..n).filter(|&r| r != me) {
        for _ in 0..per {
            w.am_request_short(r, bump, &[])?;
        }
        w.post(r, wait_all_bump, (weft::SerializeBuffer::from(vec![7u8; 100_000]), me))?;
        w.post(r, wait_all_slow, (me,))?;
    }
    {
        let mut set = w.endpoints(&weft::EndpointConfig::new(weft::EndpointPolicy::Dynamic, 1))?;
        let mut ep = set.endpoints().remove(0);
        for r in (0..n).filter(|&r| r != me) {
            ep.am_request_short(r, bump, &[])?;
        }
        ep.sync_nbi()?;
    }
    w.wait_all()?;
    for r in (0..n).filter(|&r| r != me) {
        let mut got = [0u64];
        w.get(seg.at(r, me as usize), &mut got)?;
        ck(got[0] == per + 3, || format!("rank {r} had handled {} of my {} requests", got[0], per + 3))?;
    }
    w.barrier()?;
    Ok(())
}

/// `wait_all` after an endpoint set was closed: the requests its slots carried stay counted
/// at their targets (their inboxes are gone), so the call ends instead of waiting for ever.
pub(crate) fn wait_all_after_endpoints_close() -> Res {
    let mut b = World::builder();
    let hits = std::sync::Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    let bump = b.handler("test.ep_close.bump", move |_| {
        h.fetch_add(1, Ordering::SeqCst);
    });
    let w = b.init()?;
    let (me, n) = (w.rank(), w.size());
    let next = (me + 1) % n;
    {
        let mut set = w.endpoints(&weft::EndpointConfig::new(weft::EndpointPolicy::Dynamic, 1))?;
        let mut ep = set.endpoints().remove(0);
        for _ in 0..3 {
            ep.am_request_short(next, bump, &[])?;
        }
        ep.sync_nbi()?;
        drop(ep);
        set.close()?;
    }
    w.barrier()?;
    w.am_request_short(next, bump, &[])?;
    let t = Instant::now();
    w.wait_all()?;
    ck(t.elapsed() < Duration::from_secs(5), || format!("wait_all took {:?}", t.elapsed()))?;
    w.barrier()?;
    let got = hits.load(Ordering::SeqCst);
    ck(got == 4, || format!("{got} AMs handled here, want 4"))
}
