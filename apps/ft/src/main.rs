//! `ft`: one run of NAS FT on weft. Start it with the launcher, e.g.
//! `weft run -n 2 -- target/release/ft --class B --variant pencils --model one-sided`.

use clap::Parser;
use std::process::ExitCode;
use weft_ft::{Class, Ft, Model, Options, Variant};

#[derive(Parser)]
#[command(name = "ft", about = "NAS FT (3-D FFT PDE) on weft; start with `weft run -n N -- ft ...`")]
struct Args {
    /// Problem class: S, W, A, B or C.
    #[arg(long, default_value = "S")]
    class: Class,
    /// Transpose: exchange (bulk), slabs (per plane) or pencils (per column).
    #[arg(long, default_value = "pencils")]
    variant: Variant,
    /// one-sided (puts) or two-sided (messages matched at the receiver).
    #[arg(long, default_value = "one-sided")]
    model: Model,
    /// Columns transformed (and, for pencils, sent) per block.
    #[arg(long, default_value_t = 16)]
    columns: usize,
    /// Unused points after each row of the arrays read with non-unit stride (0: none).
    #[arg(long, default_value_t = weft_ft::DEFAULT_PAD)]
    pad: usize,
    /// Skip the untimed warm-up transforms.
    #[arg(long)]
    no_warm_up: bool,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let opts = Options {
        columns: args.columns,
        warm_up: !args.no_warm_up,
        pad: args.pad,
        ..Options::new(args.class, args.variant, args.model)
    };
    let run = || -> Result<bool, weft_ft::Error> {
        let mut b = weft_runtime::World::builder();
        let ft = Ft::register(&mut b);
        let world = b.init()?;
        let report = ft.run(&world, &opts)?;
        if world.rank() == 0 {
            if args.json {
                println!("{}", report.to_json());
            } else {
                report.print();
            }
        }
        world.barrier()?;
        Ok(report.passed())
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ft: {e}");
            ExitCode::from(2)
        }
    }
}
