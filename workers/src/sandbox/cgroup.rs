//! A cgroup v2 per attempt: every process the attempt starts (after `setsid`, a double
//! fork, `nohup`, …) stays in it, and `cgroup.kill` ends them all at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

/// How long an ended cgroup may take to empty before it is left behind (with a warning).
const EMPTY_TIMEOUT: Duration = Duration::from_secs(5);

/// Joins the cgroup whose `cgroup.procs` is `$0`, then becomes the command. Writing `0`
/// moves the writing process itself.
const JOIN_SCRIPT: &str = r#"{ echo 0 > "$0"; } 2>/dev/null || { echo "keel: sandbox_unavailable: could not enter the run's cgroup" >&2; exit 125; }; exec "$@""#;

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
        Ok(RunCgroup {
            path,
            removed: false,
        })
    }

    pub(super) fn wrap(&self, argv: Vec<String>) -> Vec<String> {
        let procs = self
            .path
            .join("cgroup.procs")
            .to_string_lossy()
            .into_owned();
        ["sh".to_string(), "-c".into(), JOIN_SCRIPT.into(), procs]
            .into_iter()
            .chain(argv)
            .collect()
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
