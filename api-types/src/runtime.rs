//! The runtime and its operator's view of it: who this runtime and its caller are
//! (`GET /v1/whoami`), a workspace's limits, usage, provider templates, and the bodies and
//! answers of the agent-loop lineage and patch operations.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `local`: the operator on this host; `remote`: people a trusted proxy vouches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeMode {
    Local,
    Remote,
}

/// How a remote request proved who it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdentityForm {
    /// A signed JWT in `X-Keel-Identity`.
    Jwt,
    /// `X-Keel-Remote-Secret` with `X-Keel-Actor-Id`, `X-Keel-Org-Id`, … headers.
    Headers,
}

/// The identity a trusted proxy vouched for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RemoteIdentity {
    pub actor_id: String,
    pub org_id: String,
    pub runtime_id: String,
    pub project_id: Option<String>,
    pub name: Option<String>,
    pub form: IdentityForm,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Session {
    /// `member`, `operator` (of the org) or `runtime_operator` (the deployment's own; always
    /// in local mode): what the caller may do (in remote mode, the identity's `role`).
    #[schema(example = "operator")]
    pub role: String,
    /// The actor this request acts as (`local` in local mode).
    pub actor_id: String,
    /// The workspace this request sees and changes.
    pub workspace: String,
    /// Whether this caller may resolve an approval of its own request (`requested_by` is
    /// its `actor_id`): always in local mode, in remote mode only with
    /// `KEEL_ALLOW_SELF_APPROVAL`. Members resolve none either way.
    pub may_approve_own: bool,
    pub runtime_host: RuntimeHost,
    /// The identity the trusted proxy vouched for; absent in local mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_identity: Option<RemoteIdentity>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RuntimeHost {
    /// Generated once per database, stable across restarts and replicas.
    #[schema(example = "runtime_0190f7c1d2e37b4c8a5d6e7f80912a3b")]
    pub id: String,
    /// `KEEL_RUNTIME_LABEL`, else the host name.
    pub label: String,
    pub runtime_mode: RuntimeMode,
    /// `local_operator` or `remote_supervision`.
    #[schema(example = "local_operator")]
    pub operator_access: String,
    /// Whether this request could use the local-only actions.
    pub local_only_actions_available: bool,
    /// The local-only actions this request may use (`METHOD /path`).
    pub local_only_actions: Vec<String>,
}

/// A one-time code that signs a browser in to the console, from `POST
/// /console/sign-in-codes` (a console route, not one of the `/v1` API): the console's
/// sign-in link is `<base URL>/console#sign-in=<code>` (`keel console` prints it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConsoleSignInCode {
    pub code: String,
    /// After it, or after its one sign-in, the code is refused.
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ShutdownAccepted {
    #[schema(example = "shutting_down")]
    pub status: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({ "workspace_id": "acme", "max_concurrent": 4,
    "updated_at": "2026-12-01T10:00:00Z", "updated_by": "local" }))]
pub struct WorkspaceLimits {
    pub workspace_id: String,
    /// Most jobs the workspace runs at once; null: the workers'
    /// `KEEL_MAX_CONCURRENT_PER_WORKSPACE`.
    pub max_concurrent: Option<i32>,
    /// When an operator last set it; null if never.
    pub updated_at: Option<DateTime<Utc>>,
    pub updated_by: Option<String>,
}

/// New limits for a workspace.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "max_concurrent": 4 }))]
pub struct LimitsRequest {
    /// Most jobs the workspace runs at once (0 pauses it); null returns it to the workers'
    /// `KEEL_MAX_CONCURRENT_PER_WORKSPACE`.
    #[schema(minimum = 0, maximum = 2147483647)]
    pub max_concurrent: Option<u32>,
}

/// Sums over a set of model calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct UsageTotals {
    pub calls: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cached_tokens: i64,
    /// The cost of the calls whose model has a price; the others are counted in
    /// `calls_without_price`, never guessed.
    pub cost_micros_usd: i64,
    pub calls_without_price: i64,
}

/// The totals of one provider preset or one workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct UsageGroup {
    /// The provider preset id (`scope=provider`) or the workspace id (`scope=workspace`).
    pub key: String,
    #[cfg_attr(feature = "sqlx", sqlx(flatten))]
    #[serde(flatten)]
    pub totals: UsageTotals,
}

/// Usage totals and, for `scope=provider|workspace`, its rows.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "scope": "provider", "since": null, "until": null,
    "totals": { "calls": 3, "prompt_tokens": 1200, "completion_tokens": 300,
                "cached_tokens": 0, "cost_micros_usd": 1600, "calls_without_price": 1 },
    "rows": [{ "key": "openai", "calls": 3, "prompt_tokens": 1200, "completion_tokens": 300,
               "cached_tokens": 0, "cost_micros_usd": 1600, "calls_without_price": 1 }]
}))]
pub struct UsageSummary {
    pub scope: crate::Grouping,
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    pub totals: UsageTotals,
    /// One per provider preset or workspace, by key; empty for `global`.
    pub rows: Vec<UsageGroup>,
}

/// One model call, as the usage ledger holds it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct UsageEvent {
    pub id: String,
    pub task_id: String,
    pub run_id: String,
    /// The call's 1-based index within its run.
    pub index: i32,
    pub provider: String,
    pub model: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cached_tokens: i64,
    /// Null when the price table has no entry for the model.
    pub cost_micros_usd: Option<i64>,
    pub duration_ms: i64,
    pub created_at: DateTime<Utc>,
}

/// A reusable request body for `POST /providers`: disabled, with secret refs.
// `Cow`: the server builds its templates as constants, a client reads them owned.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProviderTemplate {
    #[schema(value_type = String)]
    pub template_id: Cow<'static, str>,
    #[schema(value_type = String)]
    pub kind: Cow<'static, str>,
    #[schema(value_type = String)]
    pub display_name: Cow<'static, str>,
    #[schema(value_type = String)]
    pub description: Cow<'static, str>,
    #[schema(value_type = String)]
    pub provider_id: Cow<'static, str>,
    #[schema(value_type = String)]
    pub model: Cow<'static, str>,
    #[schema(value_type = String)]
    pub api: Cow<'static, str>,
    #[schema(value_type = String)]
    pub base_url: Cow<'static, str>,
    #[schema(value_type = String)]
    pub api_key_ref: Cow<'static, str>,
    #[schema(value_type = Vec<String>)]
    pub capabilities: Cow<'static, [Cow<'static, str>]>,
    #[schema(value_type = Vec<String>)]
    pub input: Cow<'static, [Cow<'static, str>]>,
    pub enabled: bool,
}

closed_set! {
    /// Where a patch's change stands: in the file (`applied`), undone (`reverted`), only
    /// proposed (`proposed`: a tool called with `propose: true` left the file as it was,
    /// for an operator to apply) or proposed and `discarded`.
    PatchStatus {
        Applied = "applied",
        Reverted = "reverted",
        Proposed = "proposed",
        Discarded = "discarded",
    }
}

/// One file's change by an agent tool.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PatchSummary {
    /// The patch artifact's id.
    pub id: String,
    /// The artifact's name, `patch-<step_index>-<n>`.
    pub name: String,
    /// The file, relative to the run's workspace.
    pub path: String,
    #[schema(value_type = PatchStatus)]
    pub status: String,
    pub created_at: DateTime<Utc>,
    /// The file's size before and after the change; null: the file did not exist / was
    /// removed.
    pub before_bytes: Option<usize>,
    pub after_bytes: Option<usize>,
}

/// A patch with the file's content before and after.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PatchDetail {
    #[serde(flatten)]
    pub summary: PatchSummary,
    pub before: Option<String>,
    pub after: Option<String>,
}

/// Body of continue.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "prompt": "now add a test for it" }))]
pub struct ContinueRequest {
    /// The next user turn; not empty, at most 64 KiB.
    #[schema(pattern = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$", max_length = 65536)]
    pub prompt: String,
}

/// Body of retry-from-model-call.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "model_call_index": 2, "reason": "explore an alternative" }))]
pub struct RetryFromModelCallRequest {
    /// The source run's model call to re-issue: 1-based, at most its `model_call_count`.
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub model_call_index: i64,
    /// Why, for the run's `run.created` event.
    pub reason: Option<String>,
}
