//! What confines a run's processes: the environment they start with ([`environment`]),
//! the namespaces and uid they run in ([`Jail`], as [`settings`] say), and the containment
//! that kills every process the run started once it ends ([`Containment`]). [`seal`] is
//! the other side: what a server process does to itself so that nothing it runs can read
//! it.

mod cgroup;
mod egress;
mod env;
mod inherited;
mod jail;
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
pub use inherited::{INHERITED_PATH, InheritedSecret};
pub(crate) use jail::Jail;
pub use owner::open_workspace_root;
pub use settings::{DEFAULT_UIDS, SandboxMode, SandboxSettings, configure};
pub use uids::DEFAULT_LOCKS as DEFAULT_UID_LOCKS;

/// The variable that marks every process of one attempt; the sweep finds them by it.
const MARKER: &str = "KEEL_RUN_SANDBOX_ID";

/// The strongest containment this host offers, probed once per process.
#[derive(Debug)]
enum Mechanism {
    /// A cgroup v2 per attempt under this directory, ended with `cgroup.kill`.
    Cgroup(PathBuf),
    /// The attempt's process group plus a /proc sweep for the marker variable.
    Sweep,
}

fn mechanism() -> &'static Mechanism {
    static MECHANISM: OnceLock<Mechanism> = OnceLock::new();
    MECHANISM.get_or_init(|| match cgroup::probe() {
        Some(base) => Mechanism::Cgroup(base),
        None => Mechanism::Sweep,
    })
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
    let containment = match mechanism() {
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

/// Everything one attempt's processes run in; ending it (or dropping it) kills them all.
#[derive(Debug)]
pub(crate) struct Containment {
    id: String,
    cgroup: Option<cgroup::RunCgroup>,
    /// The first process's pid, which is also its process group.
    leader: Option<i32>,
    /// Declared after the cgroup: its uid is given back only once the processes are gone.
    jail: Option<Jail>,
    /// What the jail's processes sent and received through its egress proxy, kept when
    /// the containment ends.
    egress: Option<EgressSummary>,
    ended: bool,
}

impl Containment {
    /// Prepares a containment for one attempt (creates its cgroup where there is one).
    pub(crate) fn prepare() -> std::io::Result<Containment> {
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        // The process's start time goes in too: a worker that died (kill -9) leaves its
        // cgroups behind, and a later worker given the same pid would collide with them.
        let id = format!(
            "{}-{}-{}",
            std::process::id(),
            started_at(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        );
        let cgroup = match mechanism() {
            Mechanism::Cgroup(base) => Some(cgroup::RunCgroup::create(base, &id)?),
            Mechanism::Sweep => None,
        };
        Ok(Containment {
            id,
            cgroup,
            leader: None,
            jail: None,
            egress: None,
            ended: false,
        })
    }

    /// The variable that marks the attempt's processes.
    pub(crate) fn marker(&self) -> (String, String) {
        (MARKER.to_string(), self.id.clone())
    }

    /// Starts `command`'s child inside the containment: with a cgroup, the child joins it
    /// before it execs, so not even the first fork happens outside.
    pub(crate) fn enter_on_spawn(&self, command: &mut tokio::process::Command) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.join_on_spawn(command);
        }
    }

    /// Records the attempt's first process and the jail it started in, which the
    /// containment keeps until it has ended.
    pub(crate) fn started(&mut self, pid: Option<u32>, jail: Option<Jail>) {
        self.leader = pid.map(|pid| pid as i32);
        self.jail = jail;
    }

    /// Kills every process of the attempt and waits (briefly) until they are gone.
    pub(crate) async fn end(&mut self) {
        match &mut self.cgroup {
            Some(cgroup) => cgroup.end().await,
            None => sweep::kill_all(self.leader, MARKER, &self.id),
        }
        self.ended = true;
        self.egress = self.jail.take().and_then(|jail| jail.egress());
    }

    /// What the attempt's processes sent and received through the egress proxy, once the
    /// containment has ended; None without network, or before the end.
    pub(crate) fn egress(&self) -> Option<&EgressSummary> {
        self.egress.as_ref()
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
