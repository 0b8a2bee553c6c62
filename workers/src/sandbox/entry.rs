//! What an attempt's first process does in the child, between fork and exec: it joins the
//! attempt's cgroups and takes its rlimits, so not even its first instruction runs outside
//! them. (It used to exec a `sh` that joined and then exec'd the command: a second exec and
//! dynamic-loader start-up per run.) A child that cannot join never runs: the spawn fails
//! with the error.

use std::os::fd::{BorrowedFd, RawFd};

use super::limits::Rlimits;

/// Makes `command`'s child write `0` (itself) to each of `procs` (`cgroup.procs` files the
/// parent keeps open until the spawn returns) and set `rlimits`. It runs after the switch
/// to the attempt's uid (`isolated`), so the rlimits can only be lowered there, and a
/// cgroup admits the child on the credentials its file was opened with.
#[allow(unsafe_code)]
pub(super) fn on_spawn(command: &mut tokio::process::Command, procs: Vec<RawFd>, rlimits: Rlimits) {
    // SAFETY: the closure runs in the forked child, where only async-signal-safe calls are
    // allowed: it makes write(2) and setrlimit(2) calls on values prepared in the parent,
    // and allocates nothing.
    unsafe {
        command.pre_exec(move || {
            for &fd in &procs {
                nix::unistd::write(BorrowedFd::borrow_raw(fd), b"0")?;
            }
            rlimits.set()?;
            Ok(())
        });
    }
}
