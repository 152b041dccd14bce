//! `net` suite: weft on a network fabric beside libfabric's own `fi_pingpong` (Debian's
//! libfabric-bin), measured in the same run with the same provider and domain: rank 0 runs
//! `fi_pingpong`'s server and client between its own measurements, while rank 1 sleeps.
//!
//! Pairs, each the same amount of network work:
//! - a blocking 8 B put (complete when the data is at the target: one round trip) beside
//!   `fi_pingpong`'s 8 B round trip;
//! - an empty AM request/reply beside the same round trip;
//! - the bandwidth of 1 MiB puts issued one at a time, each complete before the next, beside
//!   `fi_pingpong`'s 1 MiB ping-pong bandwidth (bytes over one-way time: no completion trip);
//! - a blocking 8 B get beside the same round trip.
//!
//! Then weft alone, gets beside puts: floods of non-blocking puts (handles) and of implicit
//! gets (one NBI scope; all in flight, then all waited for) from 8 B to 4 MiB, each get flood
//! beside the put flood of its size, and the rate of 8 B implicit gets beside that of
//! blocking ones.
//!
//! Last, both ranks: an RPC echo of a 1 MiB and a 16 MiB `SerializeBuffer` (rank 0 calls,
//! rank 1 sends it back), zero copy (the buffer registered for the transfer and read by the
//! target with RMA) beside the same calls with every chunk copied into the sender's pool
//! first (`Rpc::set_zero_copy(false)`), rounds alternating.

use super::report::{median, ns_per_op, size_name, Row};
use super::Ctx;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const SMALL: u64 = 8;
const LARGE: u64 = 1 << 20;
/// Sizes of the flood rows.
const FLOOD_SIZES: [u64; 7] = [8, 512, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Bytes one flood moves (in 4 to `FLOOD_OPS` operations).
const FLOOD_BYTES: u64 = 32 << 20;
const FLOOD_OPS: u64 = 2000;
/// Alternations of weft and `fi_pingpong` runs; each figure is the median.
const ROUNDS: usize = 5;

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn fi_pingpong(provider: &str, domain: Option<&str>, bytes: u64, iters: u32) -> Command {
    let mut c = Command::new("fi_pingpong");
    c.args(["-p", provider, "-e", "rdm", "-I", &iters.to_string(), "-S", &bytes.to_string()]);
    if let Some(d) = domain {
        c.args(["-d", d]);
    }
    c.stdin(Stdio::null()).stderr(Stdio::piped()).stdout(Stdio::piped());
    c
}

/// Waits for `child` at most `limit`, killing it after that.
fn wait_output(mut child: Child, limit: Duration) -> Result<std::process::Output, String> {
    let start = Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("fi_pingpong did not finish in {} s", limit.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    child.wait_with_output().map_err(|e| e.to_string())
}

/// `fi_pingpong`'s µs per one-way transfer of `bytes` with its start-up left out: the slope
/// between a run of `iters` round trips and one of ten times as many.
/// A connection set-up that took much longer in the short run than in the long one (a busy
/// machine) leaves no slope: the pair is then run again, up to `TRIES` times in all.
fn pingpong_slope(provider: &str, domain: Option<&str>, bytes: u64, iters: u32) -> Result<f64, String> {
    const TRIES: usize = 4;
    let mut seen = vec![];
    for _ in 0..TRIES {
        let short = pingpong(provider, domain, bytes, iters)?;
        let long = pingpong(provider, domain, bytes, 10 * iters)?;
        if let Some(s) = slope(short, long, iters) {
            return Ok(s);
        }
        seen.push(format!("{short} and {long}"));
    }
    Err(format!(
        "fi_pingpong's {bytes} B runs took {} µs per transfer: no slope in {TRIES} tries",
        seen.join(", ")
    ))
}

/// Time per transfer from the reported per-transfer times of a run of `iters` round trips
/// (`short`) and one of `10 * iters` (`long`); each reports its total over 2 x its round trips.
fn slope(short: f64, long: f64, iters: u32) -> Option<f64> {
    let extra = long * f64::from(20 * iters) - short * f64::from(2 * iters);
    let slope = extra / f64::from(18 * iters);
    (slope > 0.0).then_some(slope)
}

/// One `fi_pingpong` run: µs per one-way transfer of `bytes`, as it reports it (its total
/// time, connection set-up included, over 2 x `iters` transfers).
fn pingpong(provider: &str, domain: Option<&str>, bytes: u64, iters: u32) -> Result<f64, String> {
    let port = free_port()?.to_string();
    let server = fi_pingpong(provider, domain, bytes, iters)
        .args(["-B", &port])
        .spawn()
        .map_err(|e| format!("cannot run fi_pingpong (apt-get install libfabric-bin): {e}"))?;
    let limit = Duration::from_secs(60);
    // The server needs a moment to listen: retry the client while it is refused.
    let start = Instant::now();
    let client = loop {
        let c = fi_pingpong(provider, domain, bytes, iters).args(["-P", &port, "127.0.0.1"]).spawn();
        let c = wait_output(c.map_err(|e| e.to_string())?, limit)?;
        if c.status.success() || start.elapsed() > Duration::from_secs(5) {
            break c;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let server = wait_output(server, Duration::from_secs(5));
    let text = String::from_utf8_lossy(&client.stdout);
    if !client.status.success() {
        return Err(format!(
            "fi_pingpong -p {provider} failed ({}): {}",
            client.status,
            String::from_utf8_lossy(&client.stderr).trim()
        ));
    }
    server?;
    // bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(6)?.parse::<f64>().ok())
        .next()
        .ok_or_else(|| format!("no figures in fi_pingpong's output: {text:?}"))
}

/// ns per call of `f` over `reps` calls, after `reps` untimed ones.
fn warm_ns_per_op(reps: u64, mut f: impl FnMut() -> weft::Result<()>) -> weft::Result<f64> {
    (0..reps).try_for_each(|_| f())?;
    ns_per_op(1, reps, f)
}

/// The provider and domain the ranks use, from the environment (set by `--provider`,
/// `--domain`).
fn provider_and_domain() -> (String, Option<String>) {
    let var = |v: &str| std::env::var(v).ok().filter(|s| !s.is_empty());
    (var("WEFT_OFI_PROVIDER").unwrap_or_else(|| "tcp".into()), var("WEFT_OFI_DOMAIN"))
}

pub fn run(ctx: &Ctx) -> Result<Vec<Row>, weft::Error> {
    let w = &ctx.world;
    let mut rows = vec![];
    if w.size() < 2 {
        return Ok(rows);
    }
    if w.info().fabric == "shm" {
        if w.rank() == 0 {
            eprintln!("weft bench net: the ranks use shared memory; run with --fabric ofi --provider tcp");
        }
        return Ok(rows);
    }
    let data = w.alloc_segment::<u8>(*FLOOD_SIZES.last().unwrap_or(&LARGE) as usize)?;
    let src = vec![3u8; *FLOOD_SIZES.last().unwrap_or(&LARGE) as usize];
    ctx.progress.note("net latency and bandwidth beside fi_pingpong");
    if w.rank() == 0 {
        let (provider, domain) = provider_and_domain();
        let target = data.at(1, 0);
        let h = &ctx.handlers;
        // weft and fi_pingpong alternate (rank 1 sleeps in the barrier meanwhile), so both
        // see the same machine conditions; each figure is the median of its rounds.
        let (mut put8, mut am, mut big, mut fi8, mut fi_big) = (vec![], vec![], vec![], vec![], vec![]);
        let mut get8 = vec![];
        let mut peer_error = None;
        for _ in 0..ROUNDS {
            // Each figure is taken warm, after as many untimed operations as it times: after
            // the seconds fi_pingpong ran, the idle rank 1 sleeps, and this machine's cores
            // take ~10 ms of traffic to answer at full speed again (fi_pingpong's slope
            // leaves its own start-up out too).
            put8.push(warm_ns_per_op(4000, || w.put(target, &src[..SMALL as usize]))?);
            am.push(warm_ns_per_op(4000, || {
                let want = h.pongs.load(Ordering::Relaxed) + 1;
                w.am_request_short(1, h.ping, &[])?;
                w.wait_until(|| h.pongs.load(Ordering::Acquire) >= want)
            })?);
            big.push(warm_ns_per_op(100, || w.put(target, &src[..LARGE as usize]))?);
            let mut one = [0u8; SMALL as usize];
            get8.push(warm_ns_per_op(4000, || w.get(target, &mut one))?);
            if peer_error.is_none() {
                let r = pingpong_slope(&provider, domain.as_deref(), SMALL, 1000)
                    .and_then(|s| Ok((s, pingpong_slope(&provider, domain.as_deref(), LARGE, 40)?)));
                match r {
                    Ok((s, l)) => {
                        fi8.push(s * 1e3);
                        fi_big.push(l * 1e3);
                    }
                    Err(e) => peer_error = Some(e),
                }
            }
        }
        if let Some(e) = &peer_error {
            eprintln!("weft bench net: no fi_pingpong figures: {e}");
        }
        let mut small = Row::new(
            "net",
            format!("put latency (blocking) {}", size_name(SMALL)),
            SMALL,
            median(put8),
            "ns",
        );
        let mut rt = Row::new("net", "empty AM request/reply round trip", 0, median(am), "ns");
        let mut get = Row::new(
            "net",
            format!("get latency (blocking) {}", size_name(SMALL)),
            SMALL,
            median(get8.clone()),
            "ns",
        );
        let mut bw = Row::new(
            "net",
            format!("put bandwidth, one at a time, {}", size_name(LARGE)),
            LARGE,
            LARGE as f64 / median(big),
            "GB/s",
        );
        if peer_error.is_none() {
            // fi_pingpong reports one-way time; a blocking put or an AM round trip is two ways.
            let (one_way_small, one_way_large) = (median(fi8), median(fi_big));
            small = small.vs("fi_pingpong round trip", 2.0 * one_way_small);
            get = get.vs("fi_pingpong round trip", 2.0 * one_way_small);
            rt = rt.vs("fi_pingpong round trip", 2.0 * one_way_small);
            bw = bw.vs("fi_pingpong bandwidth", LARGE as f64 / one_way_large);
        }
        rows.extend([small, rt, get, bw]);
        rows.extend(floods(w, target, &src, median(get8))?);
    }
    w.barrier()?;
    ctx.progress.note("net RPC echo, zero copy beside staged");
    rows.extend(rpc_echo(w)?);
    Ok(rows)
}

weft::remote! { fn net_echo(v: weft::SerializeBuffer<u8>) -> weft::SerializeBuffer<u8> { v } }

/// The RPC echo rows (see the module documentation); rank 0 returns them.
fn rpc_echo(w: &weft::World) -> weft::Result<Vec<Row>> {
    use weft::RpcExt;
    let rpc = weft::rpc::Rpc::of(w)?;
    let mut rows = vec![];
    for size in [1usize << 20, 16 << 20] {
        let calls = if size > 1 << 20 { 4 } else { 16 };
        let (mut zero, mut staged) = (vec![], vec![]);
        // A warm-up round of each, then the rounds.
        for round in 0..=ROUNDS {
            for on in [true, false] {
                rpc.set_zero_copy(on);
                w.barrier()?;
                if w.rank() != 0 {
                    continue;
                }
                // Fresh heap buffers (one the pool received would travel as an RMA chunk).
                let bufs: Vec<weft::SerializeBuffer<u8>> =
                    (0..calls).map(|i| vec![i as u8; size].into()).collect();
                let t = Instant::now();
                for (i, b) in bufs.into_iter().enumerate() {
                    let back = w.call(1, net_echo, (b,)).wait()?;
                    if back.len() != size || back[size - 1] != i as u8 {
                        return Err(weft::Error::Misuse("the RPC echo came back changed"));
                    }
                }
                let ns = t.elapsed().as_nanos() as f64 / calls as f64;
                if round > 0 {
                    if on { &mut zero } else { &mut staged }.push(ns);
                }
            }
        }
        rpc.set_zero_copy(true);
        w.barrier()?;
        if w.rank() == 0 {
            let name = format!("RPC echo, SerializeBuffer, zero copy, {}", size_name(size as u64));
            rows.push(Row::new("net", name, size as u64, median(zero), "ns").vs("staged", median(staged)));
        }
    }
    Ok(rows)
}

/// Operations in one flood of `size`-byte transfers.
fn flood_ops(size: u64) -> u64 {
    (FLOOD_BYTES / size.max(1)).clamp(4, FLOOD_OPS)
}

/// ns per byte of `ops` non-blocking puts of `src` to `target`, all issued, then all waited for.
fn put_flood(w: &weft::World, target: weft::GlobalPtr<u8>, src: &[u8], ops: u64) -> weft::Result<f64> {
    let t = Instant::now();
    let hs: Vec<_> = (0..ops).map(|_| w.put_nb(target, src)).collect::<Result<_, _>>()?;
    hs.into_iter().try_for_each(|h| h.wait())?;
    Ok(t.elapsed().as_nanos() as f64 / (ops * src.len() as u64) as f64)
}

/// ns per byte of implicit gets (an NBI scope: in flight at any size) of `size` bytes from
/// `from` into consecutive pieces of `dst` (`ops` of them), all issued, then all waited for.
fn get_flood(
    w: &weft::World,
    from: weft::GlobalPtr<u8>,
    dst: &mut [u8],
    size: usize,
    ops: u64,
) -> weft::Result<f64> {
    let t = Instant::now();
    w.nbi(|s| dst.chunks_mut(size).take(ops as usize).try_for_each(|c| s.get(from, c)))?;
    Ok(t.elapsed().as_nanos() as f64 / (ops * size as u64) as f64)
}

/// The flood rows (rank 0, to rank 1's `target`): each size's get flood beside its put flood
/// (rounds alternate the two; medians), and 8 B gets in flight beside blocking ones
/// (`get8_ns` per blocking get).
fn floods(w: &weft::World, target: weft::GlobalPtr<u8>, src: &[u8], get8_ns: f64) -> weft::Result<Vec<Row>> {
    let mut dst = vec![0u8; FLOOD_SIZES.iter().map(|&s| flood_ops(s) * s).max().unwrap_or(0) as usize];
    let mut rows = vec![];
    for size in FLOOD_SIZES {
        let (ops, n) = (flood_ops(size), size as usize);
        // A warm-up of each, then the rounds.
        put_flood(w, target, &src[..n], ops)?;
        get_flood(w, target, &mut dst, n, ops)?;
        let (mut puts, mut gets) = (vec![], vec![]);
        for _ in 0..ROUNDS {
            puts.push(put_flood(w, target, &src[..n], ops)?);
            gets.push(get_flood(w, target, &mut dst, n, ops)?);
        }
        let (put, get) = (median(puts), median(gets));
        // MB/s: readable from 8 B up.
        let name = |what: &str, how: &str| format!("{what} flood, {ops} {how}, {}", size_name(size));
        let (put_mbs, get_mbs) = (1e3 / put, 1e3 / get);
        rows.push(Row::new("net", name("put", "put_nb"), size, put_mbs, "MB/s"));
        rows.push(
            Row::new("net", name("get", "in an nbi scope"), size, get_mbs, "MB/s").vs("put flood", put_mbs),
        );
        if size == SMALL {
            let rate = |ns_per_op: f64| 1e3 / ns_per_op;
            rows.push(
                Row::new(
                    "net",
                    format!("get rate, implicit (nbi), {}", size_name(size)),
                    size,
                    rate(get * n as f64),
                    "M/s",
                )
                .vs("blocking get rate", rate(get8_ns)),
            );
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::slope;

    #[test]
    fn the_slope_leaves_a_fixed_start_up_out() {
        // 20 ms of connection set-up, then 7.5 µs per transfer.
        let reported = |iters: u32| (20_000.0 + 7.5 * f64::from(2 * iters)) / f64::from(2 * iters);
        let s = slope(reported(1000), reported(10_000), 1000).unwrap();
        assert!((s - 7.5).abs() < 1e-9, "{s}");
        // A long run no slower in total than the short one has no slope.
        assert_eq!(slope(10.0, 1.0, 1000), None);
    }
}
