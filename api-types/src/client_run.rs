//! Client-orchestrated runs: a run an external agent (an editor, an ACP host) carries out
//! itself and records in Keel, holding the run's lease instead of a worker.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::RunRecord;
use crate::schema::JsonObject;

/// Shortest and longest lease a client may ask for, and its default (ms).
pub const MIN_CLIENT_LEASE_MS: u32 = 1_000;
pub const MAX_CLIENT_LEASE_MS: u32 = 600_000;
pub const DEFAULT_CLIENT_LEASE_MS: u32 = 60_000;
/// Most events and steps one append carries.
pub const MAX_CLIENT_EVENTS: usize = 100;
pub const MAX_CLIENT_STEPS: usize = 50;
pub const MAX_CLIENT_ARTIFACTS: usize = 10;
/// Longest text of a client's artifact, in characters.
pub const MAX_CLIENT_ARTIFACT_CHARS: usize = 1_048_576;
/// A client event's kind and a client step's name: lower-case words joined by `.`, `_` or
/// `-`.
pub const CLIENT_NAME: &str = "^[a-z0-9]+([._-][a-z0-9]+)*$";
pub const MAX_CLIENT_NAME: usize = 64;

/// Body of a client-orchestrated run's start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "lease_ms": 60000, "reason": "editor session" }))]
pub struct ClientRunRequest {
    /// How long the lease lasts without an append (default 60000); every accepted append
    /// renews it for as long again.
    #[schema(minimum = 1000, maximum = 600000)]
    pub lease_ms: Option<u32>,
    /// Why, for the run's `run.created` event.
    #[schema(max_length = 1024, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}

/// A started client-orchestrated run and the lease its client holds. The token is shown
/// once, here; Keel keeps only its hash.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ClientRun {
    pub run: RunRecord,
    /// Sent with every append (`lease_token`): the proof that the caller holds the run.
    pub lease_token: String,
    pub lease_expires_at: DateTime<Utc>,
}

/// One event a client records: `client.event` in the run's stream and the feed, with
/// `data.kind` and `data.data`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientEvent {
    /// What happened, in the client's words (`message`, `tool.started`, …).
    #[schema(pattern = "^[a-z0-9]+([._-][a-z0-9]+)*$", max_length = 64)]
    pub kind: String,
    #[serde(default = "empty_object")]
    #[schema(value_type = JsonObject)]
    pub data: serde_json::Value,
}

/// One step a client carried out, recorded finished.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientStep {
    #[schema(pattern = "^[a-z0-9]+([._-][a-z0-9]+)*$", max_length = 64)]
    pub name: String,
    /// `completed` or `failed`.
    pub status: ClientOutcome,
    #[serde(default = "empty_object")]
    #[schema(value_type = JsonObject)]
    pub input: serde_json::Value,
    #[schema(value_type = Option<JsonObject>)]
    pub output: Option<serde_json::Value>,
    /// Why it failed (`failed` only).
    #[schema(max_length = 4096, pattern = "^[^\\u0000]*$")]
    pub error: Option<String>,
}

/// A text artifact a client records, complete (`kind` `file`), named once per run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientArtifact {
    #[schema(pattern = "^[a-z0-9]+([._-][a-z0-9]+)*$", max_length = 64)]
    pub name: String,
    /// A media type without parameters (default `text/plain`).
    #[schema(
        pattern = "^[A-Za-z0-9!#$&^_.+-]+/[A-Za-z0-9!#$&^_.+-]+$",
        max_length = 127
    )]
    pub content_type: Option<String>,
    #[schema(max_length = 1048576, pattern = "^[^\\u0000]*$")]
    pub text: String,
}

/// How a client's step or run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientOutcome {
    Completed,
    Failed,
}

/// The run's end, when the client is done: the lease ends with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClientFinish {
    pub status: ClientOutcome,
    /// Why it failed (`failed` only).
    #[schema(max_length = 4096, pattern = "^[^\\u0000]*$")]
    pub error: Option<String>,
}

/// Body of an append to a client-orchestrated run: the lease token, then what to record,
/// in order: steps, artifacts, events, and the end. An append with nothing to record renews the lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "lease_token": "kcl_…", "events": [{ "kind": "message",
    "data": { "text": "reading the tests" } }], "steps": [], "finish": null }))]
pub struct RunEventsRequest {
    #[schema(min_length = 1, max_length = 128, pattern = "^[^\\u0000]*$")]
    pub lease_token: String,
    #[serde(default)]
    #[schema(max_items = 100)]
    pub events: Vec<ClientEvent>,
    #[serde(default)]
    #[schema(max_items = 50)]
    pub steps: Vec<ClientStep>,
    #[serde(default)]
    #[schema(max_items = 10)]
    pub artifacts: Vec<ClientArtifact>,
    pub finish: Option<ClientFinish>,
}

/// What an append recorded, and the lease it renewed (null once the run ended).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunEventsAccepted {
    pub run: RunRecord,
    /// How many events it appended to the run's stream (its steps', its end's and the
    /// task's `task.updated` included).
    pub appended: i64,
    pub lease_expires_at: Option<DateTime<Utc>>,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
}
