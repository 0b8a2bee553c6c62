//! Per-item workspaces (`workspace.root`, after Symphony): each item, keyed by its
//! identifier (not its versioned key), gets one directory
//! `<root>/<Keel workspace>/<workspace key>`, which its task's runs work in (`in_place`)
//! and its later versions and retries reuse. The Keel workspace (the tenant,
//! [`Scope::directory_name`]) keeps two orgs that track the same repository apart.
//!
//! An item about to start is first `workspace_preparing` (committed with its directory),
//! then the directory is made, then the item is `ready` and its run starts through the
//! normal admission path. A process that stops anywhere in between leaves the item in one
//! of those states, and the next pass carries it on (the import's `advance`, which starts
//! the run once [`prepare`] made the directory). No hook runs here, in a poll or an import
//! (which may be the API process): `after_create` runs in the worker, as the first thing
//! its run's first attempt does there, once the run was admitted (see `jobs::run`).
//!
//! A terminal item's workspace is removed by the workers' maintenance, `before_remove`
//! first where a run prepared it ([`remove_terminal_workspaces`]). Preparation and removal of one
//! item hold its workspace lock, so two processes never work in one directory at once.

use std::path::Path;
use std::time::Duration;

use keel_workers::SandboxPolicy;
use keel_workers::hooks::{self, HookRun};
use sqlx::pool::PoolConnection;
use sqlx::{PgConnection, PgPool, Postgres};
use tokio_util::sync::CancellationToken;

use crate::db::StoreError;
use crate::domain::Scope;
use crate::external;
use crate::external::item_workspaces::{self, Held, Removal};
use crate::external::tracker::Poller;
use crate::external::workflow::{Workflow, load_workflow};
use crate::external::{ItemChange, ItemRecord};
use keel_api_types::ItemState;

/// An item whose root `KEEL_WORKSPACE_ROOTS` does not allow.
pub(crate) const REFUSED: &str = "workspace_refused";
const UNAVAILABLE: &str = "workspace_unavailable";
/// Items carried on, and workspaces removed, per pass.
pub(crate) const PER_PASS: u32 = 50;

/// Symphony's workspace key: every character outside `[A-Za-z0-9._-]` becomes `_` (and
/// the dots of a key that would name the root or its parent, `.` and `..`); when that
/// changed the identifier, `--` and the first 16 hex digits of its SHA-256 follow, so two
/// identifiers that sanitize alike (`team/a-1`, `team_a-1`) never share a directory.
pub(crate) fn key(identifier: &str) -> String {
    let safe: String = identifier
        .chars()
        .map(|c| match c {
            'A'..='Z' | 'a'..='z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    let safe = match safe.as_str() {
        "" => "_".to_string(),
        "." | ".." => safe.replace('.', "_"),
        _ => safe,
    };
    match safe == identifier {
        true => safe,
        false => format!("{safe}--{}", short_hash(identifier)),
    }
}

/// The first 16 hex digits (64 bits) of `text`'s SHA-256.
fn short_hash(text: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(text.as_bytes());
    digest[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// Under the subject's lock, in `start`: records the item's directory and marks it
/// `workspace_preparing`, or `blocked` (`workspace_refused`) when the workspace roots do
/// not allow `root`.
pub async fn claim(
    conn: &mut PgConnection,
    poller: &Poller,
    scope: &Scope,
    root: &str,
    item: &ItemRecord,
) -> Result<ItemRecord, StoreError> {
    match poller.rules.workspace_roots.confine(root, None) {
        Ok(root) => {
            let tenant = root.join(scope.directory_name());
            let directory = directory_for(conn, scope, item, &tenant).await?;
            crate::external::item_workspaces::begin_preparation(conn, scope, &item.id, &directory)
                .await
        }
        Err(refused) => {
            let message = format!(
                "workspace.root is refused: {}; nothing was started",
                refused.message
            );
            blocked(conn, scope, item, REFUSED, &message).await
        }
    }
}

/// The item's directory under `tenant`: the one its earlier versions worked in, else its
/// [`key`]'s, unless another subject (another source's item of the same identifier) holds
/// that one: then the key is told apart by the hash of the source and identifier.
async fn directory_for(
    conn: &mut PgConnection,
    scope: &Scope,
    item: &ItemRecord,
    tenant: &Path,
) -> Result<String, StoreError> {
    let candidate = tenant.join(key(&item.identifier));
    let candidate = candidate.to_string_lossy();
    let held = item_workspaces::directory_held(conn, scope, item, &candidate).await?;
    Ok(match held {
        Held { own: Some(own), .. } => own,
        Held {
            by_another: false, ..
        } => candidate.into_owned(),
        Held {
            by_another: true, ..
        } => {
            let subject = format!("{}\n{}", item.source_id, item.identifier);
            let apart = format!("{}--{}", key(&item.identifier), short_hash(&subject));
            tenant.join(apart).to_string_lossy().into_owned()
        }
    })
}

/// The item's workspace lock (see [`crate::external::item_workspaces::try_lock`]): a session lock on a connection of
/// the pool, so the pool's size bounds how many are held at once. The connection is never
/// handed back to the pool holding the lock: it is closed, by [`WorkspaceLock::release`]
/// or on drop (a cancelled request, a panic), which releases the lock, as the death of the
/// process does.
struct WorkspaceLock {
    conn: PoolConnection<Postgres>,
}

impl WorkspaceLock {
    /// None when another process holds it.
    async fn take(
        pool: &PgPool,
        scope: &Scope,
        item: &ItemRecord,
    ) -> Result<Option<WorkspaceLock>, StoreError> {
        let mut conn = pool.acquire().await?;
        conn.close_on_drop();
        if !crate::external::item_workspaces::try_lock(&mut conn, scope, item).await? {
            return Ok(None);
        }
        Ok(Some(WorkspaceLock { conn }))
    }

    async fn release(self) {
        if let Err(error) = self.conn.close().await {
            tracing::warn!(%error, "closing a workspace lock's connection failed");
        }
    }
}

/// Makes the item's directory (or finds it made), under its workspace lock; the item
/// ends `ready`, or `blocked` with why.
pub(crate) async fn prepare(
    poller: &Poller,
    scope: &Scope,
    item: &ItemRecord,
) -> Result<ItemRecord, StoreError> {
    let Some(mut lock) = WorkspaceLock::take(&poller.pool, scope, item).await? else {
        return Ok(item.clone());
    };
    let prepared = prepare_locked(&mut lock.conn, scope, item).await;
    lock.release().await;
    prepared
}

async fn prepare_locked(
    conn: &mut PgConnection,
    scope: &Scope,
    item: &ItemRecord,
) -> Result<ItemRecord, StoreError> {
    // Another process may have prepared it since it was read.
    let item = crate::external::item_workspaces::get(conn, scope, &item.id).await?;
    let (true, Some(directory)) = (
        item.state == ItemState::WorkspacePreparing,
        &item.workspace_path,
    ) else {
        return Ok(item);
    };
    if let Err(message) = create(Path::new(directory)).await {
        return blocked(conn, scope, &item, UNAVAILABLE, &message).await;
    }
    let ready = ItemChange {
        state: "ready",
        ..ItemChange::default()
    };
    external::update_item(conn, scope, &item.id, &ready).await
}

/// Creates the directory, and its tenant's directory above it when that is new. An
/// existing directory is reused; anything else there (a file, a symbolic link) is refused.
async fn create(directory: &Path) -> Result<(), String> {
    let tenant = directory.parent().unwrap_or(directory);
    make_dir(tenant).await?;
    make_dir(directory).await
}

/// Makes one directory beneath a parent that is still itself (no symbolic link swapped
/// in).
async fn make_dir(directory: &Path) -> Result<(), String> {
    inside_root(directory).await?;
    match tokio::fs::create_dir(directory).await {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            match tokio::fs::symlink_metadata(directory).await {
                Ok(meta) if meta.is_dir() => Ok(()),
                _ => Err(format!(
                    "{} exists and is not a directory (a symbolic link is never followed)",
                    directory.display()
                )),
            }
        }
        Err(error) => Err(format!("{}: {error}", directory.display())),
    }
}

/// The root the directory was named under must still be that directory itself, not a
/// symbolic link swapped in since.
async fn inside_root(directory: &Path) -> Result<(), String> {
    let root = directory.parent().unwrap_or(directory);
    match tokio::fs::canonicalize(root).await {
        Ok(real) if real == root => Ok(()),
        Ok(real) => Err(format!(
            "the workspace root {} now resolves to {}; refused",
            root.display(),
            real.display()
        )),
        Err(error) => Err(format!("{}: {error}", root.display())),
    }
}

/// The workers' maintenance duty: removes the workspaces of items that became terminal,
/// in every workspace, once every run of theirs stopped (terminal for twice the workers'
/// `lease` at least: see [`item_workspaces::to_remove`]), `before_remove` first where a
/// run prepared the directory (a failure is logged and ignored); returns how many went.
/// An item whose source is gone, or whose workflow no longer reads, keeps its workspace
/// until it does.
pub(crate) async fn remove_terminal_workspaces(
    pool: &PgPool,
    lease: Duration,
) -> Result<u64, StoreError> {
    let mut conn = pool.acquire().await?;
    let removals = item_workspaces::to_remove(&mut conn, PER_PASS, lease * 2).await?;
    drop(conn);
    let mut removed = 0;
    for removal in removals {
        let scope = Scope::new(removal.workspace_id.clone());
        let mut conn = pool.acquire().await?;
        let source = external::get_source(&mut conn, &scope, &removal.item.source_id).await;
        drop(conn);
        let workflow = match source.map(|source| load_workflow(&source)) {
            Ok(Ok(workflow)) => workflow,
            Ok(Err(error)) => {
                let source_id = &removal.item.source_id;
                tracing::warn!(%source_id, %error, "a workspace waits for its workflow to read");
                continue;
            }
            Err(StoreError::NotFound(_)) => continue,
            Err(error) => return Err(error),
        };
        let Some(mut lock) = WorkspaceLock::take(pool, &scope, &removal.item).await? else {
            continue;
        };
        let done = remove(&mut lock.conn, &scope, &workflow, &removal).await;
        lock.release().await;
        removed += u64::from(done?);
    }
    Ok(removed)
}

/// Removes one workspace, under its lock; true when it went (or was gone already). A
/// directory that is not one (a symbolic link, a file) is left alone and the item says
/// why; a removal that fails is tried again at the next pass.
async fn remove(
    conn: &mut PgConnection,
    scope: &Scope,
    workflow: &Workflow,
    removal: &Removal,
) -> Result<bool, StoreError> {
    let item = &removal.item;
    // A newer version reopened the item: its preparation reuses the directory.
    if !crate::external::item_workspaces::is_newest(conn, scope, item).await? {
        return Ok(false);
    }
    let directory = Path::new(&removal.directory);
    match tokio::fs::symlink_metadata(directory).await {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Ok(meta) if meta.is_dir() && inside_root(directory).await.is_ok() => {
            // Where no run was admitted, no approval covered the source's hooks.
            let prepared = hooks::is_prepared(directory);
            if let (Some(script), true) = (&workflow.config.hooks.before_remove, prepared) {
                let ran = before_remove(scope, workflow, script, directory, item).await;
                crate::external::item_workspaces::record_hook(
                    conn,
                    scope,
                    &item.id,
                    "before_remove",
                    &ran,
                )
                .await?;
                if let Some(failure) = ran.failure() {
                    let identifier = &item.identifier;
                    tracing::warn!(%identifier, %failure, "before_remove failed; removing anyway");
                }
            }
            // remove_dir_all removes symbolic links inside, never what they point to.
            if let Err(error) = tokio::fs::remove_dir_all(directory).await {
                let identifier = &item.identifier;
                tracing::warn!(%identifier, %error, "removing a workspace failed");
                return Ok(false);
            }
        }
        _ => {
            let message = format!(
                "{} is not a directory inside the workspace root (a symbolic link is never \
                 followed); not removed",
                directory.display()
            );
            let refused = ItemChange {
                state: "terminal",
                error: Some((REFUSED, &message)),
                ..ItemChange::default()
            };
            external::update_item(conn, scope, &item.id, &refused).await?;
            // Forgotten, not removed: nothing would make a later pass remove it.
            crate::external::item_workspaces::clear(conn, scope, item).await?;
            return Ok(false);
        }
    }
    crate::external::item_workspaces::clear(conn, scope, item).await?;
    Ok(true)
}

/// Runs `before_remove` as the workers' maintenance does: in the run sandbox, with network
/// (what the item's workspace may reach) and a writable workspace, the item's identifier
/// and directory in its environment, and never the tracker's token.
async fn before_remove(
    scope: &Scope,
    workflow: &Workflow,
    script: &str,
    directory: &Path,
    item: &ItemRecord,
) -> HookRun {
    let env = [
        ("KEEL_ITEM_IDENTIFIER".to_string(), item.identifier.clone()),
        (
            "KEEL_WORKSPACE".to_string(),
            directory.to_string_lossy().into_owned(),
        ),
    ];
    let timeout = workflow.config.hooks.timeout();
    let never = CancellationToken::new();
    let policy = SandboxPolicy {
        workspace_id: Some(scope.workspace().into()),
        ..SandboxPolicy::default()
    };
    let script = hooks::Script {
        hook: "before_remove",
        script,
        workspace: directory,
        env: &env,
        sandbox: policy,
        secret: None,
        timeout,
    };
    hooks::run(script, &never)
        .await
        .expect("a hook that cannot be cancelled ends with a run")
}

/// Marks `item` blocked with `code` and `message`.
pub(super) async fn blocked(
    conn: &mut PgConnection,
    scope: &Scope,
    item: &ItemRecord,
    code: &str,
    message: &str,
) -> Result<ItemRecord, StoreError> {
    let change = ItemChange {
        state: "blocked",
        error: Some((code, message)),
        ..ItemChange::default()
    };
    external::update_item(conn, scope, &item.id, &change).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_keys_keep_symphonys_characters_and_stay_inside_the_root() {
        assert_eq!(key("ENG-12"), "ENG-12");
        assert_eq!(key("acme/widgets#7"), "acme_widgets_7--167330bbd557f049");
        assert!(key("a b/../c").starts_with("a_b_.._c--"));
        assert!(key("..").starts_with("__--"));
        assert!(key(".").starts_with("_--"));
        assert!(key("").starts_with("_--"));
        assert!(key("ünï").starts_with("_n_--"));
    }

    /// Symphony: "workspace keys disambiguate identifiers that sanitize to the same path".
    #[test]
    fn symphony_workspace_keys_disambiguate_identifiers_that_sanitize_to_the_same_path() {
        let (slash, underscore) = (key("team/a-1"), key("team_a-1"));
        assert_ne!(slash, underscore);
        assert_eq!(underscore, "team_a-1");
        assert_eq!(slash, "team_a-1--7c03d5a56ca4204b");
        assert_eq!(key("team/a-1"), slash, "the same identifier, the same key");
    }
}
