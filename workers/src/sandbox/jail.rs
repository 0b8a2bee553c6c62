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
//! - IPC, UTS and cgroup namespaces, and a network namespace with only loopback when the
//!   task says `sandbox_network: false`.
//!
//! Each distinct set of flags is probed once per process with `true`: when the host
//! refuses (no bubblewrap, namespaces disabled), the attempt fails with
//! `sandbox_unavailable` and the reason, instead of running outside.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;

use super::settings::{self, Resolved, SandboxMode};
use super::{owner, uids};
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
/// dropped (after the containment killed its processes).
#[derive(Debug)]
pub(crate) struct Jail {
    prefix: Vec<String>,
    uid: Option<uids::UidLease>,
}

impl Jail {
    /// Prepares the jail an attempt in `workspace` starts in: takes a uid and hands the
    /// workspace to it (`isolated`), and probes the flags once. None with the sandbox off
    /// and the default policy; the error is the attempt's `sandbox_unavailable` failure.
    pub(crate) async fn prepare(
        policy: SandboxPolicy,
        workspace: &Path,
    ) -> Result<Option<Jail>, String> {
        let resolved = settings::current();
        let unavailable = |reason: String| format!("{UNAVAILABLE}: {reason}");
        if resolved.mode == SandboxMode::Off {
            return match policy == SandboxPolicy::default() {
                true => Ok(None),
                false => Err(unavailable(format!(
                    "the task asks for sandbox_network {} and sandbox_read_only {}, and this \
                     worker's sandbox is off (KEEL_SANDBOX=off)",
                    policy.network, policy.read_only
                ))),
            };
        }
        let uid = match resolved.mode {
            SandboxMode::Isolated => Some(
                take_workspace(resolved, workspace)
                    .await
                    .map_err(unavailable)?,
            ),
            _ => None,
        };
        let jail = Jail {
            prefix: prefix(resolved, policy, workspace),
            uid,
        };
        jail.probe(resolved.mode, policy)
            .await
            .map_err(unavailable)?;
        Ok(Some(jail))
    }

    /// The argv that runs `argv` inside the namespaces.
    pub(crate) fn wrap(&self, argv: &[String]) -> Vec<String> {
        self.prefix.iter().chain(argv).cloned().collect()
    }

    /// Starts the jail as its uid (`isolated`); the supplementary groups go with the
    /// switch from root.
    pub(crate) fn apply(&self, command: &mut tokio::process::Command) {
        if let Some(lease) = &self.uid {
            command.uid(lease.uid).gid(lease.uid);
        }
    }

    async fn probe(&self, mode: SandboxMode, policy: SandboxPolicy) -> Result<(), String> {
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
        self.apply(&mut command);
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

/// Takes a uid for the attempt and gives it the workspace; blocking file work, off the
/// async runtime.
async fn take_workspace(resolved: &Resolved, workspace: &Path) -> Result<uids::UidLease, String> {
    let lease = uids::acquire(&resolved.settings.uids)?;
    let (uid, workspace) = (lease.uid, workspace.to_path_buf());
    tokio::task::spawn_blocking(move || {
        owner::check_reachable(&workspace)?;
        owner::hand_over(&workspace, uid)
    })
    .await
    .map_err(|e| format!("handing the workspace over: {e}"))??;
    Ok(lease)
}

fn prefix(resolved: &Resolved, policy: SandboxPolicy, workspace: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--unshare-user",
        "--disable-userns",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--hostname",
        "keel-run",
        "--die-with-parent",
        "--new-session",
    ]
    .map(String::from)
    .into();
    if !policy.network {
        args.push("--unshare-net".into());
    }
    if resolved.mode == SandboxMode::Namespaces {
        // Another uid inside than the worker's, even though it is the same one outside.
        let inner = resolved.settings.uids.start().to_string();
        args.extend(["--uid".into(), inner.clone(), "--gid".into(), inner]);
    }
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
    args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"].map(String::from));
    let mode = if policy.read_only {
        "--ro-bind"
    } else {
        "--bind"
    };
    args.extend(bind(mode, workspace));
    args.extend(["--chdir".into(), path(workspace), "--".into()]);
    std::iter::once(path(&resolved.settings.bwrap))
        .chain(args)
        .collect()
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
