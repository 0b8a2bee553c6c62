//! `keel-bench`: Keel's benchmark, a binary of its own so the `keel` users run ships no
//! `bench` job kind (docs/benchmarks.md).
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use keel::config::Common;
use keel_bench::BenchCommand;

#[derive(Debug, Parser)]
#[command(
    name = "keel-bench",
    version,
    about = "Keel's benchmark (docs/benchmarks.md)"
)]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    command: BenchCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("keel-bench: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let telemetry = {
        let _runtime = runtime.enter();
        keel::telemetry::init(cli.common.log.log_format, "bench")
    };
    let telemetry = match telemetry {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("keel-bench: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = keel::cli::shutdown_on_signal();
        keel_bench::main(&cli.common, cli.command, shutdown).await
    });
    drop(telemetry);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("keel-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}
