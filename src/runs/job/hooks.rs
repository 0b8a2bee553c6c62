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

/// A task's `repo`, `base_branch` and credential, how long the clone (or the push) may
/// take (the run's timeout), and where a completed run's result goes.
pub(crate) struct RepoClone {
    pub(super) url: String,
    pub(super) base_branch: Option<String>,
    /// The `Authorization` header value the clone and the push send, or why there is none
    /// to send.
    pub(super) credential: Result<Option<Secret>, String>,
    pub(super) timeout: Duration,
    pub(super) push: Option<ResultPush>,
}

/// The commit a completed run's changes become and the branch it is pushed to. Its message
/// and dates are the run's, so an attempt that repeats the push (a takeover) with the same
/// changes makes the same commit, which the remote already has.
pub(crate) struct ResultPush {
    pub(super) branch: String,
    pub(super) message: String,
    /// `@<seconds> +0000`, as git takes a date.
    pub(super) date: String,
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
/// `refs/keel/base` remembers where the clone started (a push needs changes past it), and
/// the run's own `.keel/` is never part of a commit.
const CLONE_SCRIPT: &str = r#"set -e
git init -q
git remote add origin "$KEEL_REPO_URL"
if [ -n "$KEEL_REPO_BRANCH" ]; then
  git fetch -q origin "refs/heads/$KEEL_REPO_BRANCH"
  git checkout -q -b "$KEEL_REPO_BRANCH" FETCH_HEAD
else
  git fetch -q origin HEAD
  git checkout -q --detach FETCH_HEAD
fi
git update-ref refs/keel/base HEAD
printf '/.keel/\n' >> .git/info/exclude"#;

/// Commits the workspace's changes (hooks off: the run may have written the workspace's
/// git configuration) and, when there is anything past `refs/keel/base`, copies the result
/// into a bare repository of Keel's own (`.keel/push`) and prints the commit. No credential
/// is in its environment: a filter the run configured may run here.
const COMMIT_SCRIPT: &str = r#"set -e
git add -A
if ! git diff --cached --quiet; then
  git commit -q --no-verify -m "$KEEL_PUSH_MESSAGE"
fi
if [ "$(git rev-parse HEAD)" = "$(git rev-parse refs/keel/base)" ]; then
  exit 0
fi
rm -rf .keel/push
git init -q --bare .keel/push
git --git-dir=.keel/push fetch -q "$PWD" HEAD:refs/heads/result
git rev-parse HEAD"#;

/// Pushes the result from `.keel/push`, whose configuration the worker wrote, with no
/// system or global configuration (the run's home is the run's to write).
const PUSH_SCRIPT: &str = r#"git --git-dir=.keel/push push -q "$KEEL_REPO_URL" "refs/heads/result:refs/heads/$KEEL_PUSH_BRANCH""#;

/// What `.keel/push/config` holds when the push starts: a bare repository and nothing else.
const PUSH_REPOSITORY_CONFIG: &str = "[core]\n\trepositoryformatversion = 0\n\tbare = true\n";

/// What an attempt within hooks ends with: a process run's `Outcome`, or an agent loop's
/// `LoopOutcome`, which can also wait for an approval.
pub(crate) trait Hooked: From<Outcome> {
    /// Whether the attempt was interrupted: `after_run` then does not run.
    fn interrupted(&self) -> bool;
    /// Whether the attempt completed: only then is its result pushed.
    fn completed(&self) -> bool;
}

impl Hooked for Outcome {
    fn interrupted(&self) -> bool {
        *self == Outcome::Interrupted
    }

    fn completed(&self) -> bool {
        matches!(self, Outcome::Completed { .. })
    }
}

impl Hooked for LoopOutcome {
    fn interrupted(&self) -> bool {
        *self == LoopOutcome::Ended(Outcome::Interrupted)
    }

    fn completed(&self) -> bool {
        matches!(self, LoopOutcome::Ended(outcome) if outcome.completed())
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
        let mut outcome = body.await;
        if let Some(repo) = &self.repo
            && let Some(push) = &repo.push
            && outcome.completed()
            && let Err(failed) = self.push_result(ctx, repo, push).await
        {
            outcome = failed.into();
        }
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
        let mut env = self.remote_env(repo, credential.as_ref());
        env.push((
            "KEEL_REPO_BRANCH".to_string(),
            repo.base_branch.clone().unwrap_or_default(),
        ));
        let ran = self
            .run_script(ctx, "clone", CLONE_SCRIPT, &env, repo.timeout)
            .await?;
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

    /// The run's environment with what git needs to reach `repo`: its URL, no prompt for a
    /// password, and the credential for this git alone (as `http.extraHeader` in its
    /// environment: neither the workspace's git configuration nor the run's processes ever
    /// hold it).
    fn remote_env(&self, repo: &RepoClone, credential: Option<&Secret>) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        if let Some(header) = credential {
            env.extend(git_config(&[(
                "http.extraHeader",
                &format!("Authorization: {}", header.expose()),
            )]));
        }
        env.extend([
            ("KEEL_REPO_URL".to_string(), repo.url.clone()),
            // A repository that asks for credentials fails rather than waits for them.
            ("GIT_TERMINAL_PROMPT".to_string(), "0".to_string()),
        ]);
        env
    }

    /// Runs a script in the workspace with the run's sandbox and records its output as the
    /// `<name>.stdout` / `<name>.stderr` artifacts; Err: how the attempt stops instead (it
    /// was interrupted, or the output could not be written).
    async fn run_script(
        &self,
        ctx: &FencedContext,
        name: &str,
        script: &str,
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<HookRun, Outcome> {
        let (workspace, cancel) = (&self.workspace, ctx.cancellation());
        let ran =
            keel_workers::hooks::run(name, script, workspace, env, self.sandbox, timeout, cancel)
                .await
                .ok_or(Outcome::Interrupted)?;
        ctx.shared.record_hook(&ran).await.map_err(stopped)?;
        Ok(ran)
    }

    /// Commits a completed run's changes and pushes them to the task's `push_branch`, as a
    /// `workspace_push` step (output: the commit, or that nothing changed). Err: the
    /// attempt's end instead: failed with `push_failed:` and git's message, or stopped.
    async fn push_result(
        &self,
        ctx: &FencedContext,
        repo: &RepoClone,
        push: &ResultPush,
    ) -> Result<(), Outcome> {
        let input = json!({ "repo": repo.url, "branch": push.branch });
        let step = ctx
            .start_step("workspace_push", input)
            .await
            .map_err(stopped)?;
        let pushed = self.commit_and_push(ctx, repo, push).await?;
        let result = match &pushed {
            Ok(Some(commit)) => StepResult::Completed {
                output: json!({ "pushed": true, "branch": push.branch, "commit": commit }),
            },
            Ok(None) => StepResult::Completed {
                output: json!({ "pushed": false, "reason": "no changes" }),
            },
            Err(error) => StepResult::Failed {
                error: error.clone(),
            },
        };
        ctx.finish_step(&step, result).await.map_err(stopped)?;
        pushed.map(|_| ()).map_err(|error| Outcome::Failed {
            exit_code: None,
            error: format!("push_failed: {error}"),
        })
    }

    /// The commit pushed (None: nothing changed), or why not; Err(outer): how the attempt
    /// stops instead.
    async fn commit_and_push(
        &self,
        ctx: &FencedContext,
        repo: &RepoClone,
        push: &ResultPush,
    ) -> Result<Result<Option<String>, String>, Outcome> {
        let mut env = self.env.clone();
        env.extend(git_config(&[
            ("core.hooksPath", "/dev/null"),
            ("commit.gpgSign", "false"),
        ]));
        for (name, value) in [
            ("GIT_AUTHOR_NAME", "Keel"),
            ("GIT_AUTHOR_EMAIL", "keel@localhost"),
            ("GIT_COMMITTER_NAME", "Keel"),
            ("GIT_COMMITTER_EMAIL", "keel@localhost"),
            ("GIT_AUTHOR_DATE", &push.date),
            ("GIT_COMMITTER_DATE", &push.date),
            ("KEEL_PUSH_MESSAGE", &push.message),
        ] {
            env.push((name.to_string(), value.to_string()));
        }
        let committed = self
            .run_script(ctx, "commit", COMMIT_SCRIPT, &env, repo.timeout)
            .await?;
        if let Some(error) = committed.error {
            return Ok(Err(format!("git {error}")));
        }
        let Some(commit) = committed.stdout.lines().last().map(str::to_string) else {
            return Ok(Ok(None));
        };
        let credential = match &repo.credential {
            Ok(credential) => credential.as_ref(),
            Err(why) => return Ok(Err(why.clone())),
        };
        if let Err(error) = self.reset_push_repository().await {
            return Ok(Err(format!("workspace_unavailable: {error}")));
        }
        let mut env = self.remote_env(repo, credential);
        env.extend([
            ("KEEL_PUSH_BRANCH".to_string(), push.branch.clone()),
            ("GIT_CONFIG_NOSYSTEM".to_string(), "1".to_string()),
            ("GIT_CONFIG_GLOBAL".to_string(), "/dev/null".to_string()),
        ]);
        let pushed = self
            .run_script(ctx, "push", PUSH_SCRIPT, &env, repo.timeout)
            .await?;
        Ok(match pushed.error {
            None => Ok(Some(commit)),
            Some(error) => Err(format!("git {error}")),
        })
    }

    /// Writes `.keel/push/config` afresh, so the push reads only what Keel wrote: the commit
    /// script ran in a workspace whose configuration the run controls. A link in its place
    /// is refused, never followed.
    async fn reset_push_repository(&self) -> std::io::Result<()> {
        let repository = self.workspace.join(".keel").join("push");
        if !tokio::fs::symlink_metadata(&repository).await?.is_dir() {
            return Err(std::io::Error::other(".keel/push is not a directory"));
        }
        let config = repository.join("config");
        match tokio::fs::remove_file(&config).await {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => return Err(error),
            _ => {}
        }
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&config)
            .await?;
        tokio::io::AsyncWriteExt::write_all(&mut file, PUSH_REPOSITORY_CONFIG.as_bytes()).await
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

    /// Runs one of the task's workflow hooks, with the run's environment and the hooks'
    /// timeout ([`AttemptHooks::run_script`]).
    async fn run_hook(
        &self,
        ctx: &FencedContext,
        hook: &str,
        script: &str,
    ) -> Result<HookRun, Outcome> {
        let timeout = self.hooks.timeout();
        self.run_script(ctx, hook, script, &self.env, timeout).await
    }
}

/// Git configuration given in the environment (`GIT_CONFIG_COUNT`, `GIT_CONFIG_KEY_<n>`,
/// `GIT_CONFIG_VALUE_<n>`), which outranks every configuration file.
fn git_config(settings: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = vec![("GIT_CONFIG_COUNT".to_string(), settings.len().to_string())];
    for (n, (key, value)) in settings.iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{n}"), key.to_string()));
        env.push((format!("GIT_CONFIG_VALUE_{n}"), value.to_string()));
    }
    env
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
