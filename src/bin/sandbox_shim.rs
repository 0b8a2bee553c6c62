//! `keel-sandbox-shim sandbox-shim …`: the sandbox shim alone, which every jail with
//! network starts first, as its PID 1 ([`keel_workers::shim`]). A binary of its own so each
//! of a run's processes starts behind a small program: mapping and relocating the whole
//! `keel` binary costs milliseconds of CPU at every start (docs/benchmarks.md). `keel
//! sandbox-shim` does the same, for installs that carry only `keel`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    match args.next() {
        Some(arg) if arg == keel_workers::shim::ARG => keel_workers::shim::main(args),
        _ => {
            eprintln!("usage: keel-sandbox-shim {} …", keel_workers::shim::ARG);
            ExitCode::FAILURE
        }
    }
}
