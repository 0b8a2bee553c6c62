//! How a process confines what it runs, set once at start-up ([`configure`]) from the
//! operator's settings and read by every process start of the process.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::OnceLock;

use super::egress::EgressRules;
use super::limits::RunLimits;

/// The operator's choice (`KEEL_SANDBOX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxMode {
    /// `isolated` when this process may switch uids (it runs as root), else `namespaces`.
    Auto,
    /// Each attempt runs as a uid of its own from the pool, in its own user, PID, mount,
    /// IPC, UTS and cgroup namespaces (bubblewrap), with `no_new_privs`.
    Isolated,
    /// The same namespaces, but the attempt keeps this process's uid outside them (inside
    /// its user namespace it has another): for a worker that cannot switch uids.
    Namespaces,
    /// No namespaces: the attempt runs as this process's uid and sees what it sees. Only
    /// the cgroup and the cleared environment remain. Refused in remote mode.
    Off,
}

impl SandboxMode {
    pub fn parse(value: &str) -> Result<SandboxMode, String> {
        match value {
            "auto" => Ok(SandboxMode::Auto),
            "isolated" => Ok(SandboxMode::Isolated),
            "namespaces" => Ok(SandboxMode::Namespaces),
            "off" => Ok(SandboxMode::Off),
            other => Err(format!(
                "unknown sandbox mode {other:?}: expected auto, isolated, namespaces or off"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SandboxMode::Auto => "auto",
            SandboxMode::Isolated => "isolated",
            SandboxMode::Namespaces => "namespaces",
            SandboxMode::Off => "off",
        }
    }
}

/// The pool of uids when none is configured: high enough to be no login user's, and
/// clear of the usual subordinate id ranges (100000 and up, 65536 per user).
pub const DEFAULT_UIDS: RangeInclusive<u32> = 1_900_000_000..=1_900_009_999;

#[derive(Debug, Clone)]
pub struct SandboxSettings {
    pub mode: SandboxMode,
    /// The bubblewrap binary (a name looked up on `PATH`, or a path).
    pub bwrap: PathBuf,
    /// The uids (each also the attempt's gid) `isolated` attempts take, one per attempt
    /// at a time across every Keel process of the host.
    pub uids: RangeInclusive<u32>,
    /// The directory of the uids' locks, which only this process's uid may enter
    /// ([`super::uids`]); every Keel process of the host that hands out the same uids
    /// must use the same one.
    pub uid_locks: PathBuf,
    /// Directories attempts see read-only beside the system's (`/usr`, `/etc`, `/opt`, the
    /// library and binary directories).
    pub read_only_paths: Vec<PathBuf>,
    /// The `keel` binary, which every jail runs first as its shim ([`super::shim`]). None
    /// (a process that is not the keel binary, such as a unit test): jails with network
    /// cannot start (`sandbox_unavailable`), and the others start without the shim's check
    /// that the bound workspace is the one the worker opened.
    pub shim: Option<PathBuf>,
    /// Hosts runs may reach through the egress proxy although they are not public.
    pub egress: EgressRules,
    /// What each attempt's processes may take of the host.
    pub limits: RunLimits,
    /// Refuse to start unless the host can hold attempts to their pids and memory limits
    /// (remote mode: tenants share the workers).
    pub require_limits: bool,
}

impl Default for SandboxSettings {
    fn default() -> Self {
        SandboxSettings {
            mode: SandboxMode::Auto,
            bwrap: PathBuf::from("bwrap"),
            uids: DEFAULT_UIDS,
            uid_locks: PathBuf::from(super::uids::DEFAULT_LOCKS),
            read_only_paths: Vec::new(),
            shim: None,
            egress: EgressRules::default(),
            limits: RunLimits::default(),
            require_limits: false,
        }
    }
}

/// The settings with `auto` decided: never [`SandboxMode::Auto`].
#[derive(Debug)]
pub(super) struct Resolved {
    pub(super) mode: SandboxMode,
    pub(super) settings: SandboxSettings,
}

static SETTINGS: OnceLock<Resolved> = OnceLock::new();

/// Sets how this process confines what it runs; the first call wins, and a process that
/// never calls it gets the defaults. Returns the mode in effect; refuses `namespaces` for
/// a root process, whose attempts would be root outside their namespaces.
pub fn configure(settings: SandboxSettings) -> Result<SandboxMode, String> {
    if settings.mode == SandboxMode::Namespaces && nix::unistd::geteuid().is_root() {
        return Err(
            "KEEL_SANDBOX=namespaces keeps the worker's uid outside the namespaces, and \
                    this worker runs as root: use isolated (or auto), which gives each run a \
                    uid of its own"
                .into(),
        );
    }
    let resolved = SETTINGS.get_or_init(|| resolve(settings));
    if resolved.mode == SandboxMode::Isolated {
        reachable_read_only_paths(&resolved.settings.read_only_paths)?;
    }
    Ok(resolved.mode)
}

/// Every read-only path must be one the runs' uids can reach: bubblewrap binds it as the
/// run's uid, and one it cannot reach would fail every run with `sandbox_unavailable`.
fn reachable_read_only_paths(paths: &[PathBuf]) -> Result<(), String> {
    for path in paths {
        let what = format!("the read-only path {}", path.display());
        super::owner::check_passable(path, &what)
            .map_err(|why| format!("KEEL_SANDBOX_READ_ONLY_PATHS: {why}"))?;
    }
    Ok(())
}

pub(super) fn current() -> &'static Resolved {
    SETTINGS.get_or_init(|| resolve(SandboxSettings::default()))
}

fn resolve(settings: SandboxSettings) -> Resolved {
    let mode = match settings.mode {
        SandboxMode::Auto if nix::unistd::geteuid().is_root() => SandboxMode::Isolated,
        SandboxMode::Auto => SandboxMode::Namespaces,
        chosen => chosen,
    };
    Resolved { mode, settings }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_back_by_name_and_unknown_ones_are_refused() {
        for mode in [
            SandboxMode::Auto,
            SandboxMode::Isolated,
            SandboxMode::Namespaces,
            SandboxMode::Off,
        ] {
            assert_eq!(SandboxMode::parse(mode.as_str()), Ok(mode));
        }
        assert!(SandboxMode::parse("none").unwrap_err().contains("auto"));
    }
}
