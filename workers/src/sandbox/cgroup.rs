//! A cgroup v2 per attempt: every process the attempt starts (after `setsid`, a double
//! fork, `nohup`, …) stays in it, and `cgroup.kill` ends them all at once.

use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

/// How long an ended cgroup may take to empty before it is left behind (with a warning).
const EMPTY_TIMEOUT: Duration = Duration::from_secs(5);

/// The directory run cgroups go under: a child of this process's own cgroup v2, if this
/// process may create one there and the kernel has `cgroup.kill` (Linux 5.14).
pub(super) fn probe() -> Option<PathBuf> {
    let base = own_cgroup()?;
    let probe = base.join(format!("keel-probe-{}", std::process::id()));
    std::fs::create_dir(&probe).ok()?;
    let usable = probe.join("cgroup.kill").exists();
    let _ = std::fs::remove_dir(&probe);
    usable.then_some(base)
}

/// This process's cgroup v2 directory: the `0::` line of /proc/self/cgroup under the
/// cgroup2 mount.
fn own_cgroup() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let relative = cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|line| {
        let (fields, fs) = line.split_once(" - ")?;
        fs.starts_with("cgroup2 ")
            .then(|| fields.split(' ').nth(4))
            .flatten()
    })?;
    Some(Path::new(mount).join(relative.trim_start_matches('/')))
}

#[derive(Debug)]
pub(super) struct RunCgroup {
    path: PathBuf,
    /// Its `cgroup.procs`, opened (close-on-exec) before any child forks, so the child only
    /// has to write to it.
    procs: File,
    removed: bool,
}

impl RunCgroup {
    pub(super) fn create(base: &Path, id: &str) -> std::io::Result<RunCgroup> {
        let path = base.join(format!("keel-run-{id}"));
        std::fs::create_dir(&path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("sandbox_unavailable: creating {}: {e}", path.display()),
            )
        })?;
        let mut run = RunCgroup {
            path,
            procs: File::open("/dev/null")?,
            removed: false,
        };
        // Assigned after the struct exists, so a failure here still removes the directory.
        run.procs = File::options()
            .write(true)
            .open(run.path.join("cgroup.procs"))
            .map_err(|e| std::io::Error::new(e.kind(), format!("sandbox_unavailable: {e}")))?;
        Ok(run)
    }

    /// Makes `command`'s child join the cgroup between fork and exec, so not even its
    /// first instruction runs outside. (It used to exec a `sh` that joined and then exec'd
    /// the command: a second exec and dynamic-loader start-up per run.) A child that cannot
    /// join never runs: the spawn fails with the write's error.
    #[allow(unsafe_code)]
    pub(super) fn join_on_spawn(&self, command: &mut tokio::process::Command) {
        let procs = self.procs.as_raw_fd();
        // SAFETY: the closure runs in the forked child, where only async-signal-safe calls
        // are allowed; it makes one write(2) to an fd the parent keeps open until the spawn
        // returns (this cgroup outlives the spawn), and allocates nothing. Writing `0` moves
        // the writing process itself.
        unsafe {
            command.pre_exec(move || {
                let fd = BorrowedFd::borrow_raw(procs);
                nix::unistd::write(fd, b"0")
                    .map(drop)
                    .map_err(std::io::Error::from)
            });
        }
    }

    pub(super) fn kill_now(&self) {
        if let Err(error) = std::fs::write(self.path.join("cgroup.kill"), "1") {
            tracing::warn!(cgroup = %self.path.display(), %error, "could not kill a run's cgroup");
        }
    }

    /// Kills the cgroup, waits until it is empty, and removes it.
    pub(super) async fn end(&mut self) {
        self.kill_now();
        let deadline = Instant::now() + EMPTY_TIMEOUT;
        while self.populated() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.remove();
    }

    fn populated(&self) -> bool {
        std::fs::read_to_string(self.path.join("cgroup.events"))
            .map(|events| events.lines().any(|line| line == "populated 1"))
            .unwrap_or(false)
    }

    fn remove(&mut self) {
        match std::fs::remove_dir(&self.path) {
            Ok(()) => self.removed = true,
            Err(error) => {
                tracing::warn!(cgroup = %self.path.display(), %error, "could not remove a run's cgroup");
            }
        }
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        if !self.removed {
            self.kill_now();
            // Still populated while the kill lands: then the directory stays (empty soon).
            let _ = std::fs::remove_dir(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The child is in the run's cgroup from its first instruction on (skipped on a host
    /// without a writable cgroup v2, where the sweep contains runs instead).
    #[tokio::test]
    async fn a_spawned_child_starts_inside_the_run_s_cgroup() {
        let Some(base) = probe() else { return };
        let id = format!("test-{}", std::process::id());
        let mut cgroup = RunCgroup::create(&base, &id).unwrap();
        let mut command = tokio::process::Command::new("cat");
        command.arg("/proc/self/cgroup");
        cgroup.join_on_spawn(&mut command);
        let output = command.output().await.unwrap();
        let membership = String::from_utf8_lossy(&output.stdout);
        assert!(
            membership.contains(&format!("/keel-run-{id}")),
            "{membership}"
        );
        cgroup.end().await;
        assert!(!cgroup.path.exists());
    }
}
