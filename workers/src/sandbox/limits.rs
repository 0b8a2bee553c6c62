//! What one attempt's processes may take of the host: processes and threads at once
//! (`pids.max`), memory without swap (`memory.max`, or v1's `memory.limit_in_bytes`), a fair
//! share of the CPU (a cgroup of its own in the cpu controller, at the default weight), open
//! files per process (`RLIMIT_NOFILE`) and, where the attempt has a uid of its own,
//! processes per uid (`RLIMIT_NPROC`). Here: the limits, the cgroup files each controller is
//! set and counted in, and what a run that met a limit reports. Where the cgroups live is
//! [`super::cgroup`] (v2, and a run's group in either version) and [`super::cgroup_v1`].

use std::path::Path;

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// The operator's limits for each attempt (`KEEL_SANDBOX_PIDS`, `KEEL_SANDBOX_MEMORY`,
/// `KEEL_SANDBOX_NOFILE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    /// Processes and threads at once.
    pub pids: u64,
    /// Bytes of memory (page cache and kernel memory included), with no swap beyond it.
    pub memory: u64,
    /// Open files per process.
    pub nofile: u64,
}

/// Enough for a parallel build or a test suite, and few enough that eight runs on a worker
/// (the default concurrency) leave the host room: 16 GiB and 8,192 processes at most.
pub const DEFAULT_LIMITS: RunLimits = RunLimits {
    pids: 1024,
    memory: 2 << 30,
    nofile: 4096,
};

impl Default for RunLimits {
    fn default() -> Self {
        DEFAULT_LIMITS
    }
}

/// The least each limit may be set to: what bubblewrap, the egress shim and a shell need to
/// start at all.
pub const MIN_PIDS: u64 = 16;
pub const MIN_MEMORY: u64 = 32 << 20;
pub const MIN_NOFILE: u64 = 64;

/// Above the pids limit, so that where a pids cgroup holds the run, it refuses the fork
/// first (and counts it: `pids_limit_reached`) rather than the rlimit, which counts nothing.
const NPROC_HEADROOM: u64 = 16;

/// A size in bytes, or with a binary suffix: `2G`, `512M`, `64K` (also `GiB`, `MiB`,
/// `KiB`), at least [`MIN_MEMORY`].
pub fn parse_memory(value: &str) -> Result<u64, String> {
    let trimmed = value.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(split);
    let shift = match unit.trim() {
        "" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        other => return Err(format!("{value:?}: unknown unit {other:?} (K, M or G)")),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{value:?} is not a size such as 2G, 512M or 1073741824"))?;
    let bytes = number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{value:?} is too large"))?;
    if bytes < MIN_MEMORY {
        return Err(format!("{value:?} is below the least a run needs, 32M"));
    }
    Ok(bytes)
}

/// `2 GiB`, `128 MiB`, or bytes when it is no whole number of either.
pub(super) fn size(bytes: u64) -> String {
    match bytes {
        b if b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b => format!("{b} bytes"),
    }
}

/// The controllers a run's cgroups take part in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Controller {
    Pids,
    Memory,
    /// No file is written: a cgroup of its own, at the default weight (`cpu.weight`, v1's
    /// `cpu.shares`), shares the CPU evenly with the other runs and the worker.
    Cpu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Version {
    V1,
    V2,
}

/// One file of a run's cgroup to write; an optional one only where the kernel has it.
struct Setting {
    file: &'static str,
    value: String,
    optional: bool,
}

impl Controller {
    pub(super) const ALL: [Controller; 3] = [Controller::Pids, Controller::Memory, Controller::Cpu];

    pub(super) fn name(self) -> &'static str {
        match self {
            Controller::Pids => "pids",
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
        }
    }

    /// A file every v1 cgroup of the controller's hierarchy has.
    pub(super) fn v1_marker(self) -> &'static str {
        match self {
            Controller::Pids => "pids.max",
            Controller::Memory => "memory.limit_in_bytes",
            Controller::Cpu => "cpu.shares",
        }
    }

    /// The files that hold a run to `limits`, in the order they must be written. Swap is
    /// limited where the kernel accounts it (v2's `memory.swap.max`; v1's `memsw`, which
    /// counts memory and swap together, so it gets the memory limit itself).
    fn settings(self, version: Version, limits: &RunLimits) -> Vec<Setting> {
        let setting = |file, value: u64, optional| Setting {
            file,
            value: value.to_string(),
            optional,
        };
        match (self, version) {
            (Controller::Pids, _) => vec![setting("pids.max", limits.pids, false)],
            (Controller::Memory, Version::V2) => vec![
                setting("memory.max", limits.memory, false),
                setting("memory.swap.max", 0, true),
            ],
            (Controller::Memory, Version::V1) => vec![
                setting("memory.limit_in_bytes", limits.memory, false),
                setting("memory.memsw.limit_in_bytes", limits.memory, true),
            ],
            (Controller::Cpu, _) => Vec::new(),
        }
    }

    /// Where the kernel counts the times this limit stopped a run's processes: the file
    /// and its key.
    fn counter(self, version: Version) -> Option<(&'static str, &'static str)> {
        match (self, version) {
            (Controller::Pids, _) => Some(("pids.events", "max")),
            (Controller::Memory, Version::V2) => Some(("memory.events", "oom_kill")),
            (Controller::Memory, Version::V1) => Some(("memory.oom_control", "oom_kill")),
            (Controller::Cpu, _) => None,
        }
    }
}

/// Writes `limits` into the run cgroup `dir` for each of `controllers`.
pub(super) fn apply(
    dir: &Path,
    controllers: &[Controller],
    version: Version,
    limits: &RunLimits,
) -> std::io::Result<()> {
    let settings = controllers
        .iter()
        .flat_map(|controller| controller.settings(version, limits));
    for Setting {
        file,
        value,
        optional,
    } in settings
    {
        let path = dir.join(file);
        if optional && !path.exists() {
            continue;
        }
        std::fs::write(&path, &value).map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!(
                    "sandbox_unavailable: writing {value} to {}: {e}",
                    path.display()
                ),
            )
        })?;
    }
    Ok(())
}

/// What the kernel refused a run's processes, added up over its cgroups.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Breaches {
    oom_kills: u64,
    forks_refused: u64,
}

impl Breaches {
    /// Adds what the run cgroup `dir` counted for each of `controllers`.
    pub(super) fn count(&mut self, dir: &Path, controllers: &[Controller], version: Version) {
        for &controller in controllers {
            let Some((file, key)) = controller.counter(version) else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(dir.join(file)) else {
                continue;
            };
            let n = counted(&text, key);
            match controller {
                Controller::Pids => self.forks_refused += n,
                Controller::Memory => self.oom_kills += n,
                Controller::Cpu => {}
            }
        }
    }

    /// The code and the figures a failed run's error begins with; None when no limit
    /// stopped any of its processes.
    pub(super) fn describe(&self, limits: &RunLimits) -> Option<String> {
        let mut parts = Vec::new();
        if self.oom_kills > 0 {
            parts.push(format!(
                "memory_limit_exceeded: the kernel killed {} of the run's processes at its \
                 memory limit of {}",
                self.oom_kills,
                size(limits.memory)
            ));
        }
        if self.forks_refused > 0 {
            parts.push(format!(
                "pids_limit_reached: {} new processes or threads refused at the run's limit \
                 of {} at once",
                self.forks_refused, limits.pids
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// The number after `key` in a flat-keyed cgroup file (`key value` lines); 0 without it.
fn counted(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|line| {
            line.strip_prefix(key)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The rlimits an attempt's first process takes before it execs, soft and hard alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Rlimits {
    pub(super) nofile: u64,
    /// Only for an attempt with a uid of its own (`isolated`): the kernel counts processes
    /// per uid, so where runs share the worker's uid, it would count the worker's threads
    /// and every other run's processes against each run.
    pub(super) nproc: Option<u64>,
}

impl Rlimits {
    /// Capped by this process's own hard limits: the first process sets them after it has
    /// left root for the attempt's uid, when it may only lower them.
    pub(super) fn for_attempt(limits: &RunLimits, own_uid: bool) -> Rlimits {
        let hard = |resource| getrlimit(resource).map_or(u64::MAX, |(_, hard)| hard);
        Rlimits {
            nofile: limits.nofile.min(hard(Resource::RLIMIT_NOFILE)),
            nproc: own_uid
                .then(|| (limits.pids + NPROC_HEADROOM).min(hard(Resource::RLIMIT_NPROC))),
        }
    }

    /// Sets them: two system calls, safe between fork and exec.
    pub(super) fn set(&self) -> nix::Result<()> {
        setrlimit(Resource::RLIMIT_NOFILE, self.nofile, self.nofile)?;
        if let Some(nproc) = self.nproc {
            setrlimit(Resource::RLIMIT_NPROC, nproc, nproc)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_with_binary_units_and_refuse_what_a_run_cannot_start_in() {
        assert_eq!(parse_memory("2G"), Ok(2 << 30));
        assert_eq!(parse_memory("512MiB"), Ok(512 << 20));
        assert_eq!(parse_memory("65536K"), Ok(64 << 20));
        assert_eq!(parse_memory("134217728"), Ok(128 << 20));
        assert!(parse_memory("1M").unwrap_err().contains("32M"));
        assert!(parse_memory("2T").unwrap_err().contains("unknown unit"));
        assert!(parse_memory("lots").is_err());
        assert!(
            parse_memory("99999999999G")
                .unwrap_err()
                .contains("too large")
        );
        assert_eq!(size(2 << 30), "2 GiB");
        assert_eq!(size(96 << 20), "96 MiB");
        assert_eq!(size(1000), "1000 bytes");
    }

    #[test]
    fn a_breach_names_its_limit_first_and_none_says_nothing() {
        let limits = RunLimits {
            pids: 64,
            memory: 128 << 20,
            nofile: 256,
        };
        assert_eq!(Breaches::default().describe(&limits), None);
        let both = Breaches {
            oom_kills: 1,
            forks_refused: 3,
        };
        let text = both.describe(&limits).unwrap();
        assert!(
            text.starts_with("memory_limit_exceeded: the kernel killed 1 "),
            "{text}"
        );
        assert!(
            text.contains("of 128 MiB; pids_limit_reached: 3 "),
            "{text}"
        );
        assert!(text.ends_with("limit of 64 at once"), "{text}");
    }

    #[test]
    fn counters_are_read_by_key() {
        let oom_control = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(counted(oom_control, "oom_kill"), 2);
        assert_eq!(counted("max 0\n", "max"), 0);
        assert_eq!(counted("low 0\nhigh 5\n", "max"), 0);
    }

    #[test]
    fn nproc_is_set_only_for_a_uid_of_the_run_s_own_and_never_raised() {
        let limits = RunLimits {
            pids: 100,
            memory: 64 << 20,
            nofile: u64::MAX,
        };
        let (_, hard_nofile) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        let (_, hard_nproc) = getrlimit(Resource::RLIMIT_NPROC).unwrap();
        let own = Rlimits::for_attempt(&limits, true);
        assert_eq!(own.nofile, hard_nofile);
        assert_eq!(own.nproc, Some((100 + NPROC_HEADROOM).min(hard_nproc)));
        assert_eq!(Rlimits::for_attempt(&limits, false).nproc, None);
    }
}
