//! cgroup v1 hierarchies, for the controllers a host keeps there rather than in its
//! cgroup v2 (a hybrid host: systemd's older layouts, many CI machines). An attempt gets a
//! group in each, a child of this process's own group there, which its first process joins
//! before it execs ([`super::cgroup::RunCgroup`], [`super::entry`]).

use std::path::{Path, PathBuf};

use super::limits::Controller;

/// One mounted v1 hierarchy with the controllers runs use there.
#[derive(Debug)]
pub(super) struct Hierarchy {
    /// This process's own group in it: run groups go beneath.
    pub(super) base: PathBuf,
    pub(super) controllers: Vec<Controller>,
}

/// The hierarchies of `wanted` this process may create groups in.
pub(super) fn probe(wanted: &[Controller]) -> Vec<Hierarchy> {
    let read = |path| std::fs::read_to_string(path).unwrap_or_default();
    let (cgroups, mounts) = (read("/proc/self/cgroup"), read("/proc/self/mountinfo"));
    let mut found: Vec<Hierarchy> = Vec::new();
    for &controller in wanted {
        let Some(base) = own_group(&cgroups, &mounts, controller.name()) else {
            continue;
        };
        if !usable(&base, controller) {
            continue;
        }
        // Controllers mounted together (`cpu,cpuacct`) share one group per run.
        match found.iter_mut().find(|h| h.base == base) {
            Some(hierarchy) => hierarchy.controllers.push(controller),
            None => found.push(Hierarchy {
                base,
                controllers: vec![controller],
            }),
        }
    }
    found
}

/// This process's group in the v1 hierarchy of controller `name`: its line of
/// /proc/self/cgroup (`id:controllers:path`) under the hierarchy's mount, less the part of
/// the path the mount itself starts at (a container's mount shows its own group as `/`).
fn own_group(cgroups: &str, mounts: &str, name: &str) -> Option<PathBuf> {
    let relative = cgroups.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, list, path) = (fields.next()?, fields.next()?, fields.next()?);
        list.split(',').any(|c| c == name).then_some(path)
    })?;
    let (root, mount) = mounts.lines().find_map(|line| {
        let (fields, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let (kind, options) = (fs.next()?, fs.nth(1)?);
        if kind != "cgroup" || !options.split(',').any(|o| o == name) {
            return None;
        }
        let mut fields = fields.split(' ').skip(3);
        Some((fields.next()?, fields.next()?))
    })?;
    let inside = Path::new(relative)
        .strip_prefix(root)
        .unwrap_or(Path::new(relative));
    Some(Path::new(mount).join(inside.strip_prefix("/").unwrap_or(inside)))
}

/// Whether a group made under `base` has the controller's files.
fn usable(base: &Path, controller: Controller) -> bool {
    let probe = base.join(format!("keel-probe-{}", std::process::id()));
    match std::fs::create_dir(&probe) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return false,
        _ => {}
    }
    let usable = probe.join(controller.v1_marker()).exists();
    let _ = std::fs::remove_dir(&probe);
    usable
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
35 25 0:30 / /sys/fs/cgroup/pids rw,relatime shared:15 - cgroup cgroup rw,pids
36 25 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:16 - cgroup cgroup rw,cpu,cpuacct
37 25 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 25 0:33 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";

    const CGROUPS: &str = "\
9:name=systemd:/
8:pids:/process_api/one
6:cpu,cpuacct:/
4:memory:/docker/abc/inner
0::/";

    #[test]
    fn a_group_is_found_under_the_mount_of_its_controller() {
        let group = |name| own_group(CGROUPS, MOUNTS, name);
        assert_eq!(
            group("pids"),
            Some(PathBuf::from("/sys/fs/cgroup/pids/process_api/one"))
        );
        assert_eq!(
            group("cpu"),
            Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"))
        );
        // The mount starts at /docker/abc: the group is beneath it.
        assert_eq!(
            group("memory"),
            Some(PathBuf::from("/sys/fs/cgroup/memory/inner"))
        );
        assert_eq!(group("blkio"), None);
    }
}
