//! Keel's executors. They run one attempt of a run (a shell command, a git command, a file
//! operation) and report what happened through [`RunContext`], the only way they reach the
//! runtime: no SQL, no queue here. The runtime implements the context with fenced database
//! writes; the tests implement it in memory. The [`agent`] loop's context extends it with
//! model calls and tool results ([`agent::run_loop::AgentContext`]); the [`media`] executors,
//! which speak to media vendors rather than run anything, have a context of their own,
//! [`media::MediaContext`].
// Denied, not forbidden, for the two exceptions: joining a run's cgroups and taking its
// rlimits between fork and exec (`sandbox::entry`), which needs `pre_exec`, and clearing the
// environment block a server process started with (`sandbox::seal`).
#![deny(unsafe_code)]

mod address;
pub mod agent;
mod context;
mod file;
pub mod hooks;
pub mod media;
mod process;
mod sandbox;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use context::{ArtifactHandle, ContextError, OutputStream, RunContext, StepHandle, StepResult};
pub use file::{validate_relative_path, write_beneath};
pub use sandbox::{
    DEFAULT_LIMITS as DEFAULT_RUN_LIMITS, DEFAULT_UID_LOCKS as DEFAULT_SANDBOX_UID_LOCKS,
    DEFAULT_UIDS as DEFAULT_SANDBOX_UIDS, EgressRules, EgressSummary, INHERITED_PATH,
    InheritedSecret, MIN_NOFILE, MIN_PIDS, Refusal, RunLimits, SandboxMode, SandboxSettings,
    configure as configure_sandbox, containment_name, limits_in_effect, open_workspace_root,
    parse_memory, seal, shim,
};

/// What a run executes, validated by the runtime before it reaches an executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Execution {
    /// `sh -c <command>` in the workspace.
    Shell { command: String },
    /// `git <args…>` in the workspace; the command is split like a POSIX shell would.
    Git { command: String },
    /// A file operation on a path relative to the workspace.
    File {
        path: String,
        content: Option<String>,
        operation: FileOperation,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOperation {
    Write,
    Append,
    Delete,
}

/// One attempt's inputs: what to run, where, and for how long at most.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub execution: Execution,
    /// The directory the run works in; it exists when the executor starts.
    pub workspace: PathBuf,
    pub timeout: Option<Duration>,
    /// The runtime's variables for processes the run starts (the run's `KEEL_RUN_*`-style
    /// ids, the operator's passthrough). A child sees these, `PATH`, `LANG`, `HOME` and
    /// `TMPDIR` (both inside the workspace), and nothing else of the worker's environment.
    pub env: Vec<(String, String)>,
    /// What the run's shell and git children may reach.
    pub sandbox: SandboxPolicy,
    /// For a resumed run, where the run it resumes stopped; recorded in the step input.
    pub checkpoint: Option<serde_json::Value>,
}

/// A task's sandbox flags (`sandbox_network`, `sandbox_read_only`), and whose task it is.
/// A run whose host cannot provide what the flags ask for fails with `sandbox_unavailable`;
/// it never runs without them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPolicy {
    /// False: children run in a new network namespace that has only loopback.
    pub network: bool,
    /// True: children see the workspace mounted read-only.
    pub read_only: bool,
    /// The task's workspace (tenant): the deployment's egress allowances for it apply
    /// besides those for every workspace. None: only the latter.
    pub workspace_id: Option<Arc<str>>,
}

impl SandboxPolicy {
    /// Whether the flags ask for nothing a worker without a sandbox lacks.
    pub fn is_unconfined(&self) -> bool {
        self.network && !self.read_only
    }
}

impl Default for SandboxPolicy {
    /// As runs were before the flags: network allowed, workspace writable.
    fn default() -> Self {
        SandboxPolicy {
            network: true,
            read_only: false,
            workspace_id: None,
        }
    }
}

/// How an attempt ended. The runtime turns it into the run's terminal state. (An agent
/// loop may also stop to wait for an approval: [`agent::run_loop::LoopOutcome`].)
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Completed {
        exit_code: Option<i32>,
    },
    Failed {
        exit_code: Option<i32>,
        error: String,
    },
    /// The attempt stopped because the run was cancelled or the lease was lost: the
    /// runtime must write nothing more for it.
    Interrupted,
    /// The runtime failed under the attempt (its store was unreachable): try again later.
    Retry {
        error: String,
    },
}

/// Runs one attempt to its end.
pub async fn execute<C: RunContext>(spec: &RunSpec, ctx: &C) -> Outcome {
    let result = match &spec.execution {
        Execution::Shell { command } => {
            let argv = vec!["sh".to_string(), "-c".to_string(), command.clone()];
            process::run(ctx, "shell", argv, spec).await
        }
        Execution::Git { command } => match shlex::split(command) {
            Some(args) => {
                let argv = std::iter::once("git".to_string()).chain(args).collect();
                process::run(ctx, "git", argv, spec).await
            }
            None => Ok(Outcome::Failed {
                exit_code: None,
                error: "git_command has unbalanced quotes".into(),
            }),
        },
        Execution::File {
            path,
            content,
            operation,
        } => file::run(ctx, spec, path, content.as_deref(), *operation).await,
    };
    result.unwrap_or_else(Outcome::from)
}

/// An attempt stopped by its context: interrupted, retried after a runtime error, or
/// failed by a refused write.
impl From<ContextError> for Outcome {
    fn from(error: ContextError) -> Self {
        match error {
            ContextError::Interrupted => Outcome::Interrupted,
            ContextError::Runtime(error) => Outcome::Retry { error },
            ContextError::Refused(error) => Outcome::Failed {
                exit_code: None,
                error,
            },
        }
    }
}

#[cfg(test)]
mod tests;

/// Makes rustls on ring the process's TLS provider, once, before any client is built: the
/// reqwest 0.13 clients (the MCP SDK's, the OTLP exporter's) are built on rustls without a
/// provider of their own and fail without one; the 0.12 clients bring ring themselves.
pub fn install_tls_provider() {
    // Err: one is installed already, which is all this asks.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
