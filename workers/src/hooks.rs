//! Workspace hooks (Symphony's `after_create`, `before_run`, `after_run`, `before_remove`):
//! a shell script run with `sh -lc` in a workspace, started through
//! [`crate::process::start`], so it gets a shell run's containment, clean environment and
//! namespaces, and everything it started is killed when it ends, times out or is cancelled.
//! What it printed is kept, each stream bounded, for the caller to record.
//!
//! Whether a workspace was prepared (its `after_create` exited 0, or it has none) is a
//! marker file inside it, which lives and goes with the directory.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::process::{self, Exit, collect};
use std::process::Stdio;

use crate::SandboxPolicy;
use crate::sandbox::{EgressSummary, InheritedSecret};

/// Written in a workspace once its preparation finished; `.keel/` is the runs' own
/// directory there, which git ignores.
const PREPARED_MARKER: &str = ".keel/workspace-prepared";

/// The most of each stream a hook's record keeps; the rest is named by a marker.
pub const MAX_HOOK_OUTPUT_BYTES: usize = 64 * 1024;
/// How much of stderr's end a failure's message carries.
const ERROR_TAIL_BYTES: usize = 512;

/// One hook's run: how it ended and what it printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HookRun {
    /// `after_create`, `before_run`, `after_run` or `before_remove`.
    pub hook: String,
    pub exit_code: Option<i32>,
    /// Why it failed (a non-zero exit, a signal, the timeout, a start that failed); None
    /// when it exited 0.
    pub error: Option<String>,
    pub stdout: String,
    pub stderr: String,
    /// What it sent and received through the egress proxy, and what was refused; None
    /// when it had no network or never used it.
    pub egress: Option<EgressSummary>,
}

impl HookRun {
    pub fn succeeded(&self) -> bool {
        self.error.is_none()
    }

    /// The run's `last_error` (or the item's) for a hook that failed: `hook_failed:` and
    /// the cause.
    pub fn failure(&self) -> Option<String> {
        self.error
            .as_ref()
            .map(|error| format!("hook_failed: {} {error}", self.hook))
    }
}

/// A script to run in a workspace, and what it runs with.
pub struct Script<'a> {
    /// What its record is called: a workflow hook's name, or `clone`, `commit`, `push`.
    pub hook: &'a str,
    /// Run with `sh -lc`.
    pub script: &'a str,
    pub workspace: &'a Path,
    /// The runtime's variables for it.
    pub env: &'a [(String, String)],
    pub sandbox: SandboxPolicy,
    /// At its fd 3 ([`crate::INHERITED_PATH`]).
    pub secret: Option<&'a InheritedSecret>,
    /// It and everything it started are killed after this long.
    pub timeout: Duration,
}

/// Runs `script`; None when `cancel` fired first.
pub async fn run(script: Script<'_>, cancel: &CancellationToken) -> Option<HookRun> {
    let Script {
        hook,
        script,
        workspace,
        env,
        sandbox,
        secret,
        timeout,
    } = script;
    let argv = vec!["sh".to_string(), "-lc".to_string(), script.to_string()];
    let ran = |exit_code, error: Option<String>, stdout, stderr| HookRun {
        hook: hook.to_string(),
        exit_code,
        error,
        stdout,
        stderr,
        egress: None,
    };
    let started = process::start_with(&argv, workspace, env, &sandbox, Stdio::null(), secret);
    let (mut child, mut containment) = match started.await {
        Ok(started) => started,
        Err(error) => return Some(ran(None, Some(error), String::new(), String::new())),
    };
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let ended = CancellationToken::new();
    let waited = process::wait_and_end(&mut child, &mut containment, Some(timeout), cancel, &ended);
    let cap = MAX_HOOK_OUTPUT_BYTES;
    let (exit, stdout, stderr) = tokio::join!(
        waited,
        collect(stdout, cap, &ended),
        collect(stderr, cap, &ended)
    );
    let exit = exit?;
    let exit_code = match &exit {
        Exit::Status(status) => status.code(),
        Exit::TimedOut(_) => None,
    };
    let error = match exit {
        Exit::Status(status) if status.success() => None,
        Exit::Status(status) => Some(match status.code() {
            Some(code) => format!("exited with code {code}{}", tail(&stderr)),
            None => format!("was killed by a signal{}", tail(&stderr)),
        }),
        Exit::TimedOut(limit) => Some(format!(
            "timed out after {} ms; it and everything it started were killed",
            limit.as_millis()
        )),
    };
    let error = error.map(|error| containment.blame_limits(error));
    let egress = containment.egress().filter(|egress| !egress.is_empty());
    Some(HookRun {
        egress: egress.cloned(),
        ..ran(exit_code, error, stdout, stderr)
    })
}

/// Whether the workspace's preparation finished (its marker is a regular file).
pub fn is_prepared(workspace: &Path) -> bool {
    std::fs::symlink_metadata(workspace.join(PREPARED_MARKER)).is_ok_and(|meta| meta.is_file())
}

/// Marks the workspace prepared. Its runs may have planted links in it (at `.keel`, at the
/// marker): the marker is written without following any.
pub async fn mark_prepared(workspace: &Path) -> Result<(), String> {
    crate::file::write_beneath(workspace, PREPARED_MARKER, b"")
        .await
        .map_err(|e| format!("marking {PREPARED_MARKER} prepared: {e}"))
}

/// `: ` and the end of stderr, for a failure's message; nothing when stderr is empty.
fn tail(stderr: &str) -> String {
    let text = stderr.trim();
    if text.is_empty() {
        return String::new();
    }
    let mut start = text.len().saturating_sub(ERROR_TAIL_BYTES);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!(": {}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn hook(script: &str, timeout: Duration) -> HookRun {
        let dir = tempfile::tempdir().unwrap();
        // A jail with network needs the keel binary as its shim: tests/it runs those.
        let policy = SandboxPolicy {
            network: false,
            read_only: false,
            workspace_id: None,
        };
        let never = CancellationToken::new();
        let script = Script {
            hook: "before_run",
            script,
            workspace: dir.path(),
            env: &[],
            sandbox: policy,
            secret: None,
            timeout,
        };
        run(script, &never).await.unwrap()
    }

    #[tokio::test]
    async fn the_prepared_marker_is_never_written_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        let workspace = dir.path().join("ws");
        std::fs::create_dir(&workspace).unwrap();
        assert!(!is_prepared(&workspace));
        mark_prepared(&workspace).await.unwrap();
        assert!(is_prepared(&workspace));
        // A run swaps the marker for a link to a file outside: it is not written through,
        // and a link does not count as prepared.
        let outside = dir.path().join("outside.txt");
        std::fs::write(&outside, "kept").unwrap();
        let marker = workspace.join(PREPARED_MARKER);
        std::fs::remove_file(&marker).unwrap();
        std::os::unix::fs::symlink(&outside, &marker).unwrap();
        assert!(!is_prepared(&workspace));
        assert!(mark_prepared(&workspace).await.is_err());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "kept");
        // Nor through a link at `.keel`.
        std::fs::remove_dir_all(workspace.join(".keel")).unwrap();
        std::os::unix::fs::symlink(dir.path(), workspace.join(".keel")).unwrap();
        assert!(mark_prepared(&workspace).await.is_err());
        assert!(!dir.path().join("workspace-prepared").exists());
    }

    #[tokio::test]
    async fn a_hook_reports_its_output_and_how_it_ended() {
        let ok = hook("echo out; echo err >&2", Duration::from_secs(10)).await;
        assert!(ok.succeeded(), "{ok:?}");
        assert_eq!((ok.stdout.as_str(), ok.stderr.as_str()), ("out\n", "err\n"));
        let failed = hook("echo nope >&2; exit 3", Duration::from_secs(10)).await;
        assert_eq!(failed.exit_code, Some(3));
        assert_eq!(
            failed.failure().as_deref(),
            Some("hook_failed: before_run exited with code 3: nope")
        );
    }

    #[tokio::test]
    async fn a_hook_past_its_timeout_is_killed_and_its_output_bounded() {
        let started = std::time::Instant::now();
        let slow = hook("sleep 30", Duration::from_millis(300)).await;
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(slow.exit_code, None);
        assert!(slow.error.unwrap().starts_with("timed out after 300 ms"));
        let loud = hook(
            "head -c 200000 /dev/zero | tr '\\0' a",
            Duration::from_secs(10),
        )
        .await;
        assert!(loud.stdout.len() < MAX_HOOK_OUTPUT_BYTES + 100);
        assert!(
            loud.stdout
                .ends_with("[… truncated: 200,000 bytes total]\n"),
            "{}",
            &loud.stdout[65_000..]
        );
    }
}
