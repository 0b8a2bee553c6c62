#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    keel::cli::main()
}
