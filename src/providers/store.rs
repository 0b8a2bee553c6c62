//! Provider presets. Secret references are stored as written (`env:NAME`, `file:/path`);
//! no secret value ever reaches these rows.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::types::Json;

use crate::db::{Result, StoreError};
use crate::domain::{Role, Scope, new_id};
use crate::providers::secrets::{SecretPolicy, SecretRef, Unresolved};
use crate::providers::{Api, ProviderFields, ProviderHosts, ProviderSpec};

/// `query_as!` of [`ProviderRecord`]s: `$before` (up to its `SELECT` or `RETURNING`), then
/// the preset's columns (its JSON ones as [`Json`]), then `$after` (its `FROM …`, or
/// nothing). The caller imports what the columns name: [`Json`] and [`BTreeMap`].
macro_rules! query_providers {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            ProviderRecord,
            $before
                + r#" id, kind, display_name, provider_id, model, api, base_url, api_key_ref,
                      headers AS "headers: Json<BTreeMap<String, String>>",
                      secret_header_refs
                          AS "secret_header_refs: Json<BTreeMap<String, String>>",
                      capabilities, input,
                      compat AS "compat: Json<serde_json::Map<String, serde_json::Value>>",
                      enabled, last_check AS "last_check: Json<serde_json::Value>",
                      created_at, updated_at, workspace_id, written_by_role "#
                + $after
            $(, $arg)*
        )
    };
}
pub(crate) use query_providers;

/// `FromRow` for `tasks::chat_routes`, which reads a preset with a statement of its own.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ProviderRecord {
    pub id: String,
    pub(crate) kind: String,
    pub(crate) display_name: String,
    pub(crate) provider_id: String,
    pub(crate) model: String,
    pub(crate) api: String,
    pub(crate) base_url: String,
    pub(crate) api_key_ref: Option<String>,
    pub(crate) headers: Json<BTreeMap<String, String>>,
    pub(crate) secret_header_refs: Json<BTreeMap<String, String>>,
    pub(crate) capabilities: Vec<String>,
    pub(crate) input: Vec<String>,
    pub(crate) compat: Json<serde_json::Map<String, serde_json::Value>>,
    pub(crate) enabled: bool,
    pub(crate) last_check: Option<Json<serde_json::Value>>,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) updated_at: DateTime<Utc>,
    pub(crate) workspace_id: String,
    /// `member`, `operator` or `runtime_operator` (the table's check constraint).
    pub(crate) written_by_role: String,
}

impl ProviderRecord {
    /// The stored fields, to patch and validate again.
    pub(crate) fn fields(&self) -> ProviderFields {
        ProviderFields {
            kind: self.kind.clone(),
            display_name: Some(self.display_name.clone()),
            provider_id: Some(self.provider_id.clone()),
            model: self.model.clone(),
            api: self.api.clone(),
            base_url: self.base_url.clone(),
            api_key_ref: self.api_key_ref.clone(),
            headers: self.headers.0.clone(),
            secret_header_refs: self.secret_header_refs.0.clone(),
            capabilities: self.capabilities.clone(),
            input: self.input.clone(),
            compat: self.compat.0.clone(),
            enabled: self.enabled,
        }
    }

    /// The stored api; the table's check constraint admits only known ones.
    pub(crate) fn api(&self) -> Api {
        Api::parse(&self.api).unwrap_or(Api::OpenAiCompletions)
    }

    pub(crate) fn api_key(&self) -> Option<SecretRef> {
        self.api_key_ref
            .as_deref()
            .and_then(|r| SecretRef::parse(r).ok())
    }

    pub(crate) fn secret_headers(&self) -> Vec<(String, SecretRef)> {
        self.secret_header_refs
            .iter()
            .filter_map(|(name, r)| Some((name.clone(), SecretRef::parse(r).ok()?)))
            .collect()
    }

    /// Refuses (403) a caller of `role` who would `what` (change, delete) the preset while
    /// ranking below the role that last wrote it: a member does not undo what an operator
    /// set up for the org, nor an org's operator what the runtime operator did. An edit
    /// makes the preset its editor's, so a lower role may not edit it either: it could then
    /// delete what it made its own.
    pub(crate) fn check_writer(&self, role: Role, what: &str) -> Result<()> {
        let writer = Role::stored(&self.written_by_role);
        if role >= writer {
            return Ok(());
        }
        let who = match writer {
            Role::RuntimeOperator => "the runtime operator",
            _ => "an operator",
        };
        Err(StoreError::Forbidden(format!(
            "provider {} was written by {who}; only {who} may {what} it (this identity's role \
             is {})",
            self.id,
            role.as_str()
        )))
    }

    /// Whether the preset may be used now: the runtime operator's always, a tenant's only
    /// while its secrets are granted to its workspace and its chat host is allowed
    /// ([`crate::providers::check_tenants_use`]). Checked before its secrets resolve.
    pub(crate) fn check_use(
        &self,
        secrets: &SecretPolicy,
        hosts: &ProviderHosts,
    ) -> Result<(), Unresolved> {
        if Role::stored(&self.written_by_role).is_runtime_operator() {
            return Ok(());
        }
        let headers = self.secret_headers().into_iter().map(|(_, secret)| secret);
        let named: Vec<SecretRef> = self.api_key().into_iter().chain(headers).collect();
        crate::providers::check_tenants_use(
            &self.workspace_id,
            self.api(),
            &self.base_url,
            &named,
            secrets,
            hosts,
        )
    }
}

fn refs(spec: &ProviderSpec) -> (Option<String>, BTreeMap<String, String>) {
    let api_key = spec.api_key_ref.as_ref().map(ToString::to_string);
    let headers = spec
        .secret_header_refs
        .iter()
        .map(|(name, r)| (name.clone(), r.to_string()))
        .collect();
    (api_key, headers)
}

pub async fn create(
    conn: &mut PgConnection,
    scope: &Scope,
    spec: &ProviderSpec,
) -> Result<ProviderRecord> {
    save(conn, scope, &new_id("provider"), spec).await
}

/// Replaces a preset's fields (the caller holds its row lock). An edit clears the last
/// check: it described the old fields.
pub async fn update(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    spec: &ProviderSpec,
) -> Result<ProviderRecord> {
    get(&mut *conn, scope, id).await?;
    save(conn, scope, id, spec).await
}

/// Inserts the preset, or replaces the fields of the scope's preset with this id. The
/// conflict update is confined to the scope too: an id of another workspace's preset
/// updates nothing, and the insert then returns no row.
async fn save(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    spec: &ProviderSpec,
) -> Result<ProviderRecord> {
    let (api_key_ref, secret_header_refs) = refs(spec);
    let row = query_providers!(
        "INSERT INTO providers (id, kind, display_name, provider_id, model, api, base_url,
                               api_key_ref, headers, secret_header_refs, capabilities, input,
                               compat, enabled, workspace_id, written_by_role)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)
         ON CONFLICT (id) DO UPDATE SET
             kind = EXCLUDED.kind, display_name = EXCLUDED.display_name,
             provider_id = EXCLUDED.provider_id, model = EXCLUDED.model, api = EXCLUDED.api,
             base_url = EXCLUDED.base_url, api_key_ref = EXCLUDED.api_key_ref,
             headers = EXCLUDED.headers, secret_header_refs = EXCLUDED.secret_header_refs,
             capabilities = EXCLUDED.capabilities, input = EXCLUDED.input,
             compat = EXCLUDED.compat, enabled = EXCLUDED.enabled, last_check = NULL,
             written_by_role = EXCLUDED.written_by_role, updated_at = now()
         WHERE providers.workspace_id = EXCLUDED.workspace_id
         RETURNING",
        "",
        id,
        &spec.kind,
        &spec.display_name,
        &spec.provider_id,
        &spec.model,
        spec.api.as_str(),
        &spec.base_url,
        api_key_ref,
        Json(&spec.headers) as Json<&BTreeMap<String, String>>,
        Json(secret_header_refs) as Json<BTreeMap<String, String>>,
        &spec.capabilities,
        &spec.input,
        Json(&spec.compat) as Json<&serde_json::Map<String, serde_json::Value>>,
        spec.enabled,
        scope.workspace(),
        spec.written_by.as_str(),
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("provider"))?;
    Ok(row)
}

pub async fn get(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<ProviderRecord> {
    query_providers!(
        "SELECT",
        "FROM providers WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("provider"))
}

/// How [`lock`] holds a preset: shared by the media jobs it admits, exclusively by an edit.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LockMode {
    Share,
    Update,
}

/// Reads a preset under a row lock.
pub(crate) async fn lock(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    mode: LockMode,
) -> Result<ProviderRecord> {
    let row = match mode {
        LockMode::Share => {
            query_providers!(
                "SELECT",
                "FROM providers WHERE workspace_id = $1 AND id = $2 FOR SHARE",
                scope.workspace(),
                id,
            )
            .fetch_optional(conn)
            .await?
        }
        LockMode::Update => {
            query_providers!(
                "SELECT",
                "FROM providers WHERE workspace_id = $1 AND id = $2 FOR UPDATE",
                scope.workspace(),
                id,
            )
            .fetch_optional(conn)
            .await?
        }
    };
    row.ok_or(StoreError::NotFound("provider"))
}

pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ProviderRecord>> {
    let rows = query_providers!(
        "SELECT",
        "FROM providers
         WHERE workspace_id = $3 AND ($1::text IS NULL OR id > $1) ORDER BY id LIMIT $2",
        after,
        limit,
        scope.workspace(),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Deletes a preset no media job names, for a `deleter` of at least the role that last
/// wrote it ([`ProviderRecord::check_writer`]). The row lock orders this against a media
/// job being created for the preset (which holds it `FOR SHARE`) and an edit that changes
/// its writer.
pub async fn delete(conn: &mut PgConnection, scope: &Scope, id: &str, deleter: Role) -> Result<()> {
    let preset = lock(&mut *conn, scope, id, LockMode::Update).await?;
    preset.check_writer(deleter, "delete")?;
    let jobs = sqlx::query_scalar!(
        r#"SELECT count(*) AS "count!" FROM media_jobs
           WHERE workspace_id = $1 AND provider_id = $2"#,
        scope.workspace(),
        id,
    )
    .fetch_one(&mut *conn)
    .await?;
    if jobs > 0 {
        return Err(StoreError::conflict_next(
            format!(
                "provider {id} has {jobs} media job(s); it stays while they name it (disable \
                 it instead)"
            ),
            format!("Disable the preset instead: keel providers update {id} --enabled false."),
        ));
    }
    sqlx::query!(
        "DELETE FROM providers WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .execute(conn)
    .await?;
    Ok(())
}

pub(crate) async fn record_check(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    check: &serde_json::Value,
) -> Result<()> {
    sqlx::query!(
        "UPDATE providers SET last_check = $2 WHERE workspace_id = $3 AND id = $1",
        id,
        Json(check) as Json<&serde_json::Value>,
        scope.workspace(),
    )
    .execute(conn)
    .await?;
    Ok(())
}
