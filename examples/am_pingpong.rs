//! Active-message ping-pong: rank 0 sends requests with a medium payload, rank 1's handler
//! replies with the payload's length, rank 0 measures the round trip.
//! Run: `cargo run --release -- run -n 2 -- target/release/examples/am_pingpong`
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

fn main() -> Result<(), weft::Error> {
    let pongs = Arc::new(AtomicU64::new(0));
    let seen = pongs.clone();
    let mut b = weft::World::builder();
    let pong = b.handler("pong", move |am| {
        assert_eq!(am.args()[0], 100);
        seen.fetch_add(1, Ordering::Release);
    });
    let ping =
        b.handler("ping", move |am| am.reply_short(pong, &[am.payload().len() as u64]).expect("reply"));
    let world = b.init()?;
    if world.rank() == 0 && world.size() > 1 {
        let payload = [7u8; 100];
        let iters = 10_000;
        let t = std::time::Instant::now();
        for i in 1..=iters {
            world.am_request_medium(1, ping, &[], &payload)?;
            world.wait_until(|| pongs.load(Ordering::Acquire) == i)?;
        }
        println!("AM round trip with 100 B: {:.0} ns", t.elapsed().as_nanos() as f64 / iters as f64);
    }
    world.barrier()
}
