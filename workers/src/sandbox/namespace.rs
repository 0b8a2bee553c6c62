//! The namespaces a task's sandbox flags ask for: a network namespace with only loopback
//! (`sandbox_network: false`) and a mount namespace, private to the run, in which the
//! workspace is a read-only bind mount of itself (`sandbox_read_only: true`). util-linux's
//! `unshare` enters them and execs the command, so it never runs outside them. Each run
//! first probes the same wrapper with `true`: when the host refuses (no `CAP_SYS_ADMIN`,
//! namespaces disabled, no `unshare`), the run fails with `sandbox_unavailable` and the
//! reason, instead of running unsandboxed.

use std::path::Path;
use std::process::Stdio;

use crate::SandboxPolicy;

/// The error code a run gets when the host cannot provide its sandbox.
const UNAVAILABLE: &str = "sandbox_unavailable";

/// Remounts the workspace (`$1`) read-only, then execs the command (the rest).
const READ_ONLY_SCRIPT: &str =
    r#"mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@""#;

/// The wrapper one run's command starts under.
#[derive(Debug)]
pub(crate) struct Isolation {
    prefix: Vec<String>,
}

impl Isolation {
    /// None when the policy asks for nothing beyond what runs get anyway.
    pub(crate) fn for_policy(policy: SandboxPolicy, workspace: &Path) -> Option<Isolation> {
        if policy == SandboxPolicy::default() {
            return None;
        }
        let mut prefix = vec!["unshare".to_string()];
        if !policy.network {
            prefix.push("--net".into());
        }
        if policy.read_only {
            // Private propagation: the read-only mount never reaches the host's namespace.
            prefix.extend(["--mount".into(), "--propagation".into(), "private".into()]);
            prefix.extend([
                "--".into(),
                "sh".into(),
                "-c".into(),
                READ_ONLY_SCRIPT.into(),
            ]);
            prefix.extend(["sh".into(), workspace.to_string_lossy().into_owned()]);
        } else {
            prefix.push("--".into());
        }
        Some(Isolation { prefix })
    }

    /// The argv that runs `argv` inside the namespaces.
    pub(crate) fn wrap(&self, argv: Vec<String>) -> Vec<String> {
        self.prefix.iter().cloned().chain(argv).collect()
    }

    /// Enters the namespaces once with `true`; the error, a run's `sandbox_unavailable`
    /// failure, says why the host refused.
    pub(crate) async fn probe(&self, policy: SandboxPolicy) -> Result<(), String> {
        self.try_enter().await.map_err(|reason| {
            format!(
                "{UNAVAILABLE}: this host cannot provide the task's sandbox (sandbox_network {}, \
                 sandbox_read_only {}): {reason}",
                policy.network, policy.read_only
            )
        })
    }

    async fn try_enter(&self) -> Result<(), String> {
        let argv = self.wrap(vec!["true".into()]);
        let output = tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .output()
            .await
            .map_err(|error| format!("{}: {error}", argv[0]))?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(match stderr.trim() {
            "" => format!("{} {}", argv.join(" "), output.status),
            reason => reason.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_needs_no_wrapper() {
        let workspace = Path::new("/tmp");
        assert!(Isolation::for_policy(SandboxPolicy::default(), workspace).is_none());
        let offline = SandboxPolicy {
            network: false,
            ..SandboxPolicy::default()
        };
        let argv = Isolation::for_policy(offline, workspace)
            .unwrap()
            .wrap(vec!["true".into()]);
        assert_eq!(argv, ["unshare", "--net", "--", "true"]);
    }

    /// Whatever the host, a workspace that cannot be mounted makes the probe fail, with the
    /// code and the reason, rather than let the run go ahead.
    #[tokio::test]
    async fn a_refused_sandbox_fails_the_probe_with_its_reason() {
        let policy = SandboxPolicy {
            network: true,
            read_only: true,
        };
        let isolation =
            Isolation::for_policy(policy, Path::new("/nonexistent/keel-workspace")).unwrap();
        let error = isolation.probe(policy).await.unwrap_err();
        assert!(error.starts_with("sandbox_unavailable: "), "{error}");
        assert!(error.contains("sandbox_read_only true"), "{error}");
        // The mount's complaint where namespaces work, unshare's where they do not.
        let reason = ["/nonexistent/keel-workspace", "unshare"];
        assert!(reason.iter().any(|r| error.contains(r)), "{error}");
    }
}
