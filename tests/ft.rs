//! NAS FT verification through the launcher: classes S and W, every variant and model, with
//! 1, 2 and 4 ranks. Each rank is this test executable with `WEFT_FT_CASE` naming the run.

mod common;

use common::{Failure, Res};

use std::process::{Command, Output};
use std::sync::Arc;
use weft_ft::exchange::{Inbox, Mailbox, Pattern, Shape, Transport, TwoSided, POINT};
use weft_ft::local_fft::C64;
use weft_ft::{Class, Ft, Model, Options, Variant, Verification};

/// One rank: run FT, check the checksums against NPB's and the message pattern against the
/// variant's.
fn rank(case: &str) -> Res {
    let words: Vec<&str> = case.split_whitespace().collect();
    let (class, variant, model, pad) = match words[..] {
        [c, v, m] => (c, v, m, "0"),
        [c, v, m, pad] => (c, v, m, pad),
        _ => return Err(format!("bad case {case:?}").into()),
    };
    let (class, variant, model): (Class, Variant, Model) = (class.parse()?, variant.parse()?, model.parse()?);
    let pad = pad.parse().map_err(|_| format!("bad padding {pad:?}"))?;
    let mut b = weft::World::builder();
    let ft = Ft::register(&mut b);
    let world = b.init().map_err(|e| Failure(e.to_string()))?;
    let opts = Options { pad, ..Options::new(class, variant, model) };
    let report = ft.run(&world, &opts).map_err(|e| Failure(e.to_string()))?;
    if report.verification != Verification::Successful {
        return Err(
            format!("verification {:?}: checksums {:?}", report.verification, report.checksums).into()
        );
    }
    // Messages to other ranks per transform and rank: 1 (exchange), one per plane (slabs),
    // one per plane and column (pencils), to each of the P - 1 others.
    let [nx, ny, nz] = class.dims();
    let p = world.size() as usize;
    let per_peer = |a: usize, c: usize| match variant {
        Variant::Exchange => 1,
        Variant::Slabs => c / p,
        Variant::Pencils => c / p * a,
    };
    let transforms = class.iterations();
    let want = ((per_peer(nx, nz) + transforms * per_peer(nz, ny)) * (p - 1)) as u64;
    if report.messages_per_rank != want {
        return Err(format!("{} messages per rank, expected {want}", report.messages_per_rank).into());
    }
    let bytes = (class.points() / p / p * (p - 1) * POINT * (transforms + 1)) as u64;
    if report.bytes_per_rank != bytes {
        return Err(format!("{} bytes per rank, expected {bytes}", report.bytes_per_rank).into());
    }
    Ok(world.barrier()?)
}

/// Two ranks: rank 1 forges two-sided messages to rank 0 (an index past the posted ones, a
/// duplicate, a wrong argument count); each must end rank 0's wait with a clear error and
/// write nothing. Then a real message of three fragments must arrive intact, also with its
/// fragments in reverse order; a fragment off a boundary is refused.
fn forged_messages() -> Res {
    let mut b = weft::World::builder();
    let mailbox = Mailbox::register(&mut b);
    let world = b.init()?;
    let me = world.rank() as usize;
    let shape = Shape { a: 128, b: 64, c: 4, ranks: 2, me };
    let points = shape.local_points();
    let inbox = Arc::new(Inbox::new(world.alloc_segment::<u8>(Inbox::bytes(points))?, points));
    let mut xport = TwoSided::new(world.arc(), mailbox.clone(), inbox.clone());
    let two = Pattern { count: 2, unit: points / 2 / 2 };
    let one = Pattern { count: 1, unit: points / 2 };
    let h = mailbox.handler();
    let forge = |args: &[u64], len: usize| {
        world.am_request_medium(0, h, args, &vec![7u8; len]).map_err(Failure::from)
    };
    let expect_error = |r: Result<(), weft_ft::Error>, what: &str| -> Res {
        match r {
            Err(e) if e.to_string().contains(what) => Ok(()),
            other => Err(format!("expected an error saying {what:?}, got {other:?}").into()),
        }
    };
    let untouched = |epoch: u64| -> Res {
        let mut got = vec![1u8; points * POINT];
        inbox.view().copy_out(inbox.base(epoch), &mut got);
        if got.iter().all(|&b| b == 0) {
            Ok(())
        } else {
            Err(format!("epoch {epoch}: bytes written").into())
        }
    };
    let unit = 1024;
    for (epoch, args, what) in
        [(1u64, vec![1u64, 5, 0], "malformed"), (2, vec![2, 0, 0], "twice"), (3, vec![3], "arguments")]
    {
        if me == 0 {
            xport.begin(epoch, shape, two).map_err(|e| Failure(e.to_string()))?;
            expect_error(xport.finish(), what)?;
            if epoch != 2 {
                untouched(epoch)?;
            }
        } else if epoch == 2 {
            // A whole fragment (or message), twice.
            let len = world.caps().am_max_medium.max(16).min(two.unit * POINT);
            forge(&args, len)?;
            forge(&args, len)?;
        } else {
            forge(&args, unit)?;
        }
        world.barrier()?;
    }
    // A real message, larger than a medium AM.
    let data: Vec<C64> = (0..one.unit).map(|i| C64::new(i as f64, -(i as f64))).collect();
    xport.begin(4, shape, one).map_err(|e| Failure(e.to_string()))?;
    if me == 1 {
        xport.send(0, 0, &data).map_err(|e| Failure(e.to_string()))?;
    } else {
        xport.finish().map_err(|e| Failure(e.to_string()))?;
        let mut got = vec![C64::default(); one.unit];
        let at = inbox.message_at(4, &shape, &one, 1, 0);
        inbox.view().copy_out(at, bytemuck::cast_slice_mut(&mut got));
        if got != data {
            return Err("a fragmented message arrived changed".into());
        }
    }
    world.barrier()?;
    // The same message with its fragments in reverse order (active messages are not
    // ordered: over libfabric two threads may deliver one source's AMs either way round),
    // then one fragment off a boundary.
    let frag = world.caps().am_max_medium.max(16);
    let bytes: &[u8] = bytemuck::cast_slice(&data);
    for (epoch, off_boundary) in [(5u64, false), (6, true)] {
        xport.begin(epoch, shape, one).map_err(|e| Failure(e.to_string()))?;
        if me == 1 {
            for (k, piece) in bytes.chunks(frag).enumerate().rev() {
                let at = (k * frag + usize::from(off_boundary && k == 0)) as u64;
                world.am_request_medium(0, h, &[epoch, 0, at], piece)?;
            }
        } else if off_boundary {
            expect_error(xport.finish(), "malformed")?;
        } else {
            xport.finish().map_err(|e| Failure(e.to_string()))?;
            let mut got = vec![C64::default(); one.unit];
            inbox
                .view()
                .copy_out(inbox.message_at(epoch, &shape, &one, 1, 0), bytemuck::cast_slice_mut(&mut got));
            if got != data {
                return Err("a message whose fragments came in reverse order arrived changed".into());
            }
        }
        world.barrier()?;
    }
    Ok(())
}

/// 20 FT runs in one process (every variant and model in turn): each verifies, and segments
/// and resident memory stay flat from one round to the next.
fn repeated_runs() -> Res {
    let mut b = weft::World::builder();
    let ft = Ft::register(&mut b);
    let world = b.init().map_err(|e| Failure(e.to_string()))?;
    let combos: Vec<(Variant, Model)> =
        Variant::ALL.iter().flat_map(|&v| Model::ALL.iter().map(move |&m| (v, m))).collect();
    // The most segments and KiB held (segment pages and heap in use) after any run of the
    // first two rounds: later runs must not hold more. Some variants keep buffers for the
    // next run, so later runs are compared with the peak.
    let mut peak = (0, 0);
    for run in 0..20 {
        let (variant, model) = combos[run % combos.len()];
        let report =
            ft.run(&world, &Options::new(Class::S, variant, model)).map_err(|e| Failure(e.to_string()))?;
        if report.verification != Verification::Successful {
            return Err(format!("run {run} ({variant} {model}): {:?}", report.verification).into());
        }
        world.barrier()?;
        let now = (world.info().segments.len(), common::held_kib()?);
        if run < 2 * combos.len() {
            peak = (peak.0.max(now.0), peak.1.max(now.1));
        } else if now.0 > peak.0 || now.1 > peak.1 + 256 {
            return Err(format!(
                "run {run} ({variant} {model}): {} segments, {} KiB held; at most {} and {} KiB in the first {} runs",
                now.0,
                now.1,
                peak.0,
                peak.1,
                2 * combos.len()
            )
            .into());
        }
    }
    Ok(world.barrier()?)
}

fn launch(case: &str, n: u32) -> Output {
    launch_with(case, n, &[])
}

fn launch_with(case: &str, n: u32, env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_weft"))
        .args(["run", "-n", &n.to_string(), "--timeout", "300", "--"])
        .arg(std::env::current_exe().expect("test executable"))
        .env("WEFT_FT_CASE", case)
        .envs(env.iter().copied())
        .output()
        .expect("start weft run")
}

fn verify(case: String, n: u32) -> Result<(), libtest_mimic::Failed> {
    verify_with(case, n, &[])
}

fn verify_with(case: String, n: u32, env: &[(&str, &str)]) -> Result<(), libtest_mimic::Failed> {
    let out = launch_with(&case, n, env);
    if !out.status.success() {
        return Err(
            format!("FT {case} with {n} ranks failed ({})\n{}", out.status, common::text(&out)).into()
        );
    }
    Ok(())
}

/// 3 ranks cannot split class S's 64 planes: every rank says so, and the job fails.
fn ranks_must_divide() -> Result<(), libtest_mimic::Failed> {
    let out = launch("S pencils one-sided", 3);
    let said = common::text(&out);
    if out.status.success() || !said.contains("divides every dimension") {
        return Err(format!("class S on 3 ranks was not refused clearly\n{said}").into());
    }
    Ok(())
}

fn main() {
    if let Ok(case) = std::env::var("WEFT_FT_CASE") {
        common::exit_with(match case.as_str() {
            "forged" => forged_messages(),
            "repeated" => repeated_runs(),
            _ => rank(&case),
        });
    }
    let args = libtest_mimic::Arguments::from_args();
    let mut trials = vec![];
    for class in [Class::S, Class::W] {
        for variant in Variant::ALL {
            for model in Model::ALL {
                for n in [1, 2, 4] {
                    let case = format!("{class} {variant} {model}");
                    let name = format!("ft_{class}_{variant}_{model}_{n}ranks").replace('-', "_");
                    trials.push(libtest_mimic::Trial::test(name, move || verify(case, n)));
                }
            }
        }
    }
    // Padded rows (an odd padding, so no row starts cache-line aligned).
    for variant in Variant::ALL {
        for (model, n) in [(Model::OneSided, 2), (Model::TwoSided, 4)] {
            let case = format!("W {variant} {model} 3");
            let name = format!("ft_W_{variant}_{model}_pad3_{n}ranks").replace('-', "_");
            trials.push(libtest_mimic::Trial::test(name, move || verify(case, n)));
        }
    }
    // One-sided over the AM-based RMA path (what a fabric without native RMA uses).
    for (variant, n) in
        [(Variant::Exchange, 2), (Variant::Slabs, 2), (Variant::Pencils, 2), (Variant::Pencils, 4)]
    {
        let case = format!("W {variant} one-sided");
        let name = format!("ft_W_{variant}_one_sided_am_path_{n}ranks");
        trials.push(libtest_mimic::Trial::test(name, move || verify_with(case, n, &[("WEFT_RMA", "am")])));
    }
    trials.push(libtest_mimic::Trial::test("ft_ranks_must_divide_the_grid", ranks_must_divide));
    trials.push(libtest_mimic::Trial::test("ft_two_sided_forged_messages", || verify("forged".into(), 2)));
    trials.push(libtest_mimic::Trial::test("ft_20_runs_keep_memory_flat", || verify("repeated".into(), 2)));
    libtest_mimic::run(&args, trials).exit();
}
