//! A cgroup per attempt. In cgroup v2 it contains: every process the attempt starts (after
//! `setsid`, a double fork, `nohup`, …) stays in it, and `cgroup.kill` ends them all at once;
//! with the controllers the worker's cgroup offers, it also holds them to their limits
//! ([`super::limits`]). In a cgroup v1 hierarchy ([`super::cgroup_v1`]) it only limits and
//! counts: v1 has no `cgroup.kill`.

use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use super::limits::{self, Breaches, Controller, RunLimits, Version};

/// How long an ended cgroup may take to empty before it is left behind (with a warning).
const EMPTY_TIMEOUT: Duration = Duration::from_secs(5);

/// The leaf this process's cgroup members move to when the kernel refuses to enable
/// controllers for a cgroup that has processes of its own (v2's "no internal processes").
const WORKER_LEAF: &str = "keel-worker";

/// Where v2 run cgroups go, and the controllers they have there.
#[derive(Debug)]
pub(super) struct Base {
    pub(super) path: PathBuf,
    pub(super) controllers: Vec<Controller>,
}

/// The directory run cgroups go under: a child of this process's own cgroup v2, if this
/// process may create one there and the kernel has `cgroup.kill` (Linux 5.14); with the
/// controllers of [`Controller::ALL`] it could enable for them.
pub(super) fn probe() -> Option<Base> {
    let base = own_cgroup()?;
    let probe = base.join(format!("keel-probe-{}", std::process::id()));
    std::fs::create_dir(&probe).ok()?;
    let usable = probe.join("cgroup.kill").exists();
    let _ = std::fs::remove_dir(&probe);
    usable.then(|| Base {
        controllers: enable_controllers(&base),
        path: base,
    })
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

/// Enables for `base`'s children the controllers it offers, and returns those on. A
/// cgroup other than the root may not have processes of its own and controllers for its
/// children at once: when the kernel says so (EBUSY), every process of `base` (this one,
/// and whatever started beside it in the same service or container) moves to a leaf
/// beneath it first, which stays inside everything `base` is held to.
fn enable_controllers(base: &Path) -> Vec<Controller> {
    let offered = words(&base.join("cgroup.controllers"));
    let wanted: Vec<Controller> = Controller::ALL
        .into_iter()
        .filter(|c| offered.iter().any(|name| name == c.name()))
        .collect();
    if !wanted.is_empty() && enable(base, &wanted) == Err(nix::errno::Errno::EBUSY) {
        match move_members_to_leaf(base) {
            Ok(leaf) => {
                tracing::info!(leaf = %leaf.display(), "moved the worker's cgroup members to a leaf, so that runs' cgroups can have controllers");
                let _ = enable(base, &wanted);
            }
            Err(error) => {
                tracing::warn!(cgroup = %base.display(), %error, "could not make room for runs' controllers");
            }
        }
    }
    let on = words(&base.join("cgroup.subtree_control"));
    wanted
        .into_iter()
        .filter(|c| on.iter().any(|name| name == c.name()))
        .collect()
}

/// Writes `+<controller>` for each, one at a time (one refused must not hold back the
/// others); the first error, if any.
fn enable(base: &Path, wanted: &[Controller]) -> Result<(), nix::errno::Errno> {
    let control = base.join("cgroup.subtree_control");
    let mut first = Ok(());
    for controller in wanted {
        if let Err(error) = std::fs::write(&control, format!("+{}", controller.name())) {
            let errno = nix::errno::Errno::from_raw(error.raw_os_error().unwrap_or(0));
            first = first.and(Err(errno));
        }
    }
    first
}

/// Moves every process of `base` into `base/keel-worker`; the root cgroup, which may have
/// both, never gets here (the kernel does not refuse it).
fn move_members_to_leaf(base: &Path) -> std::io::Result<PathBuf> {
    let leaf = base.join(WORKER_LEAF);
    match std::fs::create_dir(&leaf) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let members = std::fs::read_to_string(base.join("cgroup.procs"))?;
    for pid in members.lines() {
        // A member may have exited since the read (ESRCH): nothing left to move.
        match std::fs::write(leaf.join("cgroup.procs"), pid) {
            Err(e) if e.raw_os_error() != Some(nix::libc::ESRCH) => return Err(e),
            _ => {}
        }
    }
    Ok(leaf)
}

/// The space-separated words of a cgroup file; none when it cannot be read.
fn words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|text| text.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// One attempt's cgroup in one hierarchy, held to its limits.
#[derive(Debug)]
pub(super) struct RunCgroup {
    path: PathBuf,
    version: Version,
    controllers: Vec<Controller>,
    /// Its `cgroup.procs`, opened (close-on-exec) before any child forks, so the child only
    /// has to write to it.
    procs: File,
    removed: bool,
}

impl RunCgroup {
    /// Creates `keel-run-<id>` under `base` with `limits` written for `controllers`.
    pub(super) fn create(
        base: &Path,
        id: &str,
        version: Version,
        controllers: &[Controller],
        limits: &RunLimits,
    ) -> std::io::Result<RunCgroup> {
        let path = base.join(format!("keel-run-{id}"));
        std::fs::create_dir(&path).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("sandbox_unavailable: creating {}: {e}", path.display()),
            )
        })?;
        let mut run = RunCgroup {
            path,
            version,
            controllers: controllers.to_vec(),
            procs: File::open("/dev/null")?,
            removed: false,
        };
        // After the struct exists, so a failure here still removes the directory.
        limits::apply(&run.path, controllers, version, limits)?;
        run.procs = File::options()
            .write(true)
            .open(run.path.join("cgroup.procs"))
            .map_err(|e| std::io::Error::new(e.kind(), format!("sandbox_unavailable: {e}")))?;
        Ok(run)
    }

    /// The descriptor a child writes `0` to to join (see [`super::entry`]); open as long
    /// as this cgroup is.
    pub(super) fn procs(&self) -> RawFd {
        self.procs.as_raw_fd()
    }

    /// Kills every process in it (v2; a v1 group has no `cgroup.kill`).
    pub(super) fn kill_now(&self) {
        if self.version != Version::V2 {
            return;
        }
        if let Err(error) = std::fs::write(self.path.join("cgroup.kill"), "1") {
            tracing::warn!(cgroup = %self.path.display(), %error, "could not kill a run's cgroup");
        }
    }

    /// Waits (briefly) until no process is left in it.
    pub(super) async fn wait_empty(&self) {
        let deadline = Instant::now() + EMPTY_TIMEOUT;
        while self.populated() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn populated(&self) -> bool {
        match self.version {
            Version::V2 => std::fs::read_to_string(self.path.join("cgroup.events"))
                .map(|events| events.lines().any(|line| line == "populated 1"))
                .unwrap_or(false),
            Version::V1 => std::fs::read_to_string(self.path.join("cgroup.procs"))
                .is_ok_and(|procs| !procs.trim().is_empty()),
        }
    }

    /// Adds what its limits refused the run's processes to `breaches`.
    pub(super) fn count(&self, breaches: &mut Breaches) {
        breaches.count(&self.path, &self.controllers, self.version);
    }

    pub(super) fn remove(&mut self) {
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
        let limits = RunLimits::default();
        let mut cgroup =
            RunCgroup::create(&base.path, &id, Version::V2, &base.controllers, &limits).unwrap();
        let mut command = tokio::process::Command::new("cat");
        command.arg("/proc/self/cgroup");
        let rlimits = limits::Rlimits::for_attempt(&limits, false);
        super::super::entry::on_spawn(&mut command, vec![cgroup.procs()], rlimits);
        let output = command.output().await.unwrap();
        let membership = String::from_utf8_lossy(&output.stdout);
        assert!(
            membership.contains(&format!("/keel-run-{id}")),
            "{membership}"
        );
        cgroup.kill_now();
        cgroup.wait_empty().await;
        cgroup.remove();
        assert!(!cgroup.path.exists());
    }
}
