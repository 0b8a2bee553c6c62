//! Event lists and SSE streams: per run, and the public feed across runs. Streams read
//! events from the database, woken when the database's snapshot changes (through
//! [`AppState::events`], see [`follow_commits`]) with a polling fallback, so a client on
//! any API process sees what any worker wrote, in order, and a client resuming with
//! `Last-Event-ID` misses nothing and sees nothing twice.
//!
//! A run's stream also carries the live text of its model calls as `model.delta` events
//! (see [`ModelDeltas`]): not persisted, so they have no `id` and resumption ignores them.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgListener;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use keel_api_types::{ActivityItem, EventType, ProjectedEvent, RunState, TranscriptEvent};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::agent::{activity, transcript};
use crate::api::extract::ApiQuery;
use crate::api::{ApiError, AppState, ListEnvelope, list, page_limit};
use crate::db::StoreError;
use crate::domain::{Caller, Scope};
use crate::events;
use crate::events::{EventRecord, FeedCursor, FeedFilter};
use crate::runs;

const STREAM_PAGE: i64 = 500;
/// How often an API process with open streams reads the snapshot to learn of commits.
const SNAPSHOT_POLL: Duration = Duration::from_millis(5);

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_run_events))
        .routes(routes!(stream_run_events))
        .routes(routes!(list_feed))
        .routes(routes!(stream_feed))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Only events with a greater `sequence` (default 0).
    #[param(minimum = 0)]
    after_sequence: Option<i64>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct StreamQuery {
    /// Only events with a greater `sequence` (default 0).
    #[param(minimum = 0)]
    after_sequence: Option<i64>,
    /// `state`: the last frame of each burst of events carries the run's state after them
    /// (`state`: the run, its last steps and artifacts, its pending approvals).
    /// `activity`: the last frame of each burst carries the run's `activity` after them
    /// ([`keel_api_types::ActivityItem`]s: model calls, tool calls, approvals, patches,
    /// the files changed, the answer, the result; another kind's steps).
    /// `transcript` (an agent loop's run): after each burst, `transcript` frames
    /// ([`keel_api_types::TranscriptEvent`]): a snapshot first, then what changed.
    #[param(inline)]
    projection: Option<Projection>,
    /// While the run is active, a `run.heartbeat` frame ([`keel_api_types::RunHeartbeat`],
    /// no id) every this many seconds, 1 to 300: its attempt's time, latest step, calls and
    /// cost against its budget. Absent: none.
    #[param(minimum = 1, maximum = 300)]
    heartbeat_s: Option<u32>,
}

/// What the last frame of a burst carries besides its event.
#[derive(Default)]
enum AfterBurst {
    #[default]
    Nothing,
    State(Box<RunState>),
    Activity(Vec<ActivityItem>),
}

impl AfterBurst {
    fn parts(self) -> (Option<RunState>, Option<Vec<ActivityItem>>) {
        match self {
            AfterBurst::Nothing => (None, None),
            AfterBurst::State(state) => (Some(*state), None),
            AfterBurst::Activity(activity) => (None, Some(activity)),
        }
    }
}

/// The longest `heartbeat_s` a stream takes.
const MOST_HEARTBEAT_S: u32 = 300;

/// What a run stream's frames carry besides their event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
enum Projection {
    State,
    Activity,
    Transcript,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct FeedQuery {
    /// Only events after this feed position: an event's `cursor` (default: from the start).
    // As many digits as always fit (a u64 transaction id, an i64 event id): longer ones
    // that still fit are cursors too, but a schema can only count digits.
    #[param(pattern = "^[0-9]{1,19}-[0-9]{1,18}$")]
    after: Option<String>,
    /// Page size, 1 to 200 (default 50).
    #[param(minimum = 1, maximum = 200)]
    limit: Option<i64>,
    /// Comma-separated event types; any of them matches.
    event_type: Option<String>,
    /// Only this task's events.
    task_id: Option<String>,
    /// Only this media job's events.
    media_job_id: Option<String>,
}

impl FeedQuery {
    fn filter(&self) -> FeedFilter {
        let event_types = self.event_type.as_deref().map(|csv| {
            csv.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect()
        });
        FeedFilter {
            event_types,
            task_id: self.task_id.clone(),
            media_job_id: self.media_job_id.clone(),
        }
    }
}

/// The `Last-Event-ID` header, trimmed, when present.
fn last_event_id(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    headers
        .get("last-event-id")
        .map(|value| value.to_str().map(str::trim))
        .transpose()
        .map_err(|_| ApiError::invalid("Last-Event-ID must be printable ASCII"))
}

/// A run's cursor: `Last-Event-ID` (a sequence), else `after_sequence`, else 0.
fn run_cursor(after_sequence: Option<i64>, headers: &HeaderMap) -> Result<i64, ApiError> {
    let from_header =
        match last_event_id(headers)? {
            None => None,
            Some(value) => Some(value.parse::<i64>().map_err(|_| {
                ApiError::invalid("Last-Event-ID must be an event sequence number")
            })?),
        };
    match from_header.or(after_sequence).unwrap_or(0) {
        n if n < 0 => Err(ApiError::invalid("after_sequence must not be negative")),
        n => Ok(n),
    }
}

/// The feed's cursor: `Last-Event-ID`, else `after`, else the start; either is an event's
/// `cursor`.
fn feed_cursor(after: Option<&str>, headers: &HeaderMap) -> Result<FeedCursor, ApiError> {
    let (name, text) = match (last_event_id(headers)?, after) {
        (Some(header), _) => ("Last-Event-ID", header),
        (None, Some(after)) => ("after", after),
        (None, None) => return Ok(FeedCursor::default()),
    };
    FeedCursor::parse(text).ok_or_else(|| {
        ApiError::invalid(format!(
            "{name} must be an event's feed cursor (its `cursor` field, as `<digits>-<digits>`)"
        ))
    })
}

/// A run's events in order; the cursor is `after_sequence`.
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/events", tag = "events",
    params(("task_id" = String, Path), ("run_id" = String, Path), EventsQuery),
    responses((status = 200, description = "A page of events", body = ListEnvelope<EventRecord>)))]
async fn list_run_events(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    ApiQuery(query): ApiQuery<EventsQuery>,
) -> Result<Json<ListEnvelope<EventRecord>>, ApiError> {
    let limit = page_limit(query.limit)?;
    let after = run_cursor(query.after_sequence, &HeaderMap::new())?;
    let mut conn = state.pool.acquire().await?;
    let scope = &caller.scope;
    runs::get(&mut conn, scope, &task_id, &run_id).await?;
    let rows = events::list_for_run(&mut conn, scope, &run_id, after, limit + 1).await?;
    Ok(Json(list(rows, limit, |e| e.sequence.to_string())))
}

/// The public feed of the workspace's runs' and media jobs' events, in feed order (each
/// run's in `sequence` order); the cursor is `after`, an event's `cursor`. Events of a
/// transaction that is still running, and those after it, appear once it ends.
#[utoipa::path(get, path = "/events", tag = "events", params(FeedQuery),
    responses((status = 200, description = "A page of events", body = ListEnvelope<EventRecord>)))]
async fn list_feed(
    State(state): State<AppState>,
    caller: Caller,
    ApiQuery(query): ApiQuery<FeedQuery>,
) -> Result<Json<ListEnvelope<EventRecord>>, ApiError> {
    let limit = page_limit(query.limit)?;
    let after = feed_cursor(query.after.as_deref(), &HeaderMap::new())?;
    let mut conn = state.pool.acquire().await?;
    let filter = query.filter();
    let rows = events::list_feed(&mut conn, &caller.scope, &filter, after, limit + 1).await?;
    Ok(Json(list(rows, limit, |e| e.cursor.clone())))
}

/// The run's events as server-sent events from the cursor on (`after_sequence` or the
/// `Last-Event-ID` header); the stream ends after the run's terminal event. Between them,
/// `model.delta` frames without an id carry the live text of the run's model calls. With
/// `projection=state`, the last frame of each burst of events read together also carries
/// the run's state after them ([`keel_api_types::ProjectedEvent`]). One identity holds at
/// most `KEEL_MAX_STREAMS_PER_IDENTITY` streams open (429 past it).
#[utoipa::path(get, path = "/tasks/{task_id}/runs/{run_id}/stream", tag = "events",
    params(("task_id" = String, Path), ("run_id" = String, Path), StreamQuery,
           ("Last-Event-ID" = Option<String>, Header, description = "Resume after this sequence")),
    responses((status = 200, description = "An SSE stream; each event's data is an event object (with `projection=state`, a `ProjectedEvent`: the event, and on the last frame of each burst its run's `state`), except `model.delta` (no id): `{\"model_call_index\", \"text\"}`, `run.heartbeat` (no id, with `heartbeat_s`: a `RunHeartbeat`) and `transcript` (no id, with `projection=transcript`: a `TranscriptEvent`)", content_type = "text/event-stream", body = String)))]
async fn stream_run_events(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<StreamQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let slot = state.streams.take(&caller)?;
    let mut after = run_cursor(query.after_sequence, &headers)?;
    let projection = query.projection;
    let projected = matches!(projection, Some(Projection::State | Projection::Activity));
    let heartbeat = match query.heartbeat_s {
        Some(s) if !(1..=MOST_HEARTBEAT_S).contains(&s) => {
            let message = format!("heartbeat_s must be 1 to {MOST_HEARTBEAT_S} seconds");
            return Err(ApiError::invalid(message));
        }
        every => every.map(|s| Duration::from_secs(s.into())),
    };
    let mut last_beat = tokio::time::Instant::now();
    let scope = caller.scope;
    runs::get(&mut *state.pool.acquire().await?, &scope, &task_id, &run_id).await?;
    // Read before the stream opens: a run without a transcript is refused with the reason.
    let mut shown = match query.projection {
        Some(Projection::Transcript) => {
            Some(transcript::read_snapshot(&state.pool, &scope, &task_id, &run_id).await?)
        }
        _ => None,
    };
    // Subscribed before the first read, so no delta sent after the stream opened is missed.
    let mut deltas = Some(state.deltas.subscribe());
    let stream = async_stream::stream! {
        // Moved into the stream, so the slot is given back when the stream is dropped.
        let _slot = slot;
        let mut wake = state.events.clone();
        if let Some(transcript) = &shown {
            let sequence = transcript.sequence;
            let transcript = transcript.clone();
            yield Ok(transcript_frame(&TranscriptEvent::TranscriptSnapshot { transcript, sequence }));
        }
        loop {
            wake.borrow_and_update();
            // Read the status before the events: if the run had ended, its last events
            // committed with that status and the read below sees them.
            let page = async {
                let mut conn = state.pool.acquire().await?;
                let run = runs::get(&mut conn, &scope, &task_id, &run_id).await?;
                let ended = run.status().is_terminal();
                let rows = events::list_for_run(&mut conn, &scope, &run_id, after, STREAM_PAGE).await?;
                let beat = match heartbeat {
                    Some(every) if !ended && last_beat.elapsed() >= every => {
                        Some(runs::heartbeat(&mut conn, &scope, &run).await?)
                    }
                    _ => None,
                };
                // Read after the events, so it holds at least what they recorded.
                let after_burst = match (projection, rows.is_empty()) {
                    (Some(Projection::State), false) => {
                        let run = runs::get(&mut conn, &scope, &task_id, &run_id).await?;
                        AfterBurst::State(Box::new(runs::state(&mut conn, &scope, run).await?))
                    }
                    (Some(Projection::Activity), false) => {
                        drop(conn);
                        AfterBurst::Activity(activity::read_snapshot(&state.pool, &scope, &task_id, &run_id).await?)
                    }
                    _ => AfterBurst::Nothing,
                };
                Ok::<_, StoreError>((ended, rows, after_burst, beat))
            }.await;
            let (ended, rows, mut after_burst, beat) = match page {
                Ok(page) => page,
                Err(error) => {
                    yield Ok(stream_error(&error));
                    break;
                }
            };
            let full = rows.len() as i64 == STREAM_PAGE;
            let last = rows.len();
            let burst = last > 0;
            for (position, event) in rows.into_iter().enumerate() {
                after = event.sequence;
                let id = event.sequence.to_string();
                match projected {
                    false => yield Ok(sse_event(&event, &id)),
                    true => {
                        let (state, activity) = match position + 1 == last {
                            true => std::mem::take(&mut after_burst).parts(),
                            false => (None, None),
                        };
                        yield Ok(sse_event(&ProjectedEvent { event, state, activity }, &id));
                    }
                }
            }
            if let Some(beat) = beat {
                last_beat = tokio::time::Instant::now();
                yield Ok(Event::default().event("run.heartbeat").json_data(&beat).expect("heartbeats serialize"));
            }
            if let Some(before) = shown.as_mut().filter(|_| burst && !full) {
                match transcript::read_snapshot(&state.pool, &scope, &task_id, &run_id).await {
                    Ok(next) => {
                        for change in before.changes(&next) {
                            yield Ok(transcript_frame(&change));
                        }
                        *before = next;
                    }
                    Err(error) => {
                        yield Ok(stream_error(&error));
                        break;
                    }
                }
            }
            if full {
                continue;
            }
            if ended || state.shutdown.is_cancelled() {
                break;
            }
            // Until the next commit (or the polling fallback), forward this run's deltas.
            let deadline = tokio::time::Instant::now() + state.stream_poll;
            while let Some(delta) = next_delta(&mut wake, &mut deltas, &state, deadline).await {
                if delta.is_for(&scope, &run_id) {
                    yield Ok(delta.event());
                }
            }
        }
    };
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Waits for a delta (Some) or for a reason to read the run's events again (None): a
/// commit, the polling deadline, or shutdown.
async fn next_delta(
    wake: &mut watch::Receiver<i64>,
    deltas: &mut Option<broadcast::Receiver<Arc<ModelDelta>>>,
    state: &AppState,
    deadline: tokio::time::Instant,
) -> Option<Arc<ModelDelta>> {
    loop {
        let delta = async {
            match deltas.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::time::timeout_at(deadline, wake.changed()) => return None,
            _ = state.shutdown.cancelled() => return None,
            received = delta => match received {
                Ok(delta) => return Some(delta),
                // A slow client loses deltas, never events: they are only a preview.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => *deltas = None,
            },
        }
    }
}

/// The workspace's public feed as server-sent events from the cursor on (`after` or the
/// `Last-Event-ID` header; SSE ids are the events' `cursor`); never ends. One identity
/// holds at most `KEEL_MAX_STREAMS_PER_IDENTITY` streams open (429 past it).
#[utoipa::path(get, path = "/events/stream", tag = "events",
    params(FeedQuery, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this feed cursor (an event's `cursor`)")),
    responses((status = 200, description = "An SSE stream; each event's data is an event object", content_type = "text/event-stream", body = String)))]
async fn stream_feed(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiQuery(query): ApiQuery<FeedQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let slot = state.streams.take(&caller)?;
    let mut after = feed_cursor(query.after.as_deref(), &headers)?;
    let (scope, filter) = (caller.scope, query.filter());
    let stream = async_stream::stream! {
        // Moved into the stream, so the slot is given back when the stream is dropped.
        let _slot = slot;
        let mut wake = state.events.clone();
        loop {
            wake.borrow_and_update();
            let page = async {
                let mut conn = state.pool.acquire().await?;
                events::list_feed(&mut conn, &scope, &filter, after, STREAM_PAGE).await
            }.await;
            let rows = match page {
                Ok(rows) => rows,
                Err(error) => {
                    yield Ok(stream_error(&error));
                    break;
                }
            };
            let full = rows.len() as i64 == STREAM_PAGE;
            for event in rows {
                // Parsed back from what the store wrote, so always a cursor.
                after = FeedCursor::parse(&event.cursor).unwrap_or(after);
                yield Ok(sse_event(&event, &event.cursor));
            }
            if state.shutdown.is_cancelled() {
                break;
            }
            if !full {
                wait(&mut wake, &state).await;
            }
        }
    };
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Wakes the streams of this process after each change of the database's snapshot: every
/// commit of events changes it, and so does every advance of the feed's horizon, when
/// events held back behind a running transaction become readable (whether or not that
/// transaction wrote events). Writers send no NOTIFY: PostgreSQL serializes the commits
/// of all notifying transactions. Reads only while a stream is open.
pub(super) fn follow_commits(pool: PgPool, shutdown: CancellationToken) -> watch::Receiver<i64> {
    let (tx, rx) = watch::channel(0i64);
    tokio::spawn(async move {
        let mut last = String::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(SNAPSHOT_POLL) => {}
            }
            // The receiver in the app state is always there; streams hold the others.
            if tx.receiver_count() <= 1 {
                continue;
            }
            let read = async { events::snapshot(&mut *pool.acquire().await?).await }.await;
            match read {
                Ok(snapshot) if snapshot != last => {
                    last = snapshot;
                    tx.send_modify(|changes| *changes += 1);
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "reading the snapshot failed; streams fall back to polling");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    });
    rx
}

async fn wait(wake: &mut watch::Receiver<i64>, state: &AppState) {
    // A closed channel (the follower stopped) leaves the polling fallback.
    tokio::select! {
        _ = tokio::time::timeout(state.stream_poll, wake.changed()) => {}
        _ = state.shutdown.cancelled() => {}
    }
}

/// The channel workers send live model text on (`pg_notify`, outside any transaction).
const DELTA_CHANNEL: &str = "keel_model_delta";
/// How many deltas a stream may fall behind before it skips some.
const DELTA_BUFFER: usize = 1024;
/// How soon the listener notices that the last stream has closed.
const DELTA_IDLE_CHECK: Duration = Duration::from_secs(1);
/// The wait before listening again after the database refused.
const DELTA_RETRY: Duration = Duration::from_millis(500);

/// A worker's `keel_model_delta` payload.
#[derive(Debug, Deserialize)]
pub(crate) struct ModelDelta {
    workspace_id: String,
    run_id: String,
    model_call_index: i64,
    text: String,
}

impl ModelDelta {
    fn is_for(&self, scope: &Scope, run_id: &str) -> bool {
        self.workspace_id == scope.workspace() && self.run_id == run_id
    }

    /// `model.delta` without an `id`: it is not an event of the log.
    fn event(&self) -> Event {
        let data = serde_json::json!({
            "model_call_index": self.model_call_index,
            "text": self.text,
        });
        Event::default().event("model.delta").data(data.to_string())
    }
}

/// Live model text for this process's run streams: one `LISTEN keel_model_delta`
/// connection, started by the first stream to subscribe and stopped once the last one
/// has closed, whose payloads every open stream receives (each keeps its run's).
pub(crate) struct ModelDeltas {
    pool: PgPool,
    shutdown: CancellationToken,
    /// The sender of the running listener; None while none runs.
    sender: Mutex<Option<broadcast::Sender<Arc<ModelDelta>>>>,
}

impl ModelDeltas {
    pub(super) fn new(pool: PgPool, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(ModelDeltas {
            pool,
            shutdown,
            sender: Mutex::new(None),
        })
    }

    /// A receiver of every delta this process hears, starting the listener if none runs.
    fn subscribe(self: &Arc<Self>) -> broadcast::Receiver<Arc<ModelDelta>> {
        let mut sender = self.sender.lock().expect("never poisoned");
        if let Some(running) = sender.as_ref() {
            return running.subscribe();
        }
        let (tx, rx) = broadcast::channel(DELTA_BUFFER);
        *sender = Some(tx.clone());
        tokio::spawn(self.clone().listen(tx));
        rx
    }

    /// Whether the last stream has gone; if so the listener is forgotten under the same
    /// lock [`subscribe`](Self::subscribe) takes, so a new stream starts a new one.
    fn unused(&self, tx: &broadcast::Sender<Arc<ModelDelta>>) -> bool {
        let mut sender = self.sender.lock().expect("never poisoned");
        let unused = tx.receiver_count() == 0;
        if unused {
            *sender = None;
        }
        unused
    }

    async fn listen(self: Arc<Self>, tx: broadcast::Sender<Arc<ModelDelta>>) {
        let mut listener: Option<PgListener> = None;
        loop {
            if self.shutdown.is_cancelled() || self.unused(&tx) {
                return;
            }
            let Some(connected) = listener.as_mut() else {
                match self.connect().await {
                    Ok(connected) => listener = Some(connected),
                    Err(error) => {
                        tracing::warn!(%error, "listening for model deltas failed; retrying");
                        tokio::time::sleep(DELTA_RETRY).await;
                    }
                }
                continue;
            };
            // `recv` reconnects by itself after the connection drops (deltas sent meanwhile
            // are lost: they are a preview, the step holds the text).
            let received = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = tokio::time::sleep(DELTA_IDLE_CHECK) => continue,
                received = connected.recv() => received,
            };
            match received {
                Ok(notification) => match serde_json::from_str(notification.payload()) {
                    Ok(delta) => {
                        // No receiver right now is not an error: the check above decides.
                        let _ = tx.send(Arc::new(delta));
                    }
                    Err(error) => tracing::warn!(%error, "a model delta payload is malformed"),
                },
                Err(error) => {
                    tracing::warn!(%error, "the model delta listener lost its connection");
                    listener = None;
                    tokio::time::sleep(DELTA_RETRY).await;
                }
            }
        }
    }

    async fn connect(&self) -> Result<PgListener, sqlx::Error> {
        let mut listener = PgListener::connect_with(&self.pool).await?;
        listener.listen(DELTA_CHANNEL).await?;
        Ok(listener)
    }
}

/// An event's frame: its type as the SSE event name, `data` the event (or the projected
/// event) as JSON.
fn sse_event(frame: &impl Framed, id: &str) -> Event {
    Event::default()
        .id(id)
        .event(frame.event_type().as_str())
        .json_data(frame)
        .expect("events serialize")
}

/// What a stream frame's data can be: an event, or an event with its run's state.
trait Framed: serde::Serialize {
    fn event_type(&self) -> EventType;
}

impl Framed for EventRecord {
    fn event_type(&self) -> EventType {
        self.event_type
    }
}

impl Framed for ProjectedEvent {
    fn event_type(&self) -> EventType {
        self.event.event_type
    }
}

/// A transcript frame: no id (the events' ids are the cursor), the `transcript` event.
fn transcript_frame(change: &TranscriptEvent) -> Event {
    Event::default()
        .event("transcript")
        .json_data(change)
        .expect("transcripts serialize")
}

fn stream_error(error: &StoreError) -> Event {
    tracing::warn!(%error, "event stream ended by a database error");
    Event::default().event("error").data(r#"{"type":"unavailable","message":"event stream interrupted; reconnect with Last-Event-ID"}"#)
}
