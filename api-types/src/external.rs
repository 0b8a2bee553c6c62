//! External work: WORKFLOW.md rendering, sources (a tracker target and its workflow), the
//! items their polls and imports found, and the approval-gated actions on items.

use std::borrow::Cow;
use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type,
};

use crate::schema::{
    ABSOLUTE_PATH, Field, NO_NUL, NOT_BLANK, Variant, one_of_strings, rule, string, tagged_union,
    when_absent_or,
};
use crate::{ApprovalRecord, SecretStatus};

/// The normalized item a template sees as `issue`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Issue {
    pub id: String,
    pub identifier: String,
    pub title: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub priority: Option<i64>,
    pub state: String,
    #[serde(default)]
    pub branch_name: Option<String>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub blocked_by: Vec<BlockerRef>,
    #[serde(default)]
    pub created_at: Option<String>,
    #[serde(default)]
    pub updated_at: Option<String>,
    /// Who the item is assigned to (Linear's user id, GitHub's login).
    #[serde(default)]
    pub assignee_id: Option<String>,
    /// Whether the item is assigned as the workflow's `tracker.assignee` asks (true when it
    /// names none): one that is not is not worked on (Symphony's routing).
    #[serde(default = "assigned")]
    pub assigned_to_worker: bool,
}

fn assigned() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BlockerRef {
    pub id: Option<String>,
    pub identifier: Option<String>,
    pub state: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenderRequest {
    /// The whole WORKFLOW.md: front matter and prompt template.
    pub workflow_markdown: String,
    /// The normalized item the template sees as `issue`.
    pub issue: Issue,
    /// Null on a first run, the retry number after.
    #[serde(default)]
    #[schema(value_type = Option<u64>, maximum = 4294967295_u64)]
    pub attempt: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Rendered {
    pub prompt: String,
}

/// The body of `POST /v1/external-work/sources`: exactly one of the two fields (the
/// document states it as a `oneOf`; here both are optional so the server can say which
/// rule was broken).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceRequest {
    /// The WORKFLOW.md text, kept on the source.
    pub workflow_markdown: Option<String>,
    /// An absolute path to a WORKFLOW.md, read at each use (local mode only: it reads the
    /// host's files).
    pub workflow_path: Option<String>,
}

impl utoipa::PartialSchema for SourceRequest {
    fn schema() -> RefOr<Schema> {
        let markdown = string(false, NO_NUL, None).description(Some(
            "The WORKFLOW.md text, kept on the source (422 when it does not parse or names no \
             tracker).",
        ));
        let path = string(false, ABSOLUTE_PATH, None).description(Some(
            "An absolute path to a WORKFLOW.md on the server's host, read at each use: local \
             mode only (403 in remote mode); 422 when it cannot be read or does not parse.",
        ));
        let only = |given: &'static str, schema: ObjectBuilder, other: &'static str| {
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property(given, schema)
                .required(given)
                .property(other, ObjectBuilder::new().schema_type(Type::Null))
                .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
        };
        OneOfBuilder::new()
            .description(Some(
                "Where the source's WORKFLOW.md is: exactly one of `workflow_markdown` and \
                 `workflow_path`.",
            ))
            .item(only("workflow_markdown", markdown, "workflow_path"))
            .item(only("workflow_path", path, "workflow_markdown"))
            .into()
    }
}

impl ToSchema for SourceRequest {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("SourceRequest")
    }
}

/// ETags a source remembers, by list URL. Never rendered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Etags(pub BTreeMap<String, String>);

#[cfg(feature = "sqlx")]
mod etags_column {
    use super::*;
    use sqlx::postgres::{PgTypeInfo, PgValueRef};
    use sqlx::types::Json;
    use sqlx::{Decode, Postgres, Type};

    /// A `jsonb` column, read as [`Json`] reads it.
    impl Type<Postgres> for Etags {
        fn type_info() -> PgTypeInfo {
            <Json<BTreeMap<String, String>> as Type<Postgres>>::type_info()
        }

        fn compatible(ty: &PgTypeInfo) -> bool {
            <Json<BTreeMap<String, String>> as Type<Postgres>>::compatible(ty)
        }
    }

    impl<'r> Decode<'r, Postgres> for Etags {
        fn decode(value: PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
            <Json<BTreeMap<String, String>> as Decode<Postgres>>::decode(value).map(|j| Etags(j.0))
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct SourceRecord {
    pub id: String,
    pub tracker_kind: String,
    /// `kind:endpoint:repository` (or project): one source per target and workspace.
    pub target: String,
    pub workflow_markdown: Option<String>,
    pub workflow_path: Option<String>,
    #[serde(skip)]
    pub etags: Etags,
    /// Set by a rate limit: no request to the tracker before then.
    pub backoff_until: Option<DateTime<Utc>>,
    pub background_enabled: bool,
    pub last_poll_at: Option<DateTime<Utc>>,
    #[schema(value_type = Option<Object>)]
    pub last_poll: Option<serde_json::Value>,
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    /// The actor who registered the source: the requester of the runs of the items it
    /// imports, whoever polls. Null for a source registered before registrants were
    /// recorded (its runs are requested by whoever polls or imports).
    pub registered_by: Option<String>,
    /// The registrant's role: `member`, `operator` or `runtime_operator`. The tracker's
    /// `api_key` of a source a tenant (member or operator) registered must stay granted to
    /// the workspace at every poll, reconcile and action send (`secret_not_granted`).
    pub registered_by_role: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

closed_set! {
    /// Whether a source's background polling is on.
    BackgroundStatus {
        Running = "running",
        Stopped = "stopped",
    }
}

closed_set! {
    /// What a tracker item is.
    ItemKind {
        GithubIssue = "github_issue",
        GithubPullRequest = "github_pull_request",
        LinearIssue = "linear_issue",
    }
}

closed_set! {
    /// Where an item is on its way to a run: `discovered`, its workspace
    /// `workspace_preparing`, `ready` for a task, `claimed` by one, `blocked` by another
    /// item, `retry_wait` after a failed run, or `terminal` (done, closed or removed).
    ItemState {
        Discovered = "discovered",
        Claimed = "claimed",
        WorkspacePreparing = "workspace_preparing",
        Ready = "ready",
        Blocked = "blocked",
        RetryWait = "retry_wait",
        Terminal = "terminal",
    }
}

closed_set! {
    /// What a proposed tracker write does.
    ActionKind {
        Comment = "comment",
        Labels = "labels",
        Review = "review",
        PullRequest = "pull_request",
    }
}

closed_set! {
    /// A proposed tracker write: `pending_approval`, then `approved` (waiting for its
    /// execute, unless the workflow executes on approval) and `sending`, ending `sent`,
    /// `stale_target` (the target changed since the proposal), `failed`, `rejected` (its
    /// approval was) or `cancelled` (while pending or approved). Seed 000's names, in order:
    /// `waiting_for_approval`, `approved`, `executing`, `succeeded`, `stale_target`,
    /// `failed`, `denied`, `cancelled`.
    ActionStatus {
        PendingApproval = "pending_approval",
        Approved = "approved",
        Sending = "sending",
        Sent = "sent",
        StaleTarget = "stale_target",
        Failed = "failed",
        Rejected = "rejected",
        Cancelled = "cancelled",
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct ItemRecord {
    pub id: String,
    pub source_id: String,
    pub idempotency_key: String,
    #[schema(value_type = ItemKind)]
    pub kind: String,
    pub identifier: String,
    pub tracker_state: String,
    pub state: ItemState,
    /// The normalized item, as the template saw it.
    #[schema(value_type = Object)]
    pub issue: serde_json::Value,
    pub prompt: Option<String>,
    pub task_id: Option<String>,
    pub run_id: Option<String>,
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    /// With `workspace.root`: the item's directory, from the start of its preparation until
    /// a terminal version had it removed.
    pub workspace_path: Option<String>,
    /// What `before_remove` printed, under its name (the other hooks' output is their
    /// run's artifacts).
    #[schema(value_type = Option<Object>)]
    pub hook_output: Option<serde_json::Value>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({
    "id": "xact_01a22b05d2aa7b6c8d9e0f1a2b3c4d5e", "item_id": "extitem_01a22b05c3e1734c9d7a0f2b6e41d890",
    "task_id": "task_01a22b05c3e1734c9d7a0f2b6e41d890", "run_id": "run_01a22b05d1f27a6b8c9e0d1f2a3b4c5d",
    "approval_id": "apr_01a22b05d2aa7b6c8d9e0f1a2b3c4d5f", "kind": "comment",
    "proposal": { "kind": "comment", "body": "Fixed in the linked branch." },
    "calls": [{ "method": "POST", "path": "/repos/acme/widgets/issues/7/comments",
                "body": { "body": "Fixed in the linked branch.\n\n<!-- keel-action:xact_01a22b05d2aa7b6c8d9e0f1a2b3c4d5e -->" } }],
    "target": { "identifier": "acme/widgets#7", "state": "open", "updated_at": "2026-11-30T09:00:00Z",
                "head_sha": null, "idempotency_key": "github:issue:acme/widgets:7:2026-11-30T09:00:00Z" },
    "status": "sent", "proposed_by": "operator", "proposed_by_run_id": null,
    "response": { "http_status": 201, "id": 99, "url": "https://github.com/acme/widgets/issues/7#issuecomment-99" },
    "artifact_id": "art_01a22b05d2aa7b6c8d9e0f1a2b3c4d60", "last_error_code": null, "last_error": null,
    "created_at": "2026-11-30T09:00:05Z", "decided_at": "2026-11-30T09:01:00Z",
    "sending_at": "2026-11-30T09:01:01Z", "finished_at": "2026-11-30T09:01:02Z",
    "updated_at": "2026-11-30T09:01:02Z", "execute_requested_at": "2026-11-30T09:01:00Z",
    "execute_requested_by": "operator", "cancelled_by": null, "cancel_reason": null
}))]
pub struct ActionRecord {
    pub id: String,
    pub item_id: String,
    /// The task and run the approval is attached to; the run's artifacts carry the answer.
    pub task_id: String,
    pub run_id: String,
    pub approval_id: Option<String>,
    #[schema(value_type = ActionKind)]
    pub kind: String,
    /// What was proposed.
    #[schema(value_type = Object)]
    pub proposal: serde_json::Value,
    /// Exactly what the job sends: `[{method, path, body}]`, paths relative to the tracker's
    /// endpoint, bodies ending with the hidden marker `<!-- keel-action:ID -->`.
    #[schema(value_type = Vec<Object>)]
    pub calls: serde_json::Value,
    /// The target when proposed: `identifier`, `state`, `updated_at`, `head_sha`,
    /// `idempotency_key`.
    #[schema(value_type = Object)]
    pub target: serde_json::Value,
    pub status: ActionStatus,
    pub proposed_by: String,
    /// The run that proposed it, when a run did.
    pub proposed_by_run_id: Option<String>,
    /// The tracker's answer, short: `http_status`, `id`, `url`.
    #[schema(value_type = Option<Object>)]
    pub response: Option<serde_json::Value>,
    /// The artifact (of `run_id`) with the tracker's answer, or the target that had changed.
    pub artifact_id: Option<String>,
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub decided_at: Option<DateTime<Utc>>,
    pub sending_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
    /// When its sending was asked for (`POST …/execute`, or its approval when the workflow
    /// executes on approval), and by whom.
    pub execute_requested_at: Option<DateTime<Utc>>,
    pub execute_requested_by: Option<String>,
    /// Who cancelled it, and why.
    pub cancelled_by: Option<String>,
    pub cancel_reason: Option<String>,
}

/// What one poll did, as `POST .../poll` answers and the source's `last_poll` keeps.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct PollSummary {
    pub candidates: u64,
    /// New items that became tasks.
    pub claimed: u64,
    pub duplicates: u64,
    pub blocked: u64,
    /// New items neither active nor terminal, or whose subject already has a task.
    pub discovered: u64,
    /// Of those discovered, the versions whose event (`issue.opened`, …) the workflow's
    /// `tracker.events` leave out: recorded, no task started.
    #[serde(default)]
    pub not_listened: u64,
    pub terminal: u64,
    /// Runs cancelled because their item left the active states.
    pub cancelled_runs: u64,
    /// Failed runs of items still active, tried again after their backoff.
    pub retried: u64,
    /// Every list answered 304: nothing changed.
    pub not_modified: bool,
    /// Set while a rate limit holds requests back.
    pub backoff_until: Option<DateTime<Utc>>,
    pub error_code: Option<String>,
    pub error: Option<String>,
}

/// How one candidate's import ended.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Imported {
    pub item: ItemRecord,
    /// True when the key was imported before: nothing changed.
    pub duplicate: bool,
    /// The run this version cancelled: its item left the active states.
    pub cancelled_run_id: Option<String>,
}

/// A proposal as recorded: the action and its pending approval.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Proposed {
    pub action: ActionRecord,
    pub approval: ApprovalRecord,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PollRequest {
    /// Items read per list, 1 to 100 (default 50).
    #[schema(minimum = 1, maximum = 100)]
    pub limit: Option<u32>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BackgroundRequest {
    pub enabled: bool,
}

/// Which items `GET /v1/external-work/items` lists, as a client asks: each filter given
/// narrows the list.
#[derive(Debug, Clone, Default)]
pub struct ItemListFilter {
    pub source_id: Option<String>,
    pub state: Option<ItemState>,
    pub kind: Option<ItemKind>,
}

/// Which actions `GET /v1/external-work/actions` lists, as a client asks: each filter given
/// narrows the list.
#[derive(Debug, Clone, Default)]
pub struct ActionListFilter {
    pub status: Option<ActionStatus>,
    pub kind: Option<ActionKind>,
    pub item_id: Option<String>,
    pub source_id: Option<String>,
}

/// Why an action is cancelled (optional): kept on the action, and the note of its
/// approval when that was still pending.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelActionRequest {
    #[schema(max_length = 2000)]
    pub reason: Option<String>,
}

/// Longest reason a cancel keeps (bytes).
pub const MAX_CANCEL_REASON_BYTES: usize = 2000;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    pub source_id: String,
    /// A GitHub issue or pull request, or a webhook payload holding one.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
}

/// The body of a proposal, as the client sent it: optional fields so the server can name
/// the one at fault; the document states the contract, a union on `kind`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionRequest {
    /// `comment` (`body`), `labels` (`add`, `remove`), `review` (`event`, `body`; pull
    /// requests only) or `pull_request` (`title`, `body`, `head`, `base`; GitHub only).
    /// Linear issues take comments only.
    pub kind: Option<String>,
    /// A comment's or review's text, at most 64 KiB; a hidden marker is appended to it.
    pub body: Option<String>,
    /// Labels to add; with `remove`, at most 20 in all.
    pub add: Option<Vec<String>>,
    /// Labels to remove.
    pub remove: Option<Vec<String>>,
    /// A review's `COMMENT`, `APPROVE` or `REQUEST_CHANGES`.
    pub event: Option<String>,
    /// A pull request's title; by default the item's.
    pub title: Option<String>,
    /// A pull request's branch; by default the one the run pushed.
    pub head: Option<String>,
    /// The branch a pull request merges into; by default the task's `base_branch`.
    pub base: Option<String>,
    /// The run of the item's task proposing it; by default the task's current run, to
    /// which the approval is attached either way.
    pub run_id: Option<String>,
}

/// A pull-request review's verdict, as GitHub spells it (upper case, so not a
/// `closed_set!`, whose names are snake_case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReviewEvent {
    Comment,
    Approve,
    RequestChanges,
}

impl ReviewEvent {
    pub const ALL: [ReviewEvent; 3] = [
        ReviewEvent::Comment,
        ReviewEvent::Approve,
        ReviewEvent::RequestChanges,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ReviewEvent::Comment => "COMMENT",
            ReviewEvent::Approve => "APPROVE",
            ReviewEvent::RequestChanges => "REQUEST_CHANGES",
        }
    }

    pub fn parse(value: &str) -> Option<ReviewEvent> {
        ReviewEvent::ALL.into_iter().find(|e| e.as_str() == value)
    }
}

/// Longest pull request title, or branch name, an action takes (bytes).
pub const MAX_TITLE_BYTES: usize = 256;
/// Longest comment or review body (bytes, before the marker).
pub const MAX_ACTION_BODY_BYTES: usize = 64 * 1024;
/// A label's name as the server takes one: no surrounding white space, no control
/// characters, not empty (at most [`MAX_LABEL_BYTES`] bytes besides).
pub const LABEL_NAME: &str = r#"^(?!\s)(?![\s\S]*\s$)[^\u0000-\u001f\u007f-\u009f]+$"#;
/// The most labels one change adds and removes together.
pub const MAX_LABELS: usize = 20;
/// GitHub's own limit on a label's name (bytes).
pub const MAX_LABEL_BYTES: usize = 50;

hand_written_schema!(ActionRequest, action_union);

fn action_union(schemas: &mut Vec<(String, RefOr<Schema>)>) -> RefOr<Schema> {
    let body = |nullable| -> RefOr<Schema> {
        string(nullable, NOT_BLANK, Some(MAX_ACTION_BODY_BYTES))
            .description(Some(
                "The text, at most 64 KiB (bytes; 422 beyond); a hidden marker is appended.",
            ))
            .into()
    };
    let labels = |what| -> RefOr<Schema> {
        ArrayBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
            .items(string(false, LABEL_NAME, Some(MAX_LABEL_BYTES)))
            .max_items(Some(MAX_LABELS))
            .unique_items(true)
            .description(Some(what))
            .into()
    };
    let run_id = || -> Field {
        let run = string(true, NO_NUL, None).description(Some(
            "The run of the item's task proposing it; by default the task's current run, to \
             which the approval is attached either way.",
        ));
        ("run_id", false, run.into())
    };
    let variant = |tag, name, description, fields: Vec<Field>, rules| Variant {
        tag,
        name,
        description,
        fields: fields.into_iter().chain([run_id()]).collect(),
        rules,
    };
    // At least one label: `add` or `remove` holds one.
    let one_label = |list: &str| {
        ObjectBuilder::new()
            .property(list, ArrayBuilder::new().min_items(Some(1)))
            .required(list)
    };
    let some_label = rule(
        "At least one label to add or to remove.",
        vec![one_label("add"), one_label("remove")],
    );
    // A review's body: required (a string) but for `APPROVE`.
    let approve = [Some(ReviewEvent::Approve.as_str())];
    let with_body = ObjectBuilder::new()
        .property("body", ObjectBuilder::new().schema_type(Type::String))
        .required("body");
    let review_body = rule(
        "`body` is required but for `APPROVE`.",
        vec![when_absent_or("event", &approve), with_body],
    );
    let text = |what| -> RefOr<Schema> {
        string(true, NOT_BLANK, Some(MAX_TITLE_BYTES))
            .description(Some(what))
            .into()
    };
    let event = one_of_strings(false, &ReviewEvent::ALL.map(ReviewEvent::as_str))
        .description(Some("The review's verdict, as GitHub spells it."));
    tagged_union(
        "kind",
        "One write on the item's tracker, by `kind`. Linear issues take comments only, and \
         reviews are for pull requests (422 `unsupported_action`).",
        vec![
            variant(
                "comment",
                "CommentActionRequest",
                "A comment on the item.",
                vec![("body", true, body(false))],
                Vec::new(),
            ),
            variant(
                "labels",
                "LabelsActionRequest",
                "Labels to add and to remove: at least one (stated) and at most 20 in all, \
                 names without surrounding spaces or control characters, not differing by \
                 case alone (422 otherwise).",
                vec![
                    ("add", false, labels("Labels to add.")),
                    ("remove", false, labels("Labels to remove.")),
                ],
                vec![some_label],
            ),
            variant(
                "review",
                "ReviewActionRequest",
                "A pull request's review; `body` is required but for `APPROVE` (stated; \
                 the server answers 422 too).",
                vec![("event", true, event.into()), ("body", false, body(true))],
                vec![review_body],
            ),
            variant(
                "pull_request",
                "PullRequestActionRequest",
                "A pull request from the branch the run pushed (`head`) into the task's \
                 `base_branch` (`base`), on GitHub only. 409 `nothing_pushed` when the run \
                 pushed no branch and none is named.",
                vec![
                    ("title", false, text("The title; by default the item's.")),
                    ("body", false, body(true)),
                    (
                        "head",
                        false,
                        text("The branch; by default the one the run pushed."),
                    ),
                    (
                        "base",
                        false,
                        text("The branch it merges into; by default the task's."),
                    ),
                ],
                Vec::new(),
            ),
        ],
        schemas,
    )
}

/// Seed 000's status shape: whether the workflow can be used (200 with `valid: false` and
/// the error when not, so a console can show setup guidance), whether its token resolves
/// (never its value), item counts, background polling and the last error.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SourceStatus {
    pub source_id: String,
    pub workflow: WorkflowHealth,
    /// Null when the workflow names no token (GitHub is then read unauthenticated).
    pub secret: Option<SecretStatus>,
    /// Items by state, with `total`.
    pub records: BTreeMap<String, i64>,
    /// The items' proposed tracker actions by status, with `total`.
    pub actions: BTreeMap<String, i64>,
    pub background: Background,
    /// The last poll's error, by what failed (`poll`).
    pub last_errors: BTreeMap<String, LastError>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct WorkflowHealth {
    pub path: Option<String>,
    pub valid: bool,
    pub source_kind: Option<String>,
    pub repository: Option<String>,
    pub project_slug: Option<String>,
    pub events: Vec<String>,
    pub secret_ref: Option<String>,
    pub polling_interval_ms: Option<u64>,
    /// `{type, message}` when not valid.
    #[schema(value_type = Option<Object>)]
    pub error: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Background {
    pub supported: bool,
    pub running: bool,
    /// `running` or `stopped`.
    #[schema(value_type = BackgroundStatus)]
    pub status: String,
    pub last_poll_at: Option<DateTime<Utc>>,
    /// Set while a tracker rate limit holds polls back.
    pub backoff_until: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct LastError {
    pub code: String,
    pub message: Option<String>,
    pub at: Option<DateTime<Utc>>,
}
