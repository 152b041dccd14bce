//! A rank's life: idle waits, early exits, dead and vanished peers, threads and progress.

use super::*;

/// CPU time (user + system) this process has used so far, from `/proc/self/stat`.
pub(crate) fn cpu_time() -> Result<Duration, String> {
    let stat = std::fs::read_to_string("/proc/self/stat").map_err(|e| e.to_string())?;
    // Fields after the command name (which may hold spaces) end with ")"; utime and stime are
    // the 14th and 15th fields, in clock ticks.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).ok_or("no ) in /proc/self/stat")?;
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(2).filter_map(|x| x.parse().ok()).collect();
    // Linux reports these in USER_HZ, which is 100 on every architecture it runs on.
    let ticks = f.iter().sum::<u64>();
    Ok(Duration::from_millis(ticks * 10))
}

/// While rank 0 works for 2 s without communicating, the others wait in a barrier: they must
/// sleep, not hold a core (a spinning waiter would take the core its peers need, the lesson of
/// runtimes whose idle ranks busy-poll).
pub(crate) fn idle_waits_sleep() -> Res {
    let w = World::init()?;
    w.barrier()?;
    if w.rank() == 0 {
        std::thread::sleep(Duration::from_secs(2));
        return w.barrier().map_err(Failure::from);
    }
    let (t0, c0) = (Instant::now(), cpu_time()?);
    w.barrier()?;
    let (wall, cpu) = (t0.elapsed(), cpu_time()? - c0);
    ck(wall >= Duration::from_millis(1500), || format!("the barrier ended after {wall:?}"))?;
    ck(cpu < wall / 5, || format!("waiting {wall:?} in a barrier used {cpu:?} of CPU"))
}

/// Rank 1 leaves right after start-up; the others must fail their barrier, not hang.
pub(crate) fn early_exit() -> Res {
    let w = World::init()?;
    if w.rank() == 1 {
        return Ok(());
    }
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    let r = w.barrier();
    ck(matches!(&r, Err(Error::PeerFailed { .. })), || format!("barrier with a departed rank: {r:?}"))?;
    ck(t.elapsed() < Duration::from_secs(3), || format!("detection took {:?}", t.elapsed()))
}

/// Rank 1 vanishes without finalizing (as with a lost node; its exit status 0 does not make the
/// launcher stop the job): the others' barrier fails within a few seconds, on any host.
pub(crate) fn vanished_rank() -> Res {
    let w = World::init()?;
    let seg = w.alloc_segment::<u64>(1 << 13)?;
    w.barrier()?;
    if w.rank() == 1 {
        // Long enough for rank 0's gets to be in flight, then gone without running
        // destructors: the World is never finalized.
        std::thread::sleep(Duration::from_millis(300));
        std::process::exit(0);
    }
    let mut vec_get = w.get_vec_nb(seg.at(1, 0), 1 << 13)?;
    let mut buf = [0u64; 4];
    let mut small_get = w.get_nb(seg.at(1, 0), &mut buf)?;
    let t = Instant::now();
    let r = w.barrier();
    ck(matches!(&r, Err(Error::PeerFailed { .. })), || format!("barrier with a vanished rank: {r:?}"))?;
    ck(t.elapsed() < Duration::from_secs(5), || format!("detection took {:?}", t.elapsed()))?;
    // Shared memory still maps what the rank left and may give it; a network fails the gets.
    // A failure stays: asking the handle again never hands out the partly written buffer.
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match vec_get.test() {
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(None) => return Err("a get_vec_nb from a vanished rank never ended".into()),
            Ok(Some(v)) => break Ok(v.len()),
            Err(e) => break Err(e),
        }
    };
    if let Err(e) = &first {
        let again = vec_get.test();
        ck(again.is_err(), || format!("GetVec failed ({e}), then test gave {again:?}"))?;
        let awaited = weft::block_on(&mut vec_get);
        ck(awaited.is_err(), || {
            format!("GetVec failed ({e}), then .await gave {:?}", awaited.map(|v| v.len()))
        })?;
    }
    let first = loop {
        match small_get.test() {
            Ok(false) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(1)),
            Ok(false) => return Err("a get_nb from a vanished rank never ended".into()),
            Ok(true) => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    if let Err(e) = &first {
        let again = small_get.test();
        ck(again.is_err(), || format!("get_nb failed ({e}), then test gave {again:?}"))?;
    }
    Ok(())
}

/// A wake-up (`notify`) sent to a rank that has already finalized and exited returns at once:
/// the peer reads nothing more. Over libfabric it was retried until the operation timeout
/// (60 s per peer), which is how a rank preempted between a collective's last put and its
/// wake-up hung after the others had left.
pub(crate) fn notify_after_the_peer_left() -> Res {
    let w = World::init()?;
    w.barrier()?;
    if w.rank() == 0 {
        return Ok(()); // finalizes and exits
    }
    // Time for rank 0 to finalize and exit (if it has not, the wake-ups below simply reach it).
    std::thread::sleep(Duration::from_millis(1500));
    let t = Instant::now();
    for _ in 0..3 {
        w.notify(0)?;
    }
    ck(t.elapsed() < Duration::from_secs(10), || {
        format!("3 wake-ups to a rank that left took {:?}", t.elapsed())
    })
}

/// Rank 1 is killed with SIGKILL while the others wait on it (checked by the driver).
pub(crate) fn killed_rank() -> Res {
    let w = World::init()?;
    let _seg = w.alloc_segment::<u8>(1 << 20)?;
    w.barrier()?;
    if w.rank() == 1 {
        // The kill's time on the host's monotonic clock, for the harness to measure from.
        println!("KILLING-MYSELF at {}", weft::fabric::os::now_ns());
        weft::fabric::os::kill(std::process::id(), 9);
    }
    let _ = w.barrier();
    std::thread::sleep(Duration::from_secs(30));
    Ok(())
}

/// A rank that computes without polling still serves AMs and RMA through its progress thread;
/// several threads of each rank communicate at once.
pub(crate) fn threads_and_progress() -> Res {
    let mut b = World::builder();
    let p = am_world(&mut b);
    let w = b.progress(weft::Progress::Always).init()?;
    let seg = w.alloc_segment::<u64>(1024)?;
    LONG_SEG.set(seg.at(0, 0)).ok();
    let (me, n) = (w.rank(), w.size());
    let counter = w.alloc_segment::<u64>(1)?;
    let threads = 3u64;
    std::thread::scope(|s| -> Res {
        let mut hs = vec![];
        for t in 0..threads {
            let (w, seg, counter, p) = (&w, &seg, &counter, &p);
            hs.push(s.spawn(move || -> Res {
                for i in 0..2000u64 {
                    let to = ((me as u64 + 1 + i) % n as u64) as u32;
                    w.fetch_add(counter.at(0, 0), 1)?;
                    w.put(seg.at(to, (me as usize * threads as usize + t as usize) % 1024), &[i])?;
                    w.am_request_short(to, p.short, &[1])?;
                }
                Ok(())
            }));
        }
        hs.into_iter().try_for_each(|h| h.join().map_err(|_| "thread panicked".to_string())?)
    })?;
    let want = threads * 2000;
    w.wait_until(|| p.replies.load(Ordering::Acquire) == want)?;
    w.barrier()?;
    // Rank 0 now computes without any weft call; the others' requests are served by its
    // progress thread.
    if me == 0 {
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(500) {
            std::hint::black_box(t.elapsed());
        }
    } else {
        for _ in 0..500 {
            let before = p.replies.load(Ordering::Acquire);
            w.am_request_short(0, p.short, &[1])?;
            w.wait_until(|| p.replies.load(Ordering::Acquire) > before)?;
        }
    }
    w.barrier()?;
    let total = w.atomic_load(counter.at(0, 0))?;
    // Rank 0's memory must outlive the others' reads (it goes with rank 0 on a network).
    w.barrier()?;
    ck(total == threads * 2000 * n as u64, || format!("counter {total}"))
}

// ---------------------------------------------------------------- rpc

/// A flag set by a put and `notify` just before the waiter announced its sleep wakes it: the
/// sleep checks the wait's condition again once announced. Rank 0's test, once its wait has
/// reached its longest sleeps, has rank 1 set the flag and notify, waits for that, and still
/// answers "not yet" (as a load racing the put can): where the sleep did not check again,
/// each wait here lasted one whole sleep (2 ms) after the notify.
pub(crate) fn notify_before_sleep() -> Res {
    let w = World::init()?;
    let me = w.rank();
    if !w.info().caps.load_store {
        // A notify there is a message the sleep sees; and rank 0's test below, spinning until
        // rank 1's put lands, would stop the progress such puts need.
        return Ok(w.barrier()?);
    }
    // [data flag, go, notified] on every rank.
    let flags = w.alloc_segment::<u64>(3)?;
    let word = |i: usize| flags.local().atomic(i).load(Ordering::Acquire);
    let mut late = vec![];
    for round in 1..=5u64 {
        w.barrier()?;
        if me == 0 {
            let start = Instant::now();
            let mut asked = false;
            w.wait_until(|| {
                if start.elapsed() < Duration::from_millis(20) {
                    return false;
                }
                if !asked {
                    asked = true;
                    if w.put(flags.at(1, 1), &[round]).is_err() {
                        return true;
                    }
                    while word(2) < round {
                        std::hint::spin_loop();
                    }
                    return false;
                }
                word(0) >= round
            })?;
            late.push(weft::fabric::os::now_ns().saturating_sub(flags.local().read(0) >> 8) / 1000);
        } else if me == 1 {
            w.wait_until(|| word(1) >= round)?;
            // The stamp, and the round in the low byte: the flag reads as at least `round`.
            let stamp = weft::fabric::os::now_ns() << 8;
            w.put(flags.at(0, 0), &[stamp | round])?;
            w.notify(0)?;
            w.put(flags.at(0, 2), &[round])?;
            // Nothing more to rank 0 for a while (its barrier's message would wake it).
            std::thread::sleep(Duration::from_millis(10));
        }
        w.barrier()?;
    }
    if me == 0 {
        late.sort_unstable();
        ck(late[2] < 1000, || format!("waits ended {late:?} us after the notify"))?;
    }
    Ok(w.barrier()?)
}
