//! What runs around a task's attempts in its workspace, by the worker that runs the attempt,
//! with the run's environment and sandbox: the clone of the task's repository into a new
//! workspace, and an imported task's workflow hooks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_workers::InheritedSecret;
use keel_workers::agent::run_loop::LoopOutcome;
use keel_workers::hooks::{HookRun, Script};
use keel_workers::{Outcome, RunContext, StepResult};
use serde_json::json;

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
    /// What Keel's git answers a credential request with (git's credential helper
    /// format), or why there is none to send.
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

/// A repository credential (`user:password`, or a token alone, GitHub's
/// `x-access-token:<token>`) as git's credential helper answers: HTTP basic authorization
/// for whichever host asks.
pub(super) fn credential_answer(credential: &str) -> Secret {
    let (user, password) = credential
        .split_once(':')
        .unwrap_or(("x-access-token", credential));
    Secret::new(format!("username={user}\npassword={password}\n"))
}

/// The credential helper of Keel's git: the answer to a `get`, read from the secret the
/// jail inherits (never from its environment or a file the run could have written).
const CREDENTIAL_HELPER: &str = "!f() { test \"$1\" = get && cat /dev/fd/3; }; f";

/// Makes the workspace a clone of `$KEEL_REPO_URL` at `$KEEL_REPO_BRANCH` (the default
/// branch, detached, when empty). `init` and `fetch` rather than `clone`: the workspace
/// already holds the run's `.keel/` (its home and temporary directories). The values come
/// in the environment, so nothing of them is parsed as shell. No template (a run's own
/// configuration could name one), and the credential's descriptor is closed once the
/// fetch is done. `refs/keel/base` remembers where the clone started (a push needs
/// changes past it), and the run's own `.keel/` is never part of a commit. It can run
/// again over a clone an attempt cut short (its lease lost mid-clone): the remote is set
/// anew and the branch reset to what was fetched.
const CLONE_SCRIPT: &str = r#"set -e
git init -q --template=
git remote remove origin 2>/dev/null || true
git remote add origin "$KEEL_REPO_URL"
if [ -n "$KEEL_REPO_BRANCH" ]; then
  git fetch -q origin "refs/heads/$KEEL_REPO_BRANCH"
  exec 3<&-
  git checkout -q -B "$KEEL_REPO_BRANCH" FETCH_HEAD
else
  git fetch -q origin HEAD
  exec 3<&-
  git checkout -q --detach FETCH_HEAD
fi
git update-ref refs/keel/base HEAD
mkdir -p .git/info
printf '/.keel/\n' >> .git/info/exclude"#;

/// Commits the workspace's changes (hooks off: the run may have written the workspace's
/// git configuration) and, when there is anything past `refs/keel/base`, copies the result
/// into a new bare repository at `.keel/push` (made from no template: the run's own
/// configuration could name one) and prints the commit. No credential reaches it: a filter
/// the run configured may run here.
const COMMIT_SCRIPT: &str = r#"set -e
git add -A
if ! git diff --cached --quiet; then
  git commit -q --no-verify -m "$KEEL_PUSH_MESSAGE"
fi
if [ "$(git rev-parse HEAD)" = "$(git rev-parse refs/keel/base)" ]; then
  exit 0
fi
rm -rf .keel/push
git init -q --bare --template= .keel/push
git --git-dir=.keel/push fetch -q "$PWD" HEAD:refs/heads/result
git rev-parse HEAD"#;

/// Pushes the result from the bare repository it runs in (`.keel/push`, which is all its
/// jail sees of the workspace), never running a hook.
const PUSH_SCRIPT: &str = r#"git --git-dir=. push -q --no-verify "$KEEL_REPO_URL" "refs/heads/result:refs/heads/$KEEL_PUSH_BRANCH""#;

/// What the worker writes into `.keel/push` before the push, over what the commit left
/// there: a bare repository's head and configuration and nothing else, so the push reads
/// only what Keel wrote.
const PUSH_REPOSITORY: [(&str, &str); 2] = [
    ("HEAD", "ref: refs/heads/result\n"),
    (
        "config",
        "[core]\n\trepositoryformatversion = 0\n\tbare = true\n",
    ),
];

/// Where the result's bare repository is, in the workspace.
const PUSH_DIR: &str = ".keel/push";

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
    /// where the policy gates it). A failure ends the attempt; a workspace that held
    /// nothing before is emptied again, so the next attempt's preparation starts afresh,
    /// and one that held files (an earlier version's work, whose marker a run removed)
    /// keeps them (Symphony reuses a directory without deleting local changes). The
    /// directory stays, as the task's `in_place` directory.
    async fn prepare(&self, ctx: &FencedContext) -> Result<(), Outcome> {
        let workspace = &self.workspace;
        if keel_workers::hooks::is_prepared(workspace) {
            return Ok(());
        }
        let fresh = holds_nothing(workspace).await;
        let prepared = self.clone_and_create(ctx).await;
        if fresh
            && let Err(Outcome::Failed { .. }) = &prepared
            && let Err(failed) = empty(workspace).await
        {
            let run_id = &ctx.shared.run_id;
            tracing::warn!(%run_id, %failed, "emptying a workspace whose preparation failed");
        }
        prepared?;
        keel_workers::hooks::mark_prepared(workspace)
            .await
            .map_err(|error| Outcome::Failed {
                exit_code: None,
                error: format!("workspace_unavailable: {error}"),
            })
    }

    /// The preparation itself: the clone, then `after_create`.
    async fn clone_and_create(&self, ctx: &FencedContext) -> Result<(), Outcome> {
        if let Some(repo) = &self.repo {
            self.clone_repo(ctx, repo).await?;
        }
        if let Some(script) = &self.hooks.after_create {
            let ran = self.run_hook(ctx, "after_create", script).await?;
            if let Some(error) = ran.failure() {
                return Err(unprepared(error));
            }
        }
        Ok(())
    }

    /// Clones the task's repository into the workspace, as a `workspace_clone` step with
    /// the clone's output as artifacts. A failure ends the attempt failed with git's
    /// message.
    async fn clone_repo(&self, ctx: &FencedContext, repo: &RepoClone) -> Result<(), Outcome> {
        let input = json!({ "repo": repo.url, "base_branch": repo.base_branch });
        let step = ctx
            .start_step("workspace_clone", input)
            .await
            .map_err(Outcome::from)?;
        let credential = match &repo.credential {
            Ok(credential) => credential,
            Err(why) => {
                let failed = StepResult::Failed { error: why.clone() };
                ctx.finish_step(&step, failed)
                    .await
                    .map_err(Outcome::from)?;
                return Err(unprepared(format!("clone_failed: {why}")));
            }
        };
        let inherited = match remote_input(repo, credential.as_ref()) {
            Ok(inherited) => inherited,
            Err(why) => {
                let failed = StepResult::Failed { error: why.clone() };
                ctx.finish_step(&step, failed)
                    .await
                    .map_err(Outcome::from)?;
                return Err(unprepared(format!("clone_failed: {why}")));
            }
        };
        let mut env = self.remote_env(repo, inherited.as_ref());
        env.push((
            "KEEL_REPO_BRANCH".to_string(),
            repo.base_branch.clone().unwrap_or_default(),
        ));
        let clone = Script {
            hook: "clone",
            script: CLONE_SCRIPT,
            workspace: &self.workspace,
            env: &env,
            sandbox: self.sandbox.clone(),
            secret: inherited.as_ref().map(Inherited::secret),
            timeout: repo.timeout,
        };
        let ran = self.run_script(ctx, clone).await?;
        let result = match &ran.error {
            None => StepResult::Completed {
                output: json!({ "exit_code": ran.exit_code }),
            },
            Some(error) => StepResult::Failed {
                error: format!("git {error}"),
            },
        };
        ctx.finish_step(&step, result)
            .await
            .map_err(Outcome::from)?;
        match ran.error {
            None => Ok(()),
            Some(error) => Err(unprepared(format!("clone_failed: git {error}"))),
        }
    }

    /// The run's environment with what Keel's git needs to reach `repo`: its URL, no
    /// prompt for a password, no configuration but Keel's (no system or global file, no
    /// hook), and what `inherited` stands for: the credential helper that reads it, or, for
    /// a repository on this host, the global configuration that trusts it.
    fn remote_env(&self, repo: &RepoClone, inherited: Option<&Inherited>) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        let (global, helper) = match inherited {
            Some(Inherited::Credential(_)) => ("/dev/null", Some(CREDENTIAL_HELPER)),
            Some(Inherited::Trust(_)) => (keel_workers::INHERITED_PATH, None),
            None => ("/dev/null", None),
        };
        let mut config = vec![("core.hooksPath", "/dev/null")];
        config.extend(helper.map(|helper| ("credential.helper", helper)));
        env.extend(git_config(&config));
        env.extend([
            ("KEEL_REPO_URL".to_string(), repo.url.clone()),
            ("GIT_CONFIG_NOSYSTEM".to_string(), "1".to_string()),
            ("GIT_CONFIG_GLOBAL".to_string(), global.to_string()),
            // A repository that asks for credentials fails rather than waits for them.
            ("GIT_TERMINAL_PROMPT".to_string(), "0".to_string()),
        ]);
        env
    }

    /// Runs a script and records its output as the `<name>.stdout` / `<name>.stderr`
    /// artifacts; Err: how the attempt stops instead (it was interrupted, or the output
    /// could not be written).
    async fn run_script(
        &self,
        ctx: &FencedContext,
        script: Script<'_>,
    ) -> Result<HookRun, Outcome> {
        let ran = keel_workers::hooks::run(script, ctx.cancellation())
            .await
            .ok_or(Outcome::Interrupted)?;
        ctx.shared.record_hook(&ran).await.map_err(Outcome::from)?;
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
            .map_err(Outcome::from)?;
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
        ctx.finish_step(&step, result)
            .await
            .map_err(Outcome::from)?;
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
        let commit = Script {
            hook: "commit",
            script: COMMIT_SCRIPT,
            workspace: &self.workspace,
            env: &env,
            sandbox: self.sandbox.clone(),
            secret: None,
            timeout: repo.timeout,
        };
        let committed = self.run_script(ctx, commit).await?;
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
        let inherited = match remote_input(repo, credential) {
            Ok(inherited) => inherited,
            Err(why) => return Ok(Err(why)),
        };
        let repository = self.workspace.join(PUSH_DIR);
        if let Err(error) = reset_push_repository(&repository).await {
            return Ok(Err(format!("workspace_unavailable: {error}")));
        }
        let mut env = self.remote_env(repo, inherited.as_ref());
        env.push(("KEEL_PUSH_BRANCH".to_string(), push.branch.clone()));
        // Its jail sees the bare repository alone: nothing of the run's workspace runs there.
        let push = Script {
            hook: "push",
            script: PUSH_SCRIPT,
            workspace: &repository,
            env: &env,
            sandbox: self.sandbox.clone(),
            secret: inherited.as_ref().map(Inherited::secret),
            timeout: repo.timeout,
        };
        let pushed = self.run_script(ctx, push).await?;
        Ok(match pushed.error {
            None => Ok(Some(commit)),
            Some(error) => Err(format!("git {error}")),
        })
    }

    /// Runs one of the task's workflow hooks, with the run's environment and the hooks'
    /// timeout ([`AttemptHooks::run_script`]).
    async fn run_hook(
        &self,
        ctx: &FencedContext,
        hook: &str,
        script: &str,
    ) -> Result<HookRun, Outcome> {
        let hook = Script {
            hook,
            script,
            workspace: &self.workspace,
            env: &self.env,
            sandbox: self.sandbox.clone(),
            secret: None,
            timeout: self.hooks.timeout(),
        };
        self.run_script(ctx, hook).await
    }
}

/// What Keel's git reads at fd 3 for a clone or a push: the credential its helper answers
/// with, or, for a repository on this host (which another uid owns), a global
/// configuration that trusts it: git trusts another uid's repository only through
/// configuration it counts as protected, and a local fetch drops the `-c` and environment
/// settings. The jail it is given to is the clone's or the push's alone.
enum Inherited {
    Credential(InheritedSecret),
    Trust(InheritedSecret),
}

impl Inherited {
    fn secret(&self) -> &InheritedSecret {
        match self {
            Inherited::Credential(secret) | Inherited::Trust(secret) => secret,
        }
    }
}

/// What the clone or the push of `repo` inherits, if anything.
fn remote_input(
    repo: &RepoClone,
    credential: Option<&Secret>,
) -> Result<Option<Inherited>, String> {
    let inherit = |bytes: &[u8]| {
        InheritedSecret::new(bytes).map_err(|e| format!("passing git its input: {e}"))
    };
    if is_local(&repo.url) {
        // Only the clone's own jail reads it, and that sees this repository alone.
        return inherit(b"[safe]\n\tdirectory = *\n").map(|trust| Some(Inherited::Trust(trust)));
    }
    credential
        .map(|credential| inherit(credential.expose().as_bytes()).map(Inherited::Credential))
        .transpose()
}

/// Whether git reaches `url` on this host (an absolute path or a `file://` URL).
fn is_local(url: &str) -> bool {
    url.starts_with('/') || url.starts_with("file://")
}

/// Writes `.keel/push`'s head and configuration afresh, following no link: the commit
/// script ran where the run's configuration applies.
async fn reset_push_repository(repository: &Path) -> Result<(), String> {
    let [(head, head_content), (config, config_content)] = PUSH_REPOSITORY;
    keel_workers::write_beneath(repository, head, head_content.as_bytes()).await?;
    keel_workers::write_beneath(repository, config, config_content.as_bytes()).await
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

/// How an attempt whose workspace preparation (the clone, `after_create`) failed ends.
fn unprepared(error: String) -> Outcome {
    Outcome::Failed {
        exit_code: None,
        error,
    }
}

/// Whether `directory` holds nothing but Keel's own `.keel` (or cannot be read, which
/// counts as holding something: only what a preparation made may be removed again).
async fn holds_nothing(directory: &Path) -> bool {
    let Ok(mut entries) = tokio::fs::read_dir(directory).await else {
        return false;
    };
    loop {
        match entries.next_entry().await {
            Ok(None) => return true,
            Ok(Some(entry)) if entry.file_name() == ".keel" => continue,
            Ok(Some(_)) | Err(_) => return false,
        }
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

#[cfg(test)]
mod tests {
    use super::CLONE_SCRIPT;
    use std::path::Path;
    use std::process::Command;

    fn git(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@t")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@t")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn clone(workspace: &Path, url: &str) -> std::process::Output {
        Command::new("sh")
            .args(["-c", CLONE_SCRIPT])
            .current_dir(workspace)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("KEEL_REPO_URL", url)
            .env("KEEL_REPO_BRANCH", "main")
            .output()
            .unwrap()
    }

    /// A takeover's attempt prepares a workspace whose clone the lost attempt began (or
    /// finished, before it could mark it prepared): the script runs again and ends where
    /// one run would.
    #[test]
    fn the_clone_runs_again_over_one_an_attempt_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let origin = dir.path().join("origin");
        std::fs::create_dir(&origin).unwrap();
        git(&origin, &["init", "-q", "-b", "main"]);
        std::fs::write(origin.join("a.txt"), "a\n").unwrap();
        git(&origin, &["add", "a.txt"]);
        git(&origin, &["commit", "-q", "-m", "one"]);
        let url = origin.to_str().unwrap();
        let workspace = dir.path().join("workspace");
        std::fs::create_dir(&workspace).unwrap();
        for _ in 0..2 {
            let out = clone(&workspace, url);
            assert!(out.status.success(), "{out:?}");
        }
        let head = git(&workspace, &["rev-parse", "HEAD"]);
        assert_eq!(head, git(&origin, &["rev-parse", "HEAD"]));
        assert_eq!(git(&workspace, &["rev-parse", "refs/keel/base"]), head);
        assert_eq!(
            std::fs::read_to_string(workspace.join("a.txt")).unwrap(),
            "a\n"
        );
    }
}
