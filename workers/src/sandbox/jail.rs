//! The namespaces an attempt's processes run in, built by bubblewrap (`bwrap`), which
//! creates them and execs the command inside, so it never runs outside:
//!
//! - a user namespace (and, in `isolated` mode, a uid of the attempt's own outside it),
//!   with no capabilities, `no_new_privs`, and no user namespace nested inside;
//! - a PID namespace: the attempt sees its own processes only, never the worker or another
//!   attempt (`/proc` is its own); it dies with the worker;
//! - a mount namespace whose root holds the system read-only (`/usr`, `/etc`, `/opt`, the
//!   library and binary directories, and what the operator adds), a private `/tmp`, a
//!   minimal `/dev`, and the workspace (read-only with `sandbox_read_only`): not the data
//!   directory, other workspaces, the database's files or the worker's `/proc`;
//! - IPC, UTS and cgroup namespaces, and a network namespace of its own with only
//!   loopback: nothing of the host's network (its loopback listeners: the API, the
//!   database, a signer; its abstract Unix sockets; another run's listeners) is in reach.
//!   A task with network (`sandbox_network`, the default) reaches out only through the
//!   egress proxy ([`super::egress`]), whose socket is bound in for the shim to serve on
//!   loopback.
//!
//! The workspace is opened once, following no link on its path, handed to the jail's uid
//! through that descriptor, and bound by bubblewrap by its path; the shim, the jail's
//! PID 1 ([`super::shim`]), checks that what was bound is what was opened before the
//! command starts.
//!
//! Each distinct set of flags is probed once per process with `true`: when the host
//! refuses (no bubblewrap, namespaces disabled), the attempt fails with
//! `sandbox_unavailable` and the reason, instead of running outside.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::accounts::Accounts;
use super::egress::{Egress, EgressSummary};
use super::inherited::{self, InheritedSecret};
use super::settings::{self, Resolved, SandboxMode};
use super::{owner, shim, uids};
use crate::SandboxPolicy;

/// The error code an attempt gets when the host cannot provide its sandbox.
pub(crate) const UNAVAILABLE: &str = "sandbox_unavailable";

/// System directories every attempt sees read-only, where the host has them.
const SYSTEM_DIRS: [&str; 4] = ["/usr", "/etc", "/opt", "/run/systemd/resolve"];
/// Top-level directories that are links into `/usr` on a merged-`/usr` system, and
/// directories of their own elsewhere.
const SYSTEM_LINKS: [&str; 6] = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// A mode and a policy whose jail this process has entered once.
type Probed = (&'static str, bool, bool);

/// One attempt's namespaces and, in `isolated` mode, the uid it holds until the jail is
/// dropped (after the containment killed its processes); with network, its egress proxy.
#[derive(Debug)]
pub(crate) struct Jail {
    prefix: Vec<String>,
    /// The workspace the shim checks it was given, when there is a shim.
    shim: Option<shim::Identity>,
    /// Declared before the uid: the proxy stops before the uid is given back.
    egress: Option<Egress>,
    /// The accounts the jail's processes see, their uid among them.
    accounts: Accounts,
    uid: Option<uids::UidLease>,
}

impl Jail {
    /// Prepares the jail an attempt in `workspace` starts in: opens the workspace once
    /// (following no link), takes a uid and hands the workspace to it through that
    /// descriptor (`isolated`), starts the egress proxy (with network), and probes the
    /// flags once. None with the sandbox off and the default policy; the error is the
    /// attempt's `sandbox_unavailable` failure.
    pub(crate) async fn prepare(
        policy: &SandboxPolicy,
        workspace: &Path,
    ) -> Result<Option<Jail>, String> {
        let resolved = settings::current();
        let unavailable = |reason: String| format!("{UNAVAILABLE}: {reason}");
        if resolved.mode == SandboxMode::Off {
            return match policy.is_unconfined() {
                true => Ok(None),
                false => Err(unavailable(format!(
                    "the task asks for sandbox_network {} and sandbox_read_only {}, and this \
                     worker's sandbox is off (KEEL_SANDBOX=off)",
                    policy.network, policy.read_only
                ))),
            };
        }
        let shim_binary = resolved.settings.shim.as_deref();
        if policy.network && shim_binary.is_none() {
            return Err(unavailable(
                "this process has no sandbox shim to give runs their network (a worker \
                 started by the keel binary has one)"
                    .into(),
            ));
        }
        let (identity, uid) = take_workspace(resolved, workspace)
            .await
            .map_err(unavailable)?;
        let egress = match policy.network {
            true => Some(start_egress(resolved, policy, uid.as_ref()).map_err(unavailable)?),
            false => None,
        };
        let binds = Binds {
            workspace,
            shim: shim_binary,
            egress: egress.as_ref(),
        };
        let inside = match &uid {
            Some(lease) => lease.uid,
            None => *resolved.settings.uids.start(),
        };
        let jail = Jail {
            prefix: prefix(resolved, policy, binds),
            shim: shim_binary.map(|_| identity),
            egress,
            accounts: Accounts::with(inside, &super::env::home(workspace)),
            uid,
        };
        jail.probe(resolved.mode, policy)
            .await
            .map_err(unavailable)?;
        Ok(Some(jail))
    }

    /// The argv that runs `argv` inside the namespaces, behind the shim where there is one.
    pub(crate) fn wrap(&self, argv: &[String]) -> Vec<String> {
        let command = match self.shim {
            Some(identity) => shim::argv(identity, self.egress.is_some(), argv),
            None => argv.to_vec(),
        };
        self.prefix.iter().cloned().chain(command).collect()
    }

    /// What the jail's processes sent and received through the proxy so far.
    pub(crate) fn egress(&self) -> Option<EgressSummary> {
        self.egress.as_ref().map(Egress::summary)
    }

    /// Starts the jail as its uid (`isolated`; the supplementary groups go with the
    /// switch from root), handing bubblewrap its account files and `secret`.
    pub(crate) fn apply(
        &self,
        command: &mut tokio::process::Command,
        secret: Option<&InheritedSecret>,
    ) -> std::io::Result<()> {
        if let Some(lease) = &self.uid {
            command.uid(lease.uid).gid(lease.uid);
        }
        let mut handed = Vec::from(self.accounts.handed()?);
        handed.extend(secret.map(InheritedSecret::handed).transpose()?);
        inherited::hand_over(command, handed);
        Ok(())
    }

    async fn probe(&self, mode: SandboxMode, policy: &SandboxPolicy) -> Result<(), String> {
        static PROBED: Mutex<Option<HashSet<Probed>>> = Mutex::new(None);
        let key = (mode.as_str(), policy.network, policy.read_only);
        if PROBED
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|done| done.contains(&key))
        {
            return Ok(());
        }
        self.try_enter().await.map_err(|reason| {
            format!(
                "this host cannot provide the sandbox (KEEL_SANDBOX={}, sandbox_network {}, \
                 sandbox_read_only {}): {reason}",
                mode.as_str(),
                policy.network,
                policy.read_only
            )
        })?;
        PROBED.lock().unwrap().get_or_insert_default().insert(key);
        Ok(())
    }

    async fn try_enter(&self) -> Result<(), String> {
        let argv = self.wrap(&["true".to_string()]);
        let mut command = tokio::process::Command::new(&argv[0]);
        command
            .args(&argv[1..])
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        self.apply(&mut command, None)
            .map_err(|error| format!("the jail's account files: {error}"))?;
        let output = command.output().await.map_err(|error| {
            format!(
                "{}: {error} (is bubblewrap installed? KEEL_SANDBOX_BWRAP)",
                argv[0]
            )
        })?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(match stderr.trim() {
            "" => format!("{} {}", argv[0], output.status),
            reason => reason.to_string(),
        })
    }
}

/// Opens the workspace once, following no link, for its identity, and in `isolated` mode
/// takes a uid for the attempt and gives it the workspace through that descriptor; blocking
/// file work, off the async runtime.
async fn take_workspace(
    resolved: &Resolved,
    workspace: &Path,
) -> Result<(shim::Identity, Option<uids::UidLease>), String> {
    let settings = &resolved.settings;
    let lease = match resolved.mode {
        SandboxMode::Isolated => Some(uids::acquire(&settings.uids, &settings.uid_locks)?),
        _ => None,
    };
    let (uid, workspace) = (lease.as_ref().map(|l| l.uid), workspace.to_path_buf());
    let identity = tokio::task::spawn_blocking(move || {
        let opened = crate::file::beneath::open_workspace(&workspace)
            .map_err(|e| format!("opening the workspace {}: {e}", workspace.display()))?;
        if let Some(uid) = uid {
            owner::check_reachable(&workspace)?;
            owner::hand_over(&opened, uid)?;
        }
        let stat = nix::sys::stat::fstat(&opened).map_err(|e| e.to_string())?;
        Ok::<_, String>(shim::Identity {
            device: stat.st_dev,
            inode: stat.st_ino,
        })
    })
    .await
    .map_err(|e| format!("handing the workspace over: {e}"))??;
    Ok((identity, lease))
}

/// What a jail binds besides the system and its workspace: the shim, where there is one,
/// and its egress proxy's socket.
struct Binds<'a> {
    workspace: &'a Path,
    shim: Option<&'a Path>,
    egress: Option<&'a Egress>,
}

/// Starts the jail's egress proxy on a socket of its own, which only the jail's uid may
/// connect to, letting through what the deployment allows the run's workspace.
fn start_egress(
    resolved: &Resolved,
    policy: &SandboxPolicy,
    uid: Option<&uids::UidLease>,
) -> Result<Egress, String> {
    static SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let dir = egress_directory()?;
    let name = format!(
        "{}-{}.sock",
        std::process::id(),
        SEQUENCE.fetch_add(1, Ordering::Relaxed)
    );
    let socket = dir.join(name);
    // Only this uid writes in the directory: a socket there by this name is one a worker
    // that died (kill -9) left behind, with the pid this process now has.
    let _ = std::fs::remove_file(&socket);
    let rules = Arc::new((resolved.settings.egress).for_workspace(policy.workspace_id.as_deref()));
    Egress::start(socket, uid.map(|lease| lease.uid), rules)
        .map_err(|e| format!("starting the run's egress proxy in {}: {e}", dir.display()))
}

/// The directory the proxies' sockets live in: this process's uid's own, which the jails'
/// uids may pass through (bubblewrap binds a socket as the jail's uid) but not list or
/// write. One that another uid made, or that others may write, is refused.
fn egress_directory() -> Result<PathBuf, String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    static DIRECTORY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIRECTORY
        .get_or_init(|| {
            let me = nix::unistd::geteuid().as_raw();
            let dir = std::env::temp_dir().join(format!("keel-egress-{me}"));
            let failed = |e: std::io::Error| format!("{}: {e}", dir.display());
            match std::fs::create_dir(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(failed(e)),
                _ => {}
            }
            let meta = std::fs::symlink_metadata(&dir).map_err(failed)?;
            if !meta.is_dir() || meta.uid() != me {
                return Err(format!("{} is not a directory of uid {me}", dir.display()));
            }
            let passable = std::fs::Permissions::from_mode(0o711);
            std::fs::set_permissions(&dir, passable).map_err(failed)?;
            Ok(dir)
        })
        .clone()
}

fn prefix(resolved: &Resolved, policy: &SandboxPolicy, binds: Binds) -> Vec<String> {
    let workspace = binds.workspace;
    let mut args: Vec<String> = [
        "--unshare-user",
        "--disable-userns",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--hostname",
        "keel-run",
        "--unshare-net",
        "--die-with-parent",
        "--new-session",
    ]
    .map(String::from)
    .into();
    if resolved.mode == SandboxMode::Namespaces {
        // Another uid inside than the worker's, even though it is the same one outside.
        let inner = resolved.settings.uids.start().to_string();
        args.extend(["--uid".into(), inner.clone(), "--gid".into(), inner]);
    }
    // The private /tmp first: the binds that follow may lie beneath it (a read-only path or
    // a workspace under /tmp), and a tmpfs mounted after them would hide them.
    args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"].map(String::from));
    let extra = resolved
        .settings
        .read_only_paths
        .iter()
        .map(PathBuf::as_path);
    for dir in SYSTEM_DIRS.iter().map(Path::new).chain(extra) {
        args.extend(bind("--ro-bind-try", dir));
    }
    for link in SYSTEM_LINKS.map(Path::new) {
        args.extend(system_link(link));
    }
    args.extend(Accounts::binds());
    let mode = if policy.read_only {
        "--ro-bind"
    } else {
        "--bind"
    };
    args.extend(bind(mode, workspace));
    if let Some(shim_binary) = binds.shim {
        // The shim is the jail's init: out of reach of the run's signals.
        args.push("--as-pid-1".into());
        args.extend(["--ro-bind".into(), path(shim_binary), shim::INSIDE.into()]);
    }
    if let Some(egress) = binds.egress {
        args.extend(egress_binds(egress));
    }
    args.extend(["--chdir".into(), path(workspace), "--".into()]);
    std::iter::once(path(&resolved.settings.bwrap))
        .chain(args)
        .collect()
}

/// The proxy's socket, read-only, and the variables that point the run's clients at the
/// shim.
fn egress_binds(egress: &Egress) -> Vec<String> {
    let socket = path(egress.socket());
    let mut args = vec!["--ro-bind".into(), socket, shim::SOCKET_INSIDE.into()];
    for (name, value) in shim::proxy_environment() {
        args.extend(["--setenv".into(), name.into(), value]);
    }
    args
}

fn bind(option: &str, dir: &Path) -> [String; 3] {
    [option.to_string(), path(dir), path(dir)]
}

/// `/bin` and the like: the same link inside where the host has a link, a read-only bind
/// where it has a directory, nothing where it has neither.
fn system_link(link: &Path) -> Vec<String> {
    match std::fs::read_link(link) {
        Ok(target) => vec!["--symlink".into(), path(&target), path(link)],
        Err(_) if link.is_dir() => bind("--ro-bind", link).into(),
        Err(_) => Vec::new(),
    }
}

fn path(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}
