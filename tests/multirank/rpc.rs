//! Remote functions: calls, posts, plain vectors, a small pool, malformed input.

use super::*;

weft::remote! {
    fn rpc_add(a: u64, b: u64) -> u64 { a + b }
}
weft::remote! {
    fn rpc_greet(name: String) -> String { format!("hello {name} from {}", weft::rpc::world_rank()) }
}
weft::remote! {
    fn rpc_sum(v: weft::SerializeBuffer<f64>) -> (u64, f64) { (v.len() as u64, v.iter().sum()) }
}
weft::remote! {
    /// Doubles every element in place and sends the vector back (an RmaVec both ways).
    fn rpc_double(v: weft::RmaVec<u64>) -> weft::RmaVec<u64> {
        let mut v = v;
        v.iter_mut().for_each(|x| *x *= 2);
        v
    }
}
weft::remote! {
    /// A plain function with a small argument and a result of any size: it runs in the
    /// call's handler, and a result with chunks goes back as a message of its own.
    fn rpc_make(len: u64) -> Vec<u8> { (0..len).map(|i| (i % 251) as u8).collect() }
}
weft::remote! {
    fn rpc_panics(x: u64) -> u64 { if x > 0 { panic!("asked to panic with {x}") } else { x } }
}
weft::remote! {
    async fn rpc_bump(by: u64) { POSTED.fetch_add(by, Ordering::SeqCst); }
}
pub(crate) static POSTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
weft::remote! {
    /// A plain function that tries to post: refused whatever its argument's size (small ones
    /// run in the call's handler, large ones from the hook).
    fn rpc_plain_posts(to: u32, _pad: Vec<u8>) -> String {
        use weft::RpcExt;
        let w = weft::current().expect("a remote function runs in a world");
        match w.post(to, rpc_bump, (0,)) {
            Ok(_) => "posted".into(),
            Err(e) => e.to_string(),
        }
    }
}
weft::remote! {
    /// The same as an `async` function: it may communicate.
    async fn rpc_async_posts(to: u32, _pad: Vec<u8>) -> String {
        use weft::RpcExt;
        let w = weft::current().expect("a remote function runs in a world");
        match w.post(to, rpc_bump, (0,)) {
            Ok(_) => "posted".into(),
            Err(e) => e.to_string(),
        }
    }
}

/// What a plain function may do does not depend on its input: posting from one fails with
/// the same clear error for small and large arguments; an async one may post.
pub(crate) fn rpc_plain_rules() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let peer = (me + 1) % n;
    for pad in [0usize, 1 << 20] {
        let r = w.call(peer, rpc_plain_posts, (me, vec![7u8; pad])).wait()?;
        ck(r.contains("plain remote function") && r.contains("async fn"), || {
            format!("a plain function posting with {pad} B of arguments: {r:?}")
        })?;
        let r = w.call(peer, rpc_async_posts, (me, vec![7u8; pad])).wait()?;
        ck(r == "posted", || format!("an async function posting with {pad} B of arguments: {r:?}"))?;
    }
    w.wait_all()?;
    w.barrier().map_err(Failure::from)
}

pub(crate) fn rpc_calls() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let peer = (me + 1) % n;
    // Eager: small arguments and results, to a peer and to self.
    for dst in [peer, me] {
        let r = w.call(dst, rpc_add, (me as u64, 40)).wait()?;
        ck(r == me as u64 + 40, || format!("add gave {r}"))?;
    }
    let g = weft::block_on(w.call(peer, rpc_greet, (format!("rank {me}"),)))?;
    ck(g == format!("hello rank {me} from {peer}"), || g.clone())?;
    // Rendezvous: large buffers pulled from the caller's memory, every size around the threshold.
    for len in [0usize, 1, 511, 512, 513, 4096, 100_000, 1 << 20] {
        let data: Vec<f64> = (0..len).map(|i| (i % 7) as f64).collect();
        let want: f64 = data.iter().sum();
        let buf = weft::SerializeBuffer::from(data);
        let (sent, res) = w.call_with(peer, rpc_sum, (buf.clone(),), None);
        sent.wait()?;
        ck(buf.is_unique(), || {
            format!("len {len}: the runtime still holds the buffer after the sent signal")
        })?;
        let (got_len, sum) = res.wait()?;
        ck(got_len == len as u64 && sum == want, || {
            format!("len {len}: got {got_len} elements summing to {sum}, want {want}")
        })?;
    }
    // Results of every size around the threshold and the medium limit from a function run in
    // the handler.
    for len in [0u64, 100, 4095, 4096, 70_000, 1 << 20] {
        let v = w.call(peer, rpc_make, (len,)).wait()?;
        ck(v.len() as u64 == len && v.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8), || {
            format!("made {len} bytes, got {} (or wrong bytes)", v.len())
        })?;
    }
    // RmaVec both ways, through the pools.
    let mut v = weft::RmaVec::<u64>::with_capacity(&w, 10)?;
    for i in 0..300_000u64 {
        v.push(i)?;
    }
    let back = w.call(peer, rpc_double, (v,)).wait()?;
    ck(back.len() == 300_000 && back.iter().enumerate().all(|(i, &x)| x == 2 * i as u64), || {
        "doubled vector differs".into()
    })?;
    // A panic comes back as an error; the target keeps serving.
    let e = w.call(peer, rpc_panics, (7,)).wait();
    ck(matches!(&e, Err(weft::Error::Remote(m)) if m.contains("asked to panic with 7")), || {
        format!("{e:?}")
    })?;
    ck(w.call(peer, rpc_panics, (0,)).wait()? == 0, || "no answer after a panic".into())?;
    // Posts: fire-and-forget, counted on the target.
    for _ in 0..100 {
        w.post(peer, rpc_bump, (1,))?;
    }
    w.wait_until(|| POSTED.load(Ordering::SeqCst) >= 100)?;
    w.barrier()?;
    ck(POSTED.load(Ordering::SeqCst) == 100, || format!("{} posts arrived", POSTED.load(Ordering::SeqCst)))
}

weft::remote! {
    /// Plain vectors of numbers both ways (blocks in the archive; chunks from the threshold).
    fn rpc_scale(v: Vec<f64>, w: Vec<i32>, b: Vec<u8>) -> (Vec<f64>, Vec<i32>, Vec<u8>) {
        (v.iter().map(|x| x * 2.0).collect(), w.into_iter().rev().collect(), b)
    }
}

/// Plain `Vec`s of numbers of every size around the threshold, to a peer and to self (run with
/// the default staging limit and with every chunk read in place).
///
/// Over libfabric this once hung in about one run in 5-15: a rank that had finished start-up
/// called a peer still allocating its RPC pool, the peer answered with a chunk left in place
/// (no pool yet to stage it into), the caller could not read it and dropped the result.
pub(crate) fn rpc_plain_vecs() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    for dst in [(me + 1) % n, me] {
        for len in [0usize, 1, 511, 512, 1024, 4096, 100_000, 1 << 20] {
            let v: Vec<f64> = (0..len).map(|i| i as f64 - 0.5).collect();
            let ints: Vec<i32> = (0..len as i32 / 2).map(|i| i * -3).collect();
            let bytes: Vec<u8> = (0..len * 3).map(|i| (i % 253) as u8).collect();
            let (v2, i2, b2) = w.call(dst, rpc_scale, (v.clone(), ints.clone(), bytes.clone())).wait()?;
            ck(v2.len() == len && v2.iter().zip(&v).all(|(a, b)| *a == b * 2.0), || {
                format!("len {len}: f64s differ")
            })?;
            ck(i2.iter().rev().eq(ints.iter()), || format!("len {len}: i32s differ"))?;
            ck(b2 == bytes, || format!("len {len}: bytes differ"))?;
        }
    }
    w.barrier().map_err(Failure::from)
}

weft::remote! {
    /// A vector of `n` bytes.
    fn rpc_make_bytes(n: u64) -> Vec<u8> {
        (0..n).map(|i| i as u8).collect()
    }
}

/// With a registered pool too small for a chunk (`WEFT_RPC_POOL_MIB=1`, 2 MiB vectors): where
/// the fabric reads peer memory or registers the chunk for the transfer (libfabric, from
/// `WEFT_OFI_ZCOPY_KIB` up) the target reads it in place and the call works; where it can
/// only copy (libfabric with `WEFT_OFI_ZCOPY_KIB` above the size), the call fails with an
/// error that names the pool, both for an argument and for a result, instead of a descriptor
/// the target cannot read (before: a dropped result and a caller waiting for ever). The target
/// keeps serving.
pub(crate) fn rpc_small_pool() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let peer = (w.rank() + 1) % w.size();
    let big: Vec<f64> = (0..1 << 18).map(|i| i as f64).collect();
    let ints: Vec<i32> = vec![1, 2, 3];
    let sent = w.call(peer, rpc_scale, (big.clone(), ints.clone(), vec![])).wait();
    let made = w.call(peer, rpc_make_bytes, (2u64 << 20,)).wait();
    let copy_only = w.info().fabric == "ofi" && std::env::var("WEFT_OFI_ZCOPY_KIB").is_ok_and(|k| k != "0");
    if !copy_only {
        let (v, _, _) = sent?;
        ck(v.iter().zip(&big).all(|(a, b)| *a == b * 2.0), || "in-place argument differs".into())?;
        let m = made?;
        ck(m.len() == 2 << 20 && m[1000] == 1000u32 as u8, || "in-place result differs".into())?;
    } else {
        ck(matches!(&sent, Err(weft::Error::Encode(m)) if m.contains("WEFT_RPC_POOL_MIB")), || {
            format!("argument larger than the pool: {sent:?}")
        })?;
        ck(
            matches!(&made, Err(weft::Error::Remote(m)) if m.contains("result could not be sent") && m.contains("WEFT_RPC_POOL_MIB")),
            || format!("result larger than the pool: {:?}", made.as_ref().map(Vec::len)),
        )?;
    }
    let (v, i, _) = w.call(peer, rpc_scale, (vec![1.5], ints.clone(), vec![])).wait()?;
    ck(v == [3.0] && i == [3, 2, 1], || "no answer after a refused transfer".into())?;
    w.barrier().map_err(Failure::from)
}

/// Forged RPC messages, sent as raw AMs: each is rejected with a clear error and counted, and
/// the target keeps serving.
pub(crate) fn rpc_bad_input() -> Res {
    use weft::rpc::{archive, proto, RemoteFn, Rpc};
    use weft::RpcExt;
    let w = World::init()?;
    let (me, n) = (w.rank(), w.size());
    let peer = (me + 1) % n;
    let rpc = Rpc::of(&w)?;
    let h = w.handler_named("weft.rpc.msg").ok_or("no RPC message handler")?;
    let add_id = weft::rpc::fn_id(rpc_add::NAME);
    let wrong_args = archive::encode(&("not two numbers",), 4096, &archive::NoPool).map_err(|e| e.0)?.index;
    // A rendezvous descriptor: no chunks but one declaring 2^60 bytes (the index inline).
    let mut oversized = 1u64.to_le_bytes().to_vec();
    oversized.push(1);
    oversized.extend_from_slice(&0u64.to_le_bytes());
    oversized.push(0);
    for word in [1u64 << 60, 0x1000, 0] {
        oversized.extend_from_slice(&word.to_le_bytes());
    }
    let head = |kind, mode, fn_id, call_id, ack_id| {
        let (w, n) = proto::Header { kind, mode, fn_id, call_id, ack_id }.encode();
        w[..n].to_vec()
    };
    let (call, eager, rdv) = (proto::CALL, proto::EAGER, proto::RENDEZVOUS);
    let sends: [(Vec<u64>, &[u8]); 7] = [
        (head(call, eager, 0xdead_beef, 900_001, 0), &[]), // unknown function
        (head(proto::POST, eager, 0xdead_beef, 0, 0), &[]), // unknown function, posted
        (head(call, eager, add_id, 900_002, 0), &wrong_args), // type mismatch
        (head(call, rdv, add_id, 900_003, 5), &oversized), // oversized declared length
        (head(call, rdv, add_id, 900_004, 6), &[1, 2, 3]), // truncated descriptor
        (vec![call, add_id, 900_005, 0, 0, 0], &[]),       // too many words for a header
        (vec![9, add_id, 900_006], &[]),                   // unknown kind
    ];
    for (args, payload) in &sends {
        w.am_request_medium(peer, h, args, payload)?;
    }
    // Messages between two ranks arrive in order: this call is served after all of the above.
    let r = w.call(peer, rpc_add, (2, 3)).wait()?;
    ck(r == 5, || format!("add after forged messages gave {r}"))?;
    w.barrier()?;
    let s = &rpc.stats;
    let unknown = s.unknown_function.load(Ordering::SeqCst);
    ck(unknown == 2, || format!("{unknown} unknown-function messages counted, want 2"))?;
    // Here: mismatch, oversized, truncated, two bad headers (5); the errors answering this
    // rank's four forged calls, whose ids it never issued (4); the acknowledgements of its
    // two forged rendezvous calls, whose ack ids it never issued either (2).
    w.wait_until(|| s.malformed.load(Ordering::SeqCst) >= 11)?;
    let malformed = s.malformed.load(Ordering::SeqCst);
    ck(malformed == 11, || format!("{malformed} malformed messages counted, want 11"))?;
    w.barrier().map_err(Failure::from)
}

weft::remote! {
    /// Sums of a byte buffer and of a vector of numbers.
    fn rpc_sums(b: weft::SerializeBuffer<u8>, v: Vec<f64>) -> (u64, f64) {
        (b.iter().map(|&x| x as u64).sum(), v.iter().sum())
    }
}

/// Zero copy on every fabric: a 16 MiB `SerializeBuffer` and a 16 MiB `Vec<f64>` go to the
/// peer and a 16 MiB vector comes back without a byte copied by the RPC layer of either sender
/// (read in place on shared memory; registered for the transfer and read with RMA over
/// libfabric, where every registration is released once the target acknowledged its read).
/// Vectors freed and allocated again (likely at the same address) carry their new contents.
pub(crate) fn rpc_zero_copy() -> Res {
    use weft::RpcExt;
    let w = World::init()?;
    let rpc = weft::rpc::Rpc::of(&w)?;
    let peer = (w.rank() + 1) % w.size();
    let copied = || rpc.stats.copied_bytes.load(Ordering::Relaxed);
    let before = (copied(), w.stats().fabric);
    const N: usize = 16 << 20;
    for round in 0..3u64 {
        let bytes: Vec<u8> = (0..N).map(|i| (i as u64 * (round + 1) % 251) as u8).collect();
        let want_b: u64 = bytes.iter().map(|&x| x as u64).sum();
        let v: Vec<f64> = (0..N / 8).map(|i| (i % 1000) as f64 + round as f64).collect();
        let want_v: f64 = v.iter().sum();
        let (sb, sv) = w.call(peer, rpc_sums, (weft::SerializeBuffer::from(bytes), v)).wait()?;
        ck(sb == want_b && sv == want_v, || {
            format!("round {round}: sums {sb} {sv}, sent {want_b} {want_v}")
        })?;
    }
    let back = w.call(peer, rpc_make_bytes, (N as u64,)).wait()?;
    ck(back.len() == N && back[N - 1] == (N - 1) as u8, || "16 MiB result differs".into())?;
    w.barrier()?;
    ck(copied() == before.0, || format!("the RPC layer copied {} bytes to send", copied() - before.0))?;
    // Registrations are released when the target's acknowledgement arrives.
    let t0 = std::time::Instant::now();
    while w.stats().fabric.released != w.stats().fabric.registrations && t0.elapsed().as_secs() < 10 {
        w.poll()?;
    }
    let s = w.stats().fabric;
    let made = s.registrations - before.1.registrations;
    ck(s.released == s.registrations, || format!("{s:?}: registrations left open"))?;
    if w.info().fabric == "ofi" {
        ck(made >= 6, || format!("{made} registrations for 6 chunks sent"))?;
    }
    w.barrier().map_err(Failure::from)
}
