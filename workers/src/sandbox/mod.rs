//! What confines a run's processes: the environment they start with ([`environment`]),
//! the namespaces and uid they run in ([`Jail`], as [`settings`] say), the limits they are
//! held to ([`limits`]), and the containment that kills every process the run started once
//! it ends ([`Containment`]). [`seal`] is the other side: what a server process does to
//! itself so that nothing it runs can read it.

mod accounts;
mod cgroup;
mod cgroup_v1;
mod egress;
mod entry;
mod env;
mod inherited;
mod jail;
mod limits;
mod owner;
pub mod seal;
mod settings;
pub mod shim;
mod sweep;
mod uids;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

pub use egress::{EgressRules, EgressSummary, Refusal};
pub(crate) use env::environment;
pub(crate) use inherited::hand_over;
pub use inherited::{INHERITED_PATH, InheritedSecret};
pub(crate) use jail::Jail;
pub use limits::{DEFAULT_LIMITS, MIN_NOFILE, MIN_PIDS, RunLimits, parse_memory};
pub use owner::open_workspace_root;
pub use settings::{DEFAULT_UIDS, SandboxMode, SandboxSettings};
pub use uids::DEFAULT_LOCKS as DEFAULT_UID_LOCKS;

use limits::{Breaches, Controller, Rlimits, Version};

/// The variable that marks every process of one attempt; the sweep finds them by it.
const MARKER: &str = "KEEL_RUN_SANDBOX_ID";

/// What this host offers attempts, probed once per process.
#[derive(Debug)]
struct Host {
    containment: Mechanism,
    /// The controllers v2 run cgroups have (none without [`Mechanism::Cgroup`]).
    v2: Vec<Controller>,
    /// The v1 hierarchies of the controllers v2 does not offer.
    v1: Vec<cgroup_v1::Hierarchy>,
}

/// The strongest containment this host offers.
#[derive(Debug)]
enum Mechanism {
    /// A cgroup v2 per attempt under this directory, ended with `cgroup.kill`.
    Cgroup(PathBuf),
    /// The attempt's process group plus a /proc sweep for the marker variable.
    Sweep,
}

fn host() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| {
        let (containment, v2) = match cgroup::probe() {
            Some(base) => (Mechanism::Cgroup(base.path), base.controllers),
            None => (Mechanism::Sweep, Vec::new()),
        };
        let rest: Vec<Controller> = Controller::ALL
            .into_iter()
            .filter(|c| !v2.contains(c))
            .collect();
        Host {
            containment,
            v1: cgroup_v1::probe(&rest),
            v2,
        }
    })
}

impl Host {
    /// The cgroup version that holds runs to `controller`'s limit; None: nothing does.
    fn version_of(&self, controller: Controller) -> Option<Version> {
        if self.v2.contains(&controller) {
            Some(Version::V2)
        } else {
            let v1 = self.v1.iter().flat_map(|h| &h.controllers);
            v1.into_iter()
                .any(|c| *c == controller)
                .then_some(Version::V1)
        }
    }
}

/// Sets how this process confines what it runs (see [`settings::configure`]) and probes the
/// host once, now: a worker whose settings require limits (remote mode) and whose host
/// cannot hold runs to the pids and memory limits refuses to start.
pub fn configure(settings: SandboxSettings) -> Result<SandboxMode, String> {
    let mode = settings::configure(settings)?;
    let host = host();
    let missing: Vec<&str> = [Controller::Pids, Controller::Memory]
        .into_iter()
        .filter(|c| host.version_of(*c).is_none())
        .map(Controller::name)
        .collect();
    if settings::current().settings.require_limits && !missing.is_empty() {
        return Err(format!(
            "remote mode (KEEL_REMOTE_MODE) holds every run to pids and memory limits, and \
             this worker can set no {} limit: it needs a cgroup v2 of its own that offers the \
             pids and memory controllers (systemd Delegate=yes, a container with a writable \
             cgroup namespace), or writable cgroup v1 pids and memory hierarchies (root on a \
             hybrid host); see docs/operations.md, \"Run sandbox\"",
            missing.join(" or ")
        ));
    }
    Ok(mode)
}

/// When this process first prepared a containment, in ms since the epoch.
fn started_at() -> u128 {
    static STARTED: OnceLock<u128> = OnceLock::new();
    *STARTED.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis())
    })
}

/// Names the sandbox and the containment runs get on this host, for the start-up log.
pub fn containment_name() -> String {
    let containment = match &host().containment {
        Mechanism::Cgroup(base) => format!("cgroup v2 per run under {}", base.display()),
        Mechanism::Sweep => "process group and /proc sweep (no writable cgroup v2)".into(),
    };
    let resolved = settings::current();
    let sandbox = match resolved.mode {
        SandboxMode::Isolated => format!(
            "a uid of its own ({}-{}) in bubblewrap namespaces",
            resolved.settings.uids.start(),
            resolved.settings.uids.end()
        ),
        SandboxMode::Namespaces => "bubblewrap namespaces, the worker's uid outside".into(),
        SandboxMode::Off | SandboxMode::Auto => "no sandbox (KEEL_SANDBOX=off)".into(),
    };
    format!("{sandbox}; {containment}")
}

/// The limits each attempt gets on this host and what enforces them, for the start-up log.
pub fn limits_in_effect() -> String {
    let host = host();
    let resolved = settings::current();
    let limits = &resolved.settings.limits;
    let by = |controller| match host.version_of(controller) {
        Some(Version::V2) => "cgroup v2",
        Some(Version::V1) => "cgroup v1",
        None => "not enforced: no cgroup controller",
    };
    let rlimits = Rlimits::for_attempt(limits, resolved.mode == SandboxMode::Isolated);
    let nproc = match rlimits.nproc {
        Some(nproc) => format!("nproc {nproc} (the run's own uid)"),
        None => "nproc unset (runs share the worker's uid)".into(),
    };
    format!(
        "pids {} ({}), memory {} without swap ({}), a fair share of the cpu ({}), nofile {}, {nproc}",
        limits.pids,
        by(Controller::Pids),
        limits::size(limits.memory),
        by(Controller::Memory),
        by(Controller::Cpu),
        rlimits.nofile,
    )
}

/// Everything one attempt's processes run in; ending it (or dropping it) kills them all.
#[derive(Debug)]
pub(crate) struct Containment {
    id: String,
    /// The v2 cgroup, which contains (and limits, with the controllers it has).
    cgroup: Option<cgroup::RunCgroup>,
    /// The groups in v1 hierarchies, which only limit.
    v1: Vec<cgroup::RunCgroup>,
    limits: RunLimits,
    rlimits: Rlimits,
    /// The first process's pid, which is also its process group.
    leader: Option<i32>,
    /// Declared after the cgroups: its uid is given back only once the processes are gone.
    jail: Option<Jail>,
    /// What the jail's processes sent and received through its egress proxy, kept when
    /// the containment ends.
    egress: Option<EgressSummary>,
    /// Which limits stopped the attempt's processes, read when the containment ends.
    limit_reached: Option<String>,
    ended: bool,
}

impl Containment {
    /// Prepares a containment for one attempt under the operator's limits.
    pub(crate) fn prepare() -> std::io::Result<Containment> {
        Containment::prepare_with(settings::current().settings.limits)
    }

    /// Prepares a containment for one attempt under `limits`: creates its cgroups where
    /// the host has them, with the limits written.
    fn prepare_with(limits: RunLimits) -> std::io::Result<Containment> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        // The process's start time goes in too: a worker that died (kill -9) leaves its
        // cgroups behind, and a later worker given the same pid would collide with them.
        let id = format!(
            "{}-{}-{}",
            std::process::id(),
            started_at(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        );
        let host = host();
        let cgroup = match &host.containment {
            Mechanism::Cgroup(base) => Some(cgroup::RunCgroup::create(
                base,
                &id,
                Version::V2,
                &host.v2,
                &limits,
            )?),
            Mechanism::Sweep => None,
        };
        let v1 = host
            .v1
            .iter()
            .map(|h| cgroup::RunCgroup::create(&h.base, &id, Version::V1, &h.controllers, &limits))
            .collect::<std::io::Result<_>>()?;
        let own_uid = settings::current().mode == SandboxMode::Isolated;
        Ok(Containment {
            id,
            cgroup,
            v1,
            limits,
            rlimits: Rlimits::for_attempt(&limits, own_uid),
            leader: None,
            jail: None,
            egress: None,
            limit_reached: None,
            ended: false,
        })
    }

    /// The variable that marks the attempt's processes.
    pub(crate) fn marker(&self) -> (String, String) {
        (MARKER.to_string(), self.id.clone())
    }

    /// Starts `command`'s child inside the containment: the child joins its cgroups and
    /// takes its rlimits before it execs, so not even the first fork happens outside.
    pub(crate) fn enter_on_spawn(&self, command: &mut tokio::process::Command) {
        let procs = self.cgroups().map(cgroup::RunCgroup::procs).collect();
        entry::on_spawn(command, procs, self.rlimits);
    }

    fn cgroups(&self) -> impl Iterator<Item = &cgroup::RunCgroup> {
        self.cgroup.iter().chain(&self.v1)
    }

    /// Records the attempt's first process and the jail it started in, which the
    /// containment keeps until it has ended.
    pub(crate) fn started(&mut self, pid: Option<u32>, jail: Option<Jail>) {
        self.leader = pid.map(|pid| pid as i32);
        self.jail = jail;
    }

    /// Kills every process of the attempt and waits (briefly) until they are gone; reads
    /// which limits stopped them, and removes the cgroups.
    pub(crate) async fn end(&mut self) {
        match &self.cgroup {
            Some(cgroup) => cgroup.kill_now(),
            None => sweep::kill_all(self.leader, MARKER, &self.id),
        }
        // The v1 groups hold the same processes: empty once the kill has landed.
        let mut breaches = Breaches::default();
        for cgroup in self.cgroups() {
            cgroup.wait_empty().await;
            cgroup.count(&mut breaches);
        }
        self.limit_reached = breaches.describe(&self.limits);
        for cgroup in self.cgroup.iter_mut().chain(&mut self.v1) {
            cgroup.remove();
        }
        self.ended = true;
        self.egress = self.jail.take().and_then(|jail| jail.egress());
    }

    /// What the attempt's processes sent and received through the egress proxy, once the
    /// containment has ended; None without network, or before the end.
    pub(crate) fn egress(&self) -> Option<&EgressSummary> {
        self.egress.as_ref()
    }

    /// A failed attempt's `error`, led by the limits that refused its processes memory or
    /// new processes (a code and the figures), once the containment has ended: what ended
    /// a run killed by the OOM killer, or one whose forks failed, is then plain.
    pub(crate) fn blame_limits(&self, error: String) -> String {
        match &self.limit_reached {
            Some(limit) => format!("{limit}; {error}"),
            None => error,
        }
    }
}

impl Drop for Containment {
    /// An attempt abandoned midway (its future dropped) still leaves nothing running; a
    /// cgroup sees to that itself.
    fn drop(&mut self) {
        if !self.ended && self.cgroup.is_none() {
            sweep::kill_all(self.leader, MARKER, &self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: RunLimits = RunLimits {
        pids: 32,
        memory: 64 << 20,
        nofile: 100,
    };

    /// Runs `script` with `sh` in a containment under [`SMALL`] to its end; its stdout, and
    /// whether it exited 0.
    async fn contained(script: &str) -> (Containment, String, bool) {
        let mut containment = Containment::prepare_with(SMALL).unwrap();
        let mut command = tokio::process::Command::new("sh");
        command
            .args(["-c", script])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        containment.enter_on_spawn(&mut command);
        let child = command.spawn().unwrap();
        containment.started(child.id(), None);
        let output = child.wait_with_output().await.unwrap();
        containment.end().await;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        (containment, stdout, output.status.success())
    }

    #[tokio::test]
    async fn a_child_starts_with_the_attempt_s_open_files_limit() {
        let (containment, stdout, ok) = contained("ulimit -n; ulimit -Hn").await;
        assert!(ok, "{stdout}");
        assert_eq!(stdout, "100\n100\n");
        assert_eq!(containment.limit_reached, None);
    }

    /// Skipped on a host with no memory controller to hold it.
    #[tokio::test]
    async fn a_memory_hog_is_killed_at_its_limit_and_the_attempt_says_so() {
        if host().version_of(Controller::Memory).is_none() {
            return;
        }
        let hog = "python3 -c \"chunks = []\nfor _ in range(64): chunks.append(b'x' * (8 << 20))\"; \
                   echo exit $?";
        let (containment, stdout, _) = contained(hog).await;
        // SIGKILL: 128 + 9.
        assert_eq!(stdout, "exit 137\n");
        let error = containment.blame_limits("process exited with code 137".into());
        assert!(
            error.starts_with("memory_limit_exceeded: the kernel killed 1 of the run's processes at its memory limit of 64 MiB; process exited"),
            "{error}"
        );
    }

    /// Skipped on a host with no pids controller to hold it.
    #[tokio::test]
    async fn forks_past_the_pids_limit_fail_and_the_attempt_says_so() {
        if host().version_of(Controller::Pids).is_none() {
            return;
        }
        let bomb = "for i in $(seq 100); do sleep 30 >/dev/null & done; echo never";
        let (containment, stdout, ok) = contained(bomb).await;
        assert!(!ok && stdout.is_empty(), "the 100 forks went through");
        let error = containment.blame_limits("process exited with code 2".into());
        assert!(error.starts_with("pids_limit_reached: "), "{error}");
        assert!(error.contains("the run's limit of 32 at once"), "{error}");
    }
}
