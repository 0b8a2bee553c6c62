//! What runs around a task's attempts in its workspace, by the worker that runs the attempt,
//! with the run's environment and sandbox: the clone of the task's repository into a new
//! workspace, and an imported task's workflow hooks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_workers::agent::run_loop::LoopOutcome;
use keel_workers::hooks::HookRun;
use keel_workers::{ContextError, Outcome, RunContext, StepResult};
use serde_json::json;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use keel_workers::media::Secret;

use super::context::FencedContext;
use crate::tasks::Hooks;

/// The workflow hooks (`after_create`, `before_run`, `after_run`) around an imported task's
/// attempts, run by the worker that runs the attempt, in its workspace, with its
/// environment and sandbox.
pub(crate) struct AttemptHooks {
    pub(super) hooks: Hooks,
    /// The repository a new workspace starts as a clone of, before `after_create`.
    pub(super) repo: Option<RepoClone>,
    pub(super) workspace: PathBuf,
    pub(super) env: Vec<(String, String)>,
    pub(super) sandbox: keel_workers::SandboxPolicy,
}

/// A task's `repo`, `base_branch` and credential, and how long the clone may take (the
/// run's timeout).
pub(crate) struct RepoClone {
    pub(super) url: String,
    pub(super) base_branch: Option<String>,
    /// The `Authorization` header value the clone sends, or why there is none to send.
    pub(super) credential: Result<Option<Secret>, String>,
    pub(super) timeout: Duration,
}

/// HTTP basic authorization of a repository credential: `user:password`, or a token alone,
/// sent as GitHub's `x-access-token:<token>`.
pub(super) fn basic_authorization(credential: &str) -> Secret {
    let pair = match credential.contains(':') {
        true => credential.to_string(),
        false => format!("x-access-token:{credential}"),
    };
    Secret::new(format!("Basic {}", STANDARD.encode(pair)))
}

/// Makes the workspace a clone of `$KEEL_REPO_URL` at `$KEEL_REPO_BRANCH` (the default
/// branch, detached, when empty). `init` and `fetch` rather than `clone`: the workspace
/// already holds the run's `.keel/` (its home and temporary directories). The values come
/// in the environment, so nothing of them is parsed as shell.
const CLONE_SCRIPT: &str = r#"set -e
git init -q
git remote add origin "$KEEL_REPO_URL"
if [ -n "$KEEL_REPO_BRANCH" ]; then
  git fetch -q origin "refs/heads/$KEEL_REPO_BRANCH"
  git checkout -q -b "$KEEL_REPO_BRANCH" FETCH_HEAD
else
  git fetch -q origin HEAD
  git checkout -q --detach FETCH_HEAD
fi"#;

/// What an attempt within hooks ends with: a process run's `Outcome`, or an agent loop's
/// `LoopOutcome`, which can also wait for an approval.
pub(crate) trait Hooked: From<Outcome> {
    /// Whether the attempt was interrupted: `after_run` then does not run.
    fn interrupted(&self) -> bool;
}

impl Hooked for Outcome {
    fn interrupted(&self) -> bool {
        *self == Outcome::Interrupted
    }
}

impl Hooked for LoopOutcome {
    fn interrupted(&self) -> bool {
        *self == LoopOutcome::Ended(Outcome::Interrupted)
    }
}

impl AttemptHooks {
    /// Runs the attempt `body` between the task's `before_run` and `after_run` hooks
    /// (Symphony's rules), after `after_create` in a workspace not prepared yet ([`prepare`]):
    /// an `after_create` or a `before_run` that fails ends the attempt failed with
    /// `hook_failed:` and `body` never runs; an `after_run` failure is logged and ignored.
    /// Each hook's output is an artifact of the run.
    ///
    /// [`prepare`]: AttemptHooks::prepare
    pub(super) async fn around<O: Hooked>(
        &self,
        ctx: &FencedContext,
        body: impl Future<Output = O>,
    ) -> O {
        if let Err(stopped) = self.prepare(ctx).await {
            return stopped.into();
        }
        if let Some(script) = &self.hooks.before_run {
            let ran = match self.run_hook(ctx, "before_run", script).await {
                Ok(ran) => ran,
                Err(stopped) => return stopped.into(),
            };
            if let Some(error) = ran.failure() {
                let failed = Outcome::Failed {
                    exit_code: None,
                    error,
                };
                return failed.into();
            }
        }
        let outcome = body.await;
        if let (Some(script), false) = (&self.hooks.after_run, outcome.interrupted()) {
            match self.run_hook(ctx, "after_run", script).await {
                Ok(ran) => {
                    if let Some(failure) = ran.failure() {
                        let run_id = &ctx.shared.run_id;
                        tracing::warn!(%run_id, %failure, "after_run failed; ignored");
                    }
                }
                Err(stopped) => {
                    let run_id = &ctx.shared.run_id;
                    tracing::warn!(%run_id, ?stopped, "after_run's output was not recorded");
                }
            }
        }
        outcome
    }

    /// Clones the task's repository and runs `after_create` in a workspace no attempt
    /// prepared yet (a new one, or one whose preparation was cut short), then marks it
    /// prepared: once per workspace, in the worker, once the run was admitted (approved,
    /// where the policy gates it). A failure ends the attempt and empties the workspace, so
    /// the next attempt's preparation starts afresh (Symphony); the directory stays, as the
    /// task's `in_place` directory.
    async fn prepare(&self, ctx: &FencedContext) -> Result<(), Outcome> {
        let workspace = &self.workspace;
        if keel_workers::hooks::is_prepared(workspace) {
            return Ok(());
        }
        if let Some(repo) = &self.repo {
            self.clone_repo(ctx, repo).await?;
        }
        if let Some(script) = &self.hooks.after_create {
            let ran = self.run_hook(ctx, "after_create", script).await?;
            if let Some(error) = ran.failure() {
                return Err(self.unprepared(ctx, error).await);
            }
        }
        keel_workers::hooks::mark_prepared(workspace)
            .await
            .map_err(|error| Outcome::Failed {
                exit_code: None,
                error: format!("workspace_unavailable: {error}"),
            })
    }

    /// Clones the task's repository into the workspace, as a `workspace_clone` step with
    /// the clone's output as artifacts. A failure ends the attempt failed with git's
    /// message and empties the workspace, so the next attempt clones afresh.
    async fn clone_repo(&self, ctx: &FencedContext, repo: &RepoClone) -> Result<(), Outcome> {
        let input = json!({ "repo": repo.url, "base_branch": repo.base_branch });
        let step = ctx
            .start_step("workspace_clone", input)
            .await
            .map_err(stopped)?;
        let credential = match &repo.credential {
            Ok(credential) => credential,
            Err(why) => {
                let failed = StepResult::Failed { error: why.clone() };
                ctx.finish_step(&step, failed).await.map_err(stopped)?;
                let error = format!("clone_failed: {why}");
                return Err(self.unprepared(ctx, error).await);
            }
        };
        let mut env = self.env.clone();
        // For the clone's git alone, in its environment: neither the workspace's git
        // configuration nor the run's processes ever hold it.
        if let Some(header) = credential {
            env.extend([
                ("GIT_CONFIG_COUNT".to_string(), "1".to_string()),
                (
                    "GIT_CONFIG_KEY_0".to_string(),
                    "http.extraHeader".to_string(),
                ),
                (
                    "GIT_CONFIG_VALUE_0".to_string(),
                    format!("Authorization: {}", header.expose()),
                ),
            ]);
        }
        env.extend([
            ("KEEL_REPO_URL".to_string(), repo.url.clone()),
            (
                "KEEL_REPO_BRANCH".to_string(),
                repo.base_branch.clone().unwrap_or_default(),
            ),
            // A repository that asks for credentials fails rather than waits for them.
            ("GIT_TERMINAL_PROMPT".to_string(), "0".to_string()),
        ]);
        let (workspace, cancel) = (&self.workspace, ctx.cancellation());
        let ran = keel_workers::hooks::run(
            "clone",
            CLONE_SCRIPT,
            workspace,
            &env,
            self.sandbox,
            repo.timeout,
            cancel,
        )
        .await
        .ok_or(Outcome::Interrupted)?;
        ctx.shared.record_hook(&ran).await.map_err(stopped)?;
        let result = match &ran.error {
            None => StepResult::Completed {
                output: json!({ "exit_code": ran.exit_code }),
            },
            Some(error) => StepResult::Failed {
                error: format!("git {error}"),
            },
        };
        ctx.finish_step(&step, result).await.map_err(stopped)?;
        match ran.error {
            None => Ok(()),
            Some(error) => Err(self
                .unprepared(ctx, format!("clone_failed: git {error}"))
                .await),
        }
    }

    /// Ends an attempt whose workspace preparation (the clone, `after_create`) failed with
    /// `error`, emptying the workspace so the next attempt prepares it afresh.
    async fn unprepared(&self, ctx: &FencedContext, error: String) -> Outcome {
        if let Err(failed) = empty(&self.workspace).await {
            let run_id = &ctx.shared.run_id;
            tracing::warn!(%run_id, %failed, "emptying a workspace whose preparation failed");
        }
        Outcome::Failed {
            exit_code: None,
            error,
        }
    }

    /// Runs one hook and records its output; Err: how the attempt stops instead (it was
    /// interrupted, or the output could not be written).
    async fn run_hook(
        &self,
        ctx: &FencedContext,
        hook: &str,
        script: &str,
    ) -> Result<HookRun, Outcome> {
        let timeout = self.hooks.timeout();
        let (workspace, env, cancel) = (&self.workspace, &self.env, ctx.cancellation());
        let ran =
            keel_workers::hooks::run(hook, script, workspace, env, self.sandbox, timeout, cancel)
                .await
                .ok_or(Outcome::Interrupted)?;
        ctx.shared.record_hook(&ran).await.map_err(stopped)?;
        Ok(ran)
    }
}

/// How an attempt stops when a write of its record fails: interrupted, or retried.
fn stopped(error: ContextError) -> Outcome {
    match error {
        ContextError::Interrupted => Outcome::Interrupted,
        ContextError::Runtime(error) => Outcome::Retry { error },
    }
}

/// Removes everything in `directory` but the directory itself. Nothing of the run's is
/// running then, and `remove_dir_all` removes symbolic links, never what they point to.
async fn empty(directory: &Path) -> std::io::Result<()> {
    let mut entries = tokio::fs::read_dir(directory).await?;
    while let Some(entry) = entries.next_entry().await? {
        if entry.file_type().await?.is_dir() {
            tokio::fs::remove_dir_all(entry.path()).await?;
        } else {
            tokio::fs::remove_file(entry.path()).await?;
        }
    }
    Ok(())
}
