//! The fallback where no cgroup v2 is writable: kill the attempt's process group, then
//! every process whose environment carries the attempt's marker, round after round until
//! a scan finds none (a process may fork between a scan and its kill). It finds what left
//! the group (`setsid`, double forks, `nohup`), but not a process that also cleared its
//! environment: the cgroup has no such gap.

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Rounds of scan-and-kill before giving up on a process that keeps forking.
const MAX_ROUNDS: usize = 20;

pub(super) fn kill_all(leader: Option<i32>, marker: &str, id: &str) {
    if let Some(leader) = leader {
        // ESRCH (the group is already gone) is the expected case after a clean exit.
        let _ = killpg(Pid::from_raw(leader), Signal::SIGKILL);
    }
    let needle = format!("{marker}={id}");
    for _ in 0..MAX_ROUNDS {
        let marked = marked_processes(needle.as_bytes());
        if marked.is_empty() {
            return;
        }
        for pid in marked {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    tracing::warn!(sandbox_id = id, "processes of a run survived the sweep");
}

/// Live processes whose environment holds `needle` as one entry. A zombie's environment
/// reads empty, so the dead are not counted.
fn marked_processes(needle: &[u8]) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|environ| environ.split(|b| *b == 0).any(|entry| entry == needle))
        })
        .collect()
}
