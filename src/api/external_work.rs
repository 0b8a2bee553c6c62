//! External work: WORKFLOW.md rendering, sources (a tracker target and its workflow), polls
//! and imports of tracker items into tasks, and the approval-gated actions on items.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::Utc;
use keel_api_types::{
    ActionKind, ActionRequest, ActionStatus, Background, BackgroundRequest, CancelActionRequest,
    Deleted, FixRun, ImportRequest, ItemKind, ItemState, LastError, MAX_CANCEL_REASON_BYTES,
    PollRequest, RenderRequest, Rendered, SourceRequest, SourceStatus, TriageRecord, TriageRequest,
    TriageScan, TriageStatus, WorkflowHealth,
};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{ApiJson, ApiQuery, OptionalJson};
use crate::api::{
    ApiError, AppState, ListEnvelope, ObjectEnvelope, PageQuery, list, object, page_limit,
};
use crate::domain::{Caller, Invalid, Scope};
use crate::external;
use crate::external::actions::ActionRecord;
use crate::external::actions::job::Proposed;
use crate::external::actions::{ActionDraft, ActionFilter, ProposedAction};
use crate::external::import::Imported;
use crate::external::poll;
use crate::external::poll::{DEFAULT_LIMIT, Pass, PollSummary};
use crate::external::tracker::{self, Poller, Tracker};
use crate::external::workflow::{self, Workflow, WorkflowError};
use crate::external::{ItemRecord, SourceRecord, WorkflowOrigin};
use crate::providers::secrets::{SecretPolicy, SecretStatus};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(render))
        .routes(routes!(create_source, list_sources))
        .routes(routes!(get_source, delete_source))
        .routes(routes!(source_status))
        .routes(routes!(list_items))
        .routes(routes!(list_work_items))
        .routes(routes!(poll_source))
        .routes(routes!(reconcile_source))
        .routes(routes!(set_background))
        .routes(routes!(import))
        .routes(routes!(get_item))
        .routes(routes!(propose_action, list_item_actions))
        .routes(routes!(get_action))
        .routes(routes!(list_actions))
        .routes(routes!(execute_action))
        .routes(routes!(cancel_action))
        .routes(routes!(triage_item))
        .routes(routes!(get_triage_scan))
        .routes(routes!(list_triage))
        .routes(routes!(get_triage))
        .routes(routes!(start_fix_run))
}

type Result<T> = std::result::Result<T, ApiError>;

/// Renders a workflow's prompt for an item, as a poll would; every workflow error class
/// answers 422 with its own type.
#[utoipa::path(post, path = "/external-work/render", tag = "external-work", request_body = RenderRequest,
    responses((status = 200, description = "The rendered prompt", body = ObjectEnvelope<Rendered>)))]
async fn render(
    _caller: Caller,
    ApiJson(request): ApiJson<RenderRequest>,
) -> Result<Json<ObjectEnvelope<Rendered>>> {
    // The document refuses NUL in every string a request carries (the rule other bodies
    // get from PostgreSQL); a render stores nothing, so it is checked here.
    if let Some(field) = nul_field(&request) {
        return Err(Invalid::new(
            field,
            "holds a NUL character (\\u0000), which the API refuses",
        )
        .into());
    }
    let workflow = Workflow::parse(&request.workflow_markdown)?;
    let prompt = workflow.render(&request.issue, request.attempt)?;
    Ok(Json(object("workflow_render", Rendered { prompt })))
}

/// The top-level field of a render request with a NUL in a string or key, if any.
fn nul_field(request: &RenderRequest) -> Option<&'static str> {
    fn has_nul(value: &serde_json::Value) -> bool {
        match value {
            serde_json::Value::String(text) => text.contains('\0'),
            serde_json::Value::Array(items) => items.iter().any(has_nul),
            serde_json::Value::Object(map) => {
                map.iter().any(|(k, v)| k.contains('\0') || has_nul(v))
            }
            _ => false,
        }
    }
    if request.workflow_markdown.contains('\0') {
        return Some("workflow_markdown");
    }
    let issue = serde_json::to_value(&request.issue).unwrap_or_default();
    has_nul(&issue).then_some("issue")
}

/// Registers a source: 201 when new, 200 with the existing one when its tracker target is
/// registered already. The workflow must parse and name a tracker.
#[utoipa::path(post, path = "/external-work/sources", tag = "external-work", request_body = SourceRequest,
    responses((status = 201, description = "The new source", body = ObjectEnvelope<SourceRecord>),
              (status = 200, description = "The source already registered for this target", body = ObjectEnvelope<SourceRecord>)))]
async fn create_source(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<SourceRequest>,
) -> Result<(StatusCode, Json<ObjectEnvelope<SourceRecord>>)> {
    let (origin, workflow) = match (request.workflow_markdown, request.workflow_path) {
        (Some(text), None) => {
            let workflow = Workflow::parse(&text)?;
            (WorkflowOrigin::Markdown(text), workflow)
        }
        (None, Some(path)) => {
            if !caller.is_local() {
                return Err(ApiError::Forbidden(
                    "workflow_path reads the host's files: only in local mode".into(),
                ));
            }
            if !std::path::Path::new(&path).is_absolute() {
                return Err(ApiError::invalid("workflow_path must be absolute"));
            }
            let workflow = Workflow::load(std::path::Path::new(&path))?;
            (WorkflowOrigin::Path(path), workflow)
        }
        _ => {
            return Err(ApiError::invalid(
                "give exactly one of workflow_markdown and workflow_path",
            ));
        }
    };
    if let Some(what) = operator_setting(&workflow) {
        caller
            .require_operator(&format!("register a source with {what}"))
            .map_err(ApiError::Forbidden)?;
    }
    let tracker = workflow::tracker(&workflow)?;
    // A tenant could otherwise send the source's token to a host of its choosing.
    if !caller.role.is_runtime_operator() && tracker.endpoint != tracker.api().default_endpoint() {
        return Err(ApiError::Forbidden(
            "tracker.endpoint: only the runtime operator aims a source at an endpoint other \
             than the tracker's public one"
                .into(),
        ));
    }
    // Checked again at every poll, reconcile and send (`tracker::usable_key`), as a
    // preset's secrets are at each use.
    if let Some(key) = &tracker.api_key {
        state
            .secrets
            .check_for(caller.role, caller.scope.workspace(), key)
            .map_err(|message| Invalid::new("tracker.api_key", message))?;
    }
    let mut conn = state.pool.acquire().await?;
    let target = (tracker.api().name(), tracker.target());
    let registrant = (&caller.actor(), caller.role);
    let (source, created) = external::insert_source(
        &mut conn,
        &caller.scope,
        (target.0, &target.1),
        &origin,
        registrant,
    )
    .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(object("external_work_source", source))))
}

/// What in a workflow only an operator may register, if anything: hooks are shell
/// scripts outside any run's approval, and `workspace.root` or an `in_place` task makes
/// Keel work in directories of the host.
fn operator_setting(workflow: &Workflow) -> Option<&'static str> {
    let config = &workflow.config;
    let hooks = &config.hooks;
    let scripts = [
        &hooks.after_create,
        &hooks.before_run,
        &hooks.after_run,
        &hooks.before_remove,
    ];
    let in_place = config
        .task
        .as_ref()
        .and_then(|task| task.get("workspace_mode"))
        .is_some_and(|mode| mode == "in_place");
    if scripts.iter().any(|script| script.is_some()) {
        Some("hooks")
    } else if config.workspace_root.is_some() {
        Some("a workspace.root")
    } else if in_place {
        Some("an in_place task")
    } else {
        None
    }
}

/// Lists sources, oldest first.
#[utoipa::path(get, path = "/external-work/sources", tag = "external-work", params(PageQuery),
    responses((status = 200, description = "A page of sources", body = ListEnvelope<SourceRecord>)))]
async fn list_sources(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<SourceRecord>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let cursor = page.cursor.as_deref();
    let rows = external::list_sources(&mut conn, &caller.scope, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |s| s.id.clone())))
}

#[utoipa::path(get, path = "/external-work/sources/{source_id}", tag = "external-work",
    params(("source_id" = String, Path)),
    responses((status = 200, description = "The source", body = ObjectEnvelope<SourceRecord>)))]
async fn get_source(
    State(state): State<AppState>,
    caller: Caller,
    Path(source_id): Path<String>,
) -> Result<Json<ObjectEnvelope<SourceRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let source = external::get_source(&mut conn, &caller.scope, &source_id).await?;
    Ok(Json(object("external_work_source", source)))
}

/// Deletes a source, its items and its background polling; the tasks it created stay.
#[utoipa::path(delete, path = "/external-work/sources/{source_id}", tag = "external-work",
    params(("source_id" = String, Path)),
    responses((status = 200, description = "The source is gone", body = Deleted)))]
async fn delete_source(
    State(state): State<AppState>,
    caller: Caller,
    Path(source_id): Path<String>,
) -> Result<Json<Deleted>> {
    let mut tx = state.pool.begin().await?;
    external::delete_source(&mut tx, &caller.scope, &source_id).await?;
    tx.commit().await?;
    Ok(Json(Deleted {
        object: "external_work_source".into(),
        id: source_id,
        deleted: true,
    }))
}

#[utoipa::path(get, path = "/external-work/sources/{source_id}/status", tag = "external-work",
    params(("source_id" = String, Path)),
    responses((status = 200, description = "The source's health", body = ObjectEnvelope<SourceStatus>)))]
async fn source_status(
    State(state): State<AppState>,
    caller: Caller,
    Path(source_id): Path<String>,
) -> Result<Json<ObjectEnvelope<SourceStatus>>> {
    let mut conn = state.pool.acquire().await?;
    let source = external::get_source(&mut conn, &caller.scope, &source_id).await?;
    let mut records = external::item_counts(&mut conn, &caller.scope, &source_id).await?;
    let mut actions =
        crate::external::actions::counts_for_source(&mut conn, &caller.scope, &source_id).await?;
    drop(conn);
    for counts in [&mut records, &mut actions] {
        counts.insert("total".into(), counts.values().sum());
    }
    let loaded = workflow::load_workflow(&source);
    let tracker = loaded.as_ref().ok().and_then(|w| w.config.tracker.clone());
    let secret = tracker
        .as_ref()
        .and_then(|t| key_status(t, (&source, &caller.scope), &state.secrets));
    let workflow = WorkflowHealth {
        path: source.workflow_path.clone(),
        valid: loaded.is_ok() && tracker.is_some(),
        source_kind: tracker.as_ref().map(|t| t.api().name().to_string()),
        repository: tracker.as_ref().and_then(|t| t.repository.clone()),
        project_slug: tracker.as_ref().and_then(|t| t.project_slug.clone()),
        events: tracker
            .as_ref()
            .map(|t| t.events.clone())
            .unwrap_or_default(),
        secret_ref: secret.as_ref().map(|s| s.r#ref.clone()),
        polling_interval_ms: loaded.as_ref().ok().map(|w| w.config.polling_interval_ms),
        error: loaded.err().map(
            |e: WorkflowError| serde_json::json!({ "type": e.code(), "message": e.to_string() }),
        ),
    };
    let running = source.background_enabled;
    let last_errors = source
        .last_error_code
        .clone()
        .map(|code| {
            let error = LastError {
                code,
                message: source.last_error.clone(),
                at: source.last_error_at,
            };
            BTreeMap::from([("poll".to_string(), error)])
        })
        .unwrap_or_default();
    let status = SourceStatus {
        source_id: source.id,
        workflow,
        secret,
        records,
        actions,
        background: Background {
            supported: true,
            running,
            status: if running { "running" } else { "stopped" }.into(),
            last_poll_at: source.last_poll_at,
            backoff_until: source.backoff_until.filter(|until| *until > Utc::now()),
        },
        last_errors,
    };
    Ok(Json(object("external_work_status", status)))
}

/// Whether the tracker's key resolves, as a poll would find it: a key its registrant may no
/// longer name is `secret_not_granted` and never looked at, so the status tells a tenant
/// nothing of a secret its workspace was not granted. Blocking: it may read a file.
fn key_status(
    tracker: &Tracker,
    source: (&SourceRecord, &Scope),
    secrets: &SecretPolicy,
) -> Option<SecretStatus> {
    let key = tracker.api_key.as_ref()?;
    Some(match tracker::usable_key(tracker, source, secrets) {
        Ok(_) => key.status(secrets),
        Err(refused) => SecretStatus {
            r#ref: key.to_string(),
            kind: key.kind().to_string(),
            configured: false,
            error_code: Some(refused.code.to_string()),
            message: Some(refused.message),
        },
    })
}

/// Lists a source's items, oldest first.
#[utoipa::path(get, path = "/external-work/sources/{source_id}/items", tag = "external-work",
    params(("source_id" = String, Path), PageQuery),
    responses((status = 200, description = "A page of items", body = ListEnvelope<ItemRecord>)))]
async fn list_items(
    State(state): State<AppState>,
    caller: Caller,
    Path(source_id): Path<String>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<ItemRecord>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    external::get_source(&mut conn, scope, &source_id).await?;
    let cursor = page.cursor.as_deref();
    let filter = external::ItemFilter {
        source_id: Some(&source_id),
        ..Default::default()
    };
    let rows = external::list_items(&mut conn, scope, filter, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |i| i.id.clone())))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ItemQuery {
    /// Only this source's items.
    source_id: Option<String>,
    /// Only items in this state.
    #[param(value_type = Option<ItemState>, inline)]
    state: Option<ItemState>,
    /// Only items of this kind.
    #[param(value_type = Option<ItemKind>, inline)]
    kind: Option<ItemKind>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Lists the workspace's items across its sources, oldest first; `source_id`, `state` and
/// `kind` narrow the list. Reads Keel's records only: no tracker is asked.
#[utoipa::path(get, path = "/external-work/items", tag = "external-work", params(ItemQuery),
    responses((status = 200, description = "A page of items", body = ListEnvelope<ItemRecord>)))]
async fn list_work_items(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ItemQuery>,
) -> Result<Json<ListEnvelope<ItemRecord>>> {
    let limit = page_limit(query.limit)?;
    let filter = external::ItemFilter {
        source_id: query.source_id.as_deref(),
        state: query.state,
        kind: query.kind.map(ItemKind::as_str),
    };
    let mut conn = state.pool.acquire().await?;
    let cursor = query.cursor.as_deref();
    let rows = external::list_items(&mut conn, &caller.scope, filter, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |i| i.id.clone())))
}

/// Polls the source now, in this request, and answers what the poll did. Safe beside a
/// background poll of the same source: imports are idempotent by item key.
#[utoipa::path(post, path = "/external-work/sources/{source_id}/poll", tag = "external-work",
    params(("source_id" = String, Path)), request_body(content = Option<PollRequest>),
    responses((status = 200, description = "What the poll did", body = ObjectEnvelope<PollSummary>)))]
async fn poll_source(
    State(state): State<AppState>,
    caller: Caller,
    Path(source_id): Path<String>,
    OptionalJson(request): OptionalJson<PollRequest>,
) -> Result<Json<ObjectEnvelope<PollSummary>>> {
    let limit = match request.limit.unwrap_or(DEFAULT_LIMIT) {
        n @ 1..=100 => n,
        n => {
            return Err(ApiError::invalid(format!(
                "limit must be 1 to 100, not {n}"
            )));
        }
    };
    let mut conn = state.pool.acquire().await?;
    let source = external::get_source(&mut conn, &caller.scope, &source_id).await?;
    drop(conn);
    let (poller, pass) = (poller(&state), Pass::Poll { limit });
    let (summary, _) = poll::poll(&poller, &caller.scope, &source, pass, &caller.actor()).await?;
    Ok(Json(object("external_work_poll", summary)))
}

/// Reconciles the source now: asks the tracker for the current version of each item whose
/// run is still active, and cancels the run of one that left the active states. Every
/// poll does this too; this asks nothing else.
#[utoipa::path(post, path = "/external-work/sources/{source_id}/reconcile", tag = "external-work",
    params(("source_id" = String, Path)),
    responses((status = 200, description = "What the reconciliation did", body = ObjectEnvelope<PollSummary>)))]
async fn reconcile_source(
    State(state): State<AppState>,
    caller: Caller,
    Path(source_id): Path<String>,
) -> Result<Json<ObjectEnvelope<PollSummary>>> {
    let mut conn = state.pool.acquire().await?;
    let source = external::get_source(&mut conn, &caller.scope, &source_id).await?;
    drop(conn);
    let (poller, pass) = (poller(&state), Pass::Reconcile);
    let (summary, _) = poll::poll(&poller, &caller.scope, &source, pass, &caller.actor()).await?;
    Ok(Json(object("external_work_poll", summary)))
}

fn poller(state: &AppState) -> Poller {
    Poller::new(
        state.pool.clone(),
        state.rules.clone(),
        state.content.clone(),
        (*state.secrets).clone(),
    )
}

/// Turns background polling on (the source's `poll` job, shared by every worker, polls
/// every `polling.interval_ms`) or off.
#[utoipa::path(post, path = "/external-work/sources/{source_id}/background", tag = "external-work",
    params(("source_id" = String, Path)), request_body = BackgroundRequest,
    responses((status = 200, description = "The source", body = ObjectEnvelope<SourceRecord>)))]
async fn set_background(
    State(state): State<AppState>,
    caller: Caller,
    Path(source_id): Path<String>,
    ApiJson(request): ApiJson<BackgroundRequest>,
) -> Result<Json<ObjectEnvelope<SourceRecord>>> {
    let scope = &caller.scope;
    let mut tx = state.pool.begin().await?;
    let source = external::set_background(&mut tx, scope, &source_id, request.enabled).await?;
    tx.commit().await?;
    Ok(Json(object("external_work_source", source)))
}

/// Imports one item by hand, through the same path as a poll: 201 for a new item (a task
/// when it is active), 200 with `duplicate: true` when its key was imported before.
#[utoipa::path(post, path = "/external-work/import", tag = "external-work", request_body = ImportRequest,
    responses((status = 201, description = "The new item", body = ObjectEnvelope<Imported>),
              (status = 200, description = "The item imported before", body = ObjectEnvelope<Imported>)))]
async fn import(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<ImportRequest>,
) -> Result<(StatusCode, Json<ObjectEnvelope<Imported>>)> {
    let mut conn = state.pool.acquire().await?;
    let source = external::get_source(&mut conn, &caller.scope, &request.source_id).await?;
    drop(conn);
    let workflow = workflow::load_workflow(&source)?;
    let tracker = workflow::tracker(&workflow)?;
    let candidate = tracker
        .api()
        .payload_candidate(tracker, &request.payload)
        .map_err(|message| ApiError::Invalid {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            message: format!("payload: {message}"),
        })?;
    let poller = poller(&state);
    let (scope, actor) = (&caller.scope, &caller.actor());
    let imported =
        external::import::import(&poller, scope, &source, &workflow, &candidate, actor).await?;
    let status = if imported.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(object("external_work_import", imported))))
}

/// Reads an item: the tracker's issue as last seen, where its import stands, and the task
/// and run working on it.
#[utoipa::path(get, path = "/external-work/items/{item_id}", tag = "external-work",
    params(("item_id" = String, Path)),
    responses((status = 200, description = "The item", body = ObjectEnvelope<ItemRecord>)))]
async fn get_item(
    State(state): State<AppState>,
    caller: Caller,
    Path(item_id): Path<String>,
) -> Result<Json<ObjectEnvelope<ItemRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let item = external::get_item(&mut conn, &caller.scope, &item_id).await?;
    Ok(Json(object("external_work_item", item)))
}

/// Proposes one write on an item's tracker: records exactly what will be sent and the
/// target as it stands, and opens an `external_action` approval of the item's task. Nothing
/// is sent before it is approved; then the target is asked for again and a changed one is
/// refused (`stale_target`). 409 `item_not_claimed` when no task works on the item yet,
/// 422 `unsupported_action` for a review of an issue or labels and reviews on Linear.
#[utoipa::path(post, path = "/external-work/items/{item_id}/actions", tag = "external-work",
    params(("item_id" = String, Path)), request_body = ActionRequest,
    responses((status = 201, description = "The proposed action and its approval", body = ObjectEnvelope<Proposed>)))]
async fn propose_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(item_id): Path<String>,
    ApiJson(request): ApiJson<ActionRequest>,
) -> Result<(StatusCode, Json<ObjectEnvelope<Proposed>>)> {
    let draft = ActionDraft {
        kind: request.kind,
        body: request.body,
        add: request.add,
        remove: request.remove,
        event: request.event,
        title: request.title,
        head: request.head,
        base: request.base,
    };
    let action = ProposedAction::parse(draft)?;
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let run_id = request.run_id.as_deref();
    let proposed =
        external::actions::job::propose(&mut tx, scope, &item_id, &action, run_id, actor).await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(object("external_work_action_proposal", proposed)),
    ))
}

/// Lists an item's actions, oldest first.
#[utoipa::path(get, path = "/external-work/items/{item_id}/actions", tag = "external-work",
    params(("item_id" = String, Path), PageQuery),
    responses((status = 200, description = "A page of actions", body = ListEnvelope<ActionRecord>)))]
async fn list_item_actions(
    State(state): State<AppState>,
    caller: Caller,
    Path(item_id): Path<String>,
    ApiQuery(page): ApiQuery<PageQuery>,
) -> Result<Json<ListEnvelope<ActionRecord>>> {
    let limit = page_limit(page.limit)?;
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    crate::external::get_item(&mut conn, scope, &item_id).await?;
    let filter = ActionFilter {
        item_id: Some(&item_id),
        ..ActionFilter::default()
    };
    let cursor = page.cursor.as_deref();
    let rows = crate::external::actions::list(&mut conn, scope, filter, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ActionQuery {
    /// Only actions in this status (`approved`: those waiting for their execute).
    #[param(value_type = Option<ActionStatus>, inline)]
    status: Option<ActionStatus>,
    #[param(value_type = Option<ActionKind>, inline)]
    kind: Option<ActionKind>,
    /// Only this item's actions.
    item_id: Option<String>,
    /// Only actions on this source's items.
    source_id: Option<String>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Lists the workspace's tracker actions, oldest first; `status`, `kind`, `item_id` and
/// `source_id` narrow the list. No tracker is asked.
#[utoipa::path(get, path = "/external-work/actions", tag = "external-work", params(ActionQuery),
    responses((status = 200, description = "A page of actions", body = ListEnvelope<ActionRecord>)))]
async fn list_actions(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<ActionQuery>,
) -> Result<Json<ListEnvelope<ActionRecord>>> {
    let limit = page_limit(query.limit)?;
    let filter = ActionFilter {
        status: query.status,
        kind: query.kind.map(ActionKind::as_str),
        item_id: query.item_id.as_deref(),
        source_id: query.source_id.as_deref(),
    };
    let mut conn = state.pool.acquire().await?;
    let cursor = query.cursor.as_deref();
    let rows =
        crate::external::actions::list(&mut conn, &caller.scope, filter, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |a| a.id.clone())))
}

/// Sends an approved action: queues its job, which asks the tracker for the target again,
/// refuses a changed one (`stale_target`) and makes exactly the stored calls. Asking again
/// answers the same action; 409 `action_not_executable` unless it is approved. Operators
/// only.
#[utoipa::path(post, path = "/external-work/actions/{action_id}/execute", tag = "external-work",
    params(("action_id" = String, Path)),
    responses((status = 200, description = "The action, its sending queued", body = ObjectEnvelope<ActionRecord>)))]
async fn execute_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(action_id): Path<String>,
) -> Result<Json<ObjectEnvelope<ActionRecord>>> {
    caller
        .require_operator("execute an external action")
        .map_err(ApiError::Forbidden)?;
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let action = crate::external::actions::execute(&mut tx, scope, &action_id, actor).await?;
    tx.commit().await?;
    Ok(Json(object("external_work_action", action)))
}

/// Cancels a pending or approved action: nothing is sent, and a pending approval is
/// rejected with the reason. 409 `action_not_cancellable` once it is being sent or has
/// ended. Operators, and whoever proposed it.
#[utoipa::path(post, path = "/external-work/actions/{action_id}/cancel", tag = "external-work",
    params(("action_id" = String, Path)), request_body(content = Option<CancelActionRequest>),
    responses((status = 200, description = "The cancelled action", body = ObjectEnvelope<ActionRecord>)))]
async fn cancel_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(action_id): Path<String>,
    OptionalJson(request): OptionalJson<CancelActionRequest>,
) -> Result<Json<ObjectEnvelope<ActionRecord>>> {
    let reason = request.reason.as_deref().map(str::trim);
    if reason.is_some_and(|r| r.len() > MAX_CANCEL_REASON_BYTES || r.contains('\0')) {
        let why = format!("must be at most {MAX_CANCEL_REASON_BYTES} bytes, without NUL");
        return Err(Invalid::new("reason", why).into());
    }
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let found = crate::external::actions::get(&mut tx, scope, &action_id).await?;
    if found.proposed_by != actor.to_string() {
        caller
            .require_operator("cancel an external action another proposed")
            .map_err(ApiError::Forbidden)?;
    }
    let reason = reason.filter(|r| !r.is_empty());
    let action =
        crate::external::actions::cancel(&mut tx, scope, &action_id, reason, actor).await?;
    tx.commit().await?;
    Ok(Json(object("external_work_action", action)))
}

/// Reads an action: what it sends, the target it was proposed on, where it stands, and
/// the tracker's answer.
#[utoipa::path(get, path = "/external-work/actions/{action_id}", tag = "external-work",
    params(("action_id" = String, Path)),
    responses((status = 200, description = "The action", body = ObjectEnvelope<ActionRecord>)))]
async fn get_action(
    State(state): State<AppState>,
    caller: Caller,
    Path(action_id): Path<String>,
) -> Result<Json<ObjectEnvelope<ActionRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let action = crate::external::actions::get(&mut conn, &caller.scope, &action_id).await?;
    Ok(Json(object("external_work_action", action)))
}

/// Triages the pull request item's CI: a scan is recorded and a worker job reads GitHub
/// (GET only) for the head's failing checks and jobs, recording each once with its
/// evidence and, unless `create_task` is false, a fix task. Answers the scan `queued`; read
/// it again for its summary. A head that moved on since the item's version is recorded
/// `stale` and no CI is read. 422 `unsupported_action` for an item that is no pull request.
#[utoipa::path(post, path = "/external-work/items/{item_id}/ci-triage", tag = "external-work",
    params(("item_id" = String, Path)), request_body(content = Option<TriageRequest>),
    responses((status = 202, description = "The scan, queued", body = ObjectEnvelope<TriageScan>)))]
async fn triage_item(
    State(state): State<AppState>,
    caller: Caller,
    Path(item_id): Path<String>,
    OptionalJson(request): OptionalJson<TriageRequest>,
) -> Result<(StatusCode, Json<ObjectEnvelope<TriageScan>>)> {
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let scan = external::triage::request_scan(&mut tx, scope, &item_id, &request, actor).await?;
    tx.commit().await?;
    Ok((StatusCode::ACCEPTED, Json(object("ci_triage_scan", scan))))
}

/// Reads a scan: `queued` until its job ends it `done` (with the seed's counts and the
/// records it made or found again) or `failed` (with why).
#[utoipa::path(get, path = "/external-work/ci-triage/scans/{scan_id}", tag = "external-work",
    params(("scan_id" = String, Path)),
    responses((status = 200, description = "The scan", body = ObjectEnvelope<TriageScan>)))]
async fn get_triage_scan(
    State(state): State<AppState>,
    caller: Caller,
    Path(scan_id): Path<String>,
) -> Result<Json<ObjectEnvelope<TriageScan>>> {
    let mut conn = state.pool.acquire().await?;
    let scan = external::triage::get_scan(&mut conn, &caller.scope, &scan_id).await?;
    Ok(Json(object("ci_triage_scan", scan)))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct TriageQuery {
    /// Only this item's records.
    item_id: Option<String>,
    /// Only records of this source's items.
    source_id: Option<String>,
    #[param(value_type = Option<TriageStatus>, inline)]
    status: Option<TriageStatus>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Lists the workspace's CI triage records, oldest first, narrowed by `item_id`,
/// `source_id` and `status`. Reads Keel's records only: GitHub is not asked.
#[utoipa::path(get, path = "/external-work/ci-triage", tag = "external-work", params(TriageQuery),
    responses((status = 200, description = "A page of triage records", body = ListEnvelope<TriageRecord>)))]
async fn list_triage(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<TriageQuery>,
) -> Result<Json<ListEnvelope<TriageRecord>>> {
    let limit = page_limit(query.limit)?;
    let filter = external::triage::RecordFilter {
        item_id: query.item_id.as_deref(),
        source_id: query.source_id.as_deref(),
        status: query.status,
    };
    let mut conn = state.pool.acquire().await?;
    let cursor = query.cursor.as_deref();
    let rows =
        external::triage::list_records(&mut conn, &caller.scope, filter, cursor, limit + 1).await?;
    Ok(Json(list(rows, limit, |r| r.id.clone())))
}

/// Reads one CI triage record: the failing check, its evidence artifact, its fix task and
/// run.
#[utoipa::path(get, path = "/external-work/ci-triage/{triage_id}", tag = "external-work",
    params(("triage_id" = String, Path)),
    responses((status = 200, description = "The record", body = ObjectEnvelope<TriageRecord>)))]
async fn get_triage(
    State(state): State<AppState>,
    caller: Caller,
    Path(triage_id): Path<String>,
) -> Result<Json<ObjectEnvelope<TriageRecord>>> {
    let mut conn = state.pool.acquire().await?;
    let record = external::triage::get_record(&mut conn, &caller.scope, &triage_id).await?;
    Ok(Json(object("ci_triage", record)))
}

/// Starts the record's fix run (a start of its fix task, behind the task's gates), or
/// answers the one it started: one run per record, task and head, however often asked.
/// GitHub is neither read nor changed. 409 `triage_not_runnable` for a stale record or one
/// without a fix task.
#[utoipa::path(post, path = "/external-work/ci-triage/{triage_id}/run", tag = "external-work",
    params(("triage_id" = String, Path)),
    responses((status = 201, description = "The record and its fix run", body = ObjectEnvelope<FixRun>)))]
async fn start_fix_run(
    State(state): State<AppState>,
    caller: Caller,
    Path(triage_id): Path<String>,
) -> Result<(StatusCode, Json<ObjectEnvelope<FixRun>>)> {
    let mut tx = state.pool.begin().await?;
    let (scope, actor) = (&caller.scope, &caller.actor());
    let fix =
        external::triage::start_fix_run(&mut tx, scope, &triage_id, &state.rules, actor).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(object("ci_triage_fix_run", fix))))
}
