//! Four threads per rank, each on its own endpoint, put into the next rank's segment; then
//! every rank checks what arrived. Run: `weft run -n 2 -- target/release/examples/endpoints`.
use weft::{EndpointConfig, EndpointPolicy, World};

fn main() -> weft::Result<()> {
    const THREADS: usize = 4;
    let world = World::init()?;
    let seg = world.alloc_segment::<u64>(THREADS * 16)?;
    let next = (world.rank() + 1) % world.size();
    let mut set = world.endpoints(&EndpointConfig::new(EndpointPolicy::Dynamic, THREADS))?; // collective
    if world.rank() == 0 {
        println!("{}", set.resources()); // contexts, slots, queues, completions, locks, bytes
    }
    std::thread::scope(|s| {
        for mut ep in set.endpoints() {
            let seg = &seg;
            s.spawn(move || -> weft::Result<()> {
                for i in 0..1000 {
                    ep.put_nbi(seg.at(next, ep.index() * 16 + i % 16), &[i as u64])?;
                    // queued, 32 per publish
                }
                ep.sync_nbi() // everything visible at `next`
            });
        }
    });
    set.close()?; // collective: every rank's endpoints are done, receive paths released
                  // Slot k of each thread's 16 holds the last i < 1000 with i % 16 == k.
    for e in 0..THREADS * 16 {
        let want = (0..1000u64).rev().find(|i| i % 16 == (e % 16) as u64).unwrap_or(0);
        assert_eq!(seg.local().read(e), want, "rank {}: element {e}", world.rank());
    }
    println!(
        "rank {}: {} values from rank {}",
        world.rank(),
        THREADS * 16,
        (world.rank() + world.size() - 1) % world.size()
    );
    Ok(())
}
