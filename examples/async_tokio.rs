//! weft futures under tokio: 1000 calls spawned as tasks (the futures own their world, so
//! `tokio::spawn` takes them) to a rank that is busy outside weft for 300 ms. Its on-demand
//! progress thread answers them; the callers' executor sleeps while it waits instead of
//! spinning. Prints the time the calls took and the CPU the calling process used.
//!
//! Run: `cargo run --release -- run -n 2 -- target/release/examples/async_tokio`
//! (`WEFT_PROGRESS_THREAD=0` shows the alternative: the calls wait for the target's sleep
//! to end, and the executor spins).
use std::time::{Duration, Instant};
use weft::{remote, RpcExt};

remote! {
    fn square(x: u64) -> u64 { x * x }
}

/// CPU time this process has used (user + system), from /proc/self/stat.
fn cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest.split_whitespace().skip(11).take(2).filter_map(|x| x.parse::<u64>().ok()).sum();
    Duration::from_millis(ticks * 10)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let world = weft::World::init()?;
    let busy = Duration::from_millis(300);
    world.barrier()?;
    if world.rank() == 0 {
        // Computing: no call into weft for 300 ms.
        let t = Instant::now();
        while t.elapsed() < busy {
            std::hint::spin_loop();
        }
    } else {
        std::thread::sleep(Duration::from_millis(20));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build()?;
        let comm = world.arc();
        let (t0, c0) = (Instant::now(), cpu());
        let sum = rt.block_on(async move {
            let tasks: Vec<_> = (0..1000u64).map(|i| tokio::spawn(comm.call(0, square, (i,)))).collect();
            let mut sum = 0;
            for t in tasks {
                sum += t.await.expect("a call task panicked")?;
            }
            Ok::<u64, weft::Error>(sum)
        })?;
        let (wall, used) = (t0.elapsed(), cpu() - c0);
        assert_eq!(sum, (0..1000u64).map(|i| i * i).sum::<u64>());
        println!(
            "rank {}: 1000 calls to rank 0 (busy outside weft for {busy:?}) took {wall:?}, \
             this process used {used:?} of CPU",
            world.rank()
        );
    }
    world.barrier()?;
    Ok(())
}
