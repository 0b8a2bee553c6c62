//! cgroups as a deployment gives them to a worker that is not root (systemd's `User=` with
//! `Delegate=yes`): groups of its own in the host's cgroup v1 pids, memory and cpu
//! hierarchies (the hybrid layout of this machine and CI), owned by its uid, which it
//! starts in and makes its runs' groups beneath. And what the kernel says about the cgroup
//! a run's process is in.

use std::fs::File;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The v1 hierarchies a worker's runs are limited in; cpu is optional.
const CONTROLLERS: [(&str, bool); 3] = [("pids", true), ("memory", true), ("cpu", false)];
/// The files a group's owner writes to move processes and set limits in it.
const OWNED_FILES: [&str; 2] = ["cgroup.procs", "tasks"];

/// A group per hierarchy, owned by one uid; removed (with what its worker left in it)
/// when dropped, after the worker.
pub struct Delegated {
    groups: Vec<PathBuf>,
    /// Each group's `cgroup.procs`, open for the worker's first instruction to join.
    procs: Vec<File>,
}

impl Delegated {
    pub fn to(uid: u32) -> Delegated {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "keel-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut delegated = Delegated {
            groups: Vec::new(),
            procs: Vec::new(),
        };
        for (controller, required) in CONTROLLERS {
            let Some(own) = own_v1_group(controller) else {
                assert!(
                    !required,
                    "delegating cgroups needs the host's cgroup v1 {controller} hierarchy"
                );
                continue;
            };
            let group = own.join(&name);
            std::fs::create_dir(&group).unwrap();
            delegated.groups.push(group.clone());
            for path in OWNED_FILES
                .iter()
                .map(|f| group.join(f))
                .chain([group.clone()])
            {
                std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
            }
            let procs = File::options()
                .write(true)
                .open(group.join("cgroup.procs"))
                .unwrap();
            delegated.procs.push(procs);
        }
        delegated
    }

    /// Makes `command`'s child join the groups before it execs.
    pub fn join_on_spawn(&self, command: &mut std::process::Command) {
        use std::os::unix::process::CommandExt;
        let fds: Vec<i32> = self.procs.iter().map(AsRawFd::as_raw_fd).collect();
        // SAFETY: between fork and exec the child only writes to descriptors the parent
        // keeps open (these files live as long as `self`), and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                for &fd in &fds {
                    nix::unistd::write(BorrowedFd::borrow_raw(fd), b"0")?;
                }
                Ok(())
            });
        }
    }
}

impl Drop for Delegated {
    /// The worker is gone; its runs' processes go with it (bubblewrap's
    /// `--die-with-parent`), and each group can be removed once they have.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for group in &self.groups {
            let children = std::fs::read_dir(group)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|entry| entry.path().is_dir())
                .map(|entry| entry.path());
            for dir in children.chain([group.clone()]).collect::<Vec<_>>() {
                while std::fs::remove_dir(&dir).is_err() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

/// This process's group in the v1 hierarchy of `controller`, mounted where the hybrid
/// layout mounts it.
fn own_v1_group(controller: &str) -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    group_of(
        &cgroups,
        controller,
        &Path::new("/sys/fs/cgroup").join(controller),
    )
}

/// The directory of the cgroup `pid` is in for `controller`: in its v1 hierarchy where the
/// host has one, else in the cgroup v2 mounted at /sys/fs/cgroup.
pub fn cgroup_of(pid: i32, controller: &str) -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v1 = Path::new("/sys/fs/cgroup").join(controller);
    group_of(&cgroups, controller, &v1).or_else(|| {
        let relative = cgroups.lines().find_map(|line| line.strip_prefix("0::"))?;
        Some(Path::new("/sys/fs/cgroup").join(relative.trim_start_matches('/')))
    })
}

/// The `id:controllers:path` line of `controller` in a /proc/<pid>/cgroup file, under
/// `mount` when it is mounted.
fn group_of(cgroups: &str, controller: &str, mount: &Path) -> Option<PathBuf> {
    let relative = cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, list, path) = (fields.next()?, fields.next()?, fields.next()?);
        list.split(',').any(|c| c == controller).then_some(path)
    })?;
    mount
        .is_dir()
        .then(|| mount.join(relative.trim_start_matches('/')))
}
