//! What every tracker shares, beneath `github` and `linear`: [`TrackerApi`], what each
//! tracker does its own way, and what it is given and gives back: a workflow's [`Tracker`]
//! settings, the [`Poller`] (the pool, the admission rules and the HTTP client the trackers
//! are asked with), the tracker's token, a normalized item ([`Candidate`]), what a fetch
//! gave ([`Fetched`]), the reading of rate-limit headers ([`resume_at`]), and an action's
//! calls ([`Call`]), what they are sent to ([`Target`]) and what came back ([`Answer`],
//! [`Failure`], [`Pause`]). It names no tracker: the one dispatch on the kind,
//! [`TrackerKind::api`], stands above the trackers, in `workflow`.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use keel_api_types::{ErrorCode, Issue};
use keel_workers::media::Secret;
use reqwest::header::{self, HeaderMap};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use utoipa::ToSchema;

use crate::artifacts::content::ContentStore;
use crate::db::StoreError;
use crate::domain::{Role, Scope};
use crate::external::actions::ProposedAction;
use crate::external::{ItemRecord, SourceRecord};
use crate::providers::secrets::{SecretPolicy, SecretRef, Unresolved};
use crate::runs::AdmissionRules;

/// A rate limit that says nothing about when it lifts waits this long.
const DEFAULT_BACKOFF: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The most items one [`TrackerApi::fetch_items`] is asked for: what one Linear query
/// answers.
pub(crate) const ITEMS_PER_FETCH: u32 = 50;

/// A workflow's `tracker.kind`. Its implementation, [`TrackerKind::api`], is given in
/// `workflow`, above `github` and `linear`: they take these types, so the types stand here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TrackerKind {
    Github,
    Linear,
}

/// Where items come from. `api_key` is a secret reference (`$VAR` is read as `env:VAR`),
/// resolved only when a poll uses it; a raw token is refused.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(crate) struct Tracker {
    pub(crate) kind: TrackerKind,
    pub(crate) endpoint: String,
    #[schema(value_type = Option<String>, example = "env:GITHUB_TOKEN")]
    #[serde(serialize_with = "display_ref")]
    pub(crate) api_key: Option<SecretRef>,
    /// `owner/repo`, for GitHub.
    pub(crate) repository: Option<String>,
    /// For Linear.
    pub(crate) project_slug: Option<String>,
    pub(crate) active_states: Vec<String>,
    pub(crate) terminal_states: Vec<String>,
    /// Symphony's `required_labels`, trimmed and lowercased: an item is worked on only
    /// when it carries every one (a blank one matches no item).
    pub(crate) required_labels: Vec<String>,
    /// Seed 000's event filter (`pull_request.opened`, …), kept as given.
    pub(crate) events: Vec<String>,
    /// Symphony's `tracker.assignee` (Linear): a user id, or `me` (the key's own user);
    /// only the items assigned so are worked on. None: every item.
    pub(crate) assignee: Option<String>,
}

impl Tracker {
    /// Whether an item in `state` is to be worked on (compared trimmed, without case).
    pub(crate) fn is_active(&self, state: &str) -> bool {
        contains_state(&self.active_states, state)
    }

    pub(crate) fn is_terminal(&self, state: &str) -> bool {
        contains_state(&self.terminal_states, state)
    }

    /// Whether the workflow's `events` let a version that is `event` start work: every
    /// event does when it names none.
    pub(crate) fn listens_to(&self, event: &str) -> bool {
        self.events.is_empty() || self.events.iter().any(|e| e.trim() == event)
    }

    /// Whether `issue` is to be worked on: in an active state, assigned as `assignee` asks,
    /// with every required label (Symphony's dispatch eligibility). An item that stops
    /// being wanted has its run stopped.
    pub(crate) fn wants(&self, issue: &Issue) -> bool {
        let labels: Vec<String> = issue.labels.iter().map(|l| normalized(l)).collect();
        self.is_active(&issue.state)
            && issue.assigned_to_worker
            && self
                .required_labels
                .iter()
                .all(|required| !required.is_empty() && labels.contains(required))
    }
}

/// A state or label as compared: trimmed, without case.
pub(crate) fn normalized(text: &str) -> String {
    text.trim().to_lowercase()
}

fn contains_state(states: &[String], state: &str) -> bool {
    let state = normalized(state);
    states.iter().any(|s| normalized(s) == state)
}

fn display_ref<S: serde::Serializer>(
    value: &Option<SecretRef>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        Some(r) => serializer.serialize_some(&r.to_string()),
        None => serializer.serialize_none(),
    }
}

/// One kind of tracker, as Keel reads and writes it: everything that is not the same for
/// every tracker. Each [`TrackerKind`] has one implementation ([`Tracker::api`]), so the
/// callers never ask which kind it is.
pub(crate) trait TrackerApi: Sync {
    /// Its `tracker.kind` in a workflow, and the first part of a source's target.
    fn name(&self) -> &'static str;

    /// The public endpoint, used when the workflow names none.
    fn default_endpoint(&self) -> &'static str;

    /// The active and the terminal states when the workflow names none.
    fn default_states(&self) -> (&'static [&'static str], &'static [&'static str]);

    /// The environment variable whose key a workflow that names none uses (Symphony's
    /// `LINEAR_API_KEY`); None where the tracker answers without one.
    fn default_key(&self) -> Option<&'static str> {
        None
    }

    /// What the workflow's settings lack to poll it, if anything.
    fn check(&self, tracker: &Tracker) -> Result<(), String>;

    /// What it polls (a repository, a project), as the workflow names it.
    fn subject<'t>(&self, tracker: &'t Tracker) -> Option<&'t str>;

    /// An item as its API (a list, or a fetch of the item) has it, normalized.
    fn candidate(&self, tracker: &Tracker, value: &Value) -> Result<Candidate, String>;

    /// The item of a manual import's payload: a webhook payload or the item itself.
    fn payload_candidate(&self, tracker: &Tracker, payload: &Value) -> Result<Candidate, String>;

    /// The candidates, up to `limit`; `etags` are those the last poll kept. A rate limit
    /// stops there, without failing the source.
    fn fetch<'a>(
        &self,
        poller: &'a Poller,
        tracker: &'a Tracker,
        token: Option<&'a Secret>,
        etags: &'a BTreeMap<String, String>,
        limit: u32,
    ) -> BoxFuture<'a, Fetched>;

    /// The current version of each of these items (at most [`ITEMS_PER_FETCH`]), whatever
    /// their state; one that is gone is left out.
    fn fetch_items<'a>(
        &self,
        poller: &'a Poller,
        tracker: &'a Tracker,
        token: Option<&'a Secret>,
        items: &'a [&'a ItemRecord],
    ) -> BoxFuture<'a, Fetched>;

    /// The exact calls that write `action` on `item` (the action's `id` goes into the
    /// marker of what they write), or why this tracker takes no such action.
    fn calls(
        &self,
        tracker: &Tracker,
        item: &ItemRecord,
        action: &ProposedAction,
        id: &str,
    ) -> Result<Vec<Call>, StoreError>;

    /// Makes one of the calls [`calls`](Self::calls) gave.
    fn send<'a>(
        &self,
        target: &'a Target<'a>,
        call: &'a Call,
    ) -> BoxFuture<'a, Result<Answer, Failure>>;

    /// What `call` wrote in an earlier attempt, found by the `marker` its body ends with.
    fn find_marked<'a>(
        &self,
        target: &'a Target<'a>,
        call: &'a Call,
        marker: &'a str,
    ) -> BoxFuture<'a, Result<Option<Answer>, Pause>>;
}

/// One call to the tracker, as stored on the action and made by its job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Call {
    pub(crate) method: String,
    /// Relative to the tracker's endpoint (empty for Linear's GraphQL endpoint itself).
    pub(crate) path: String,
    pub(crate) body: Value,
}

impl Call {
    pub(crate) fn new(method: &str, path: String, body: Value) -> Call {
        Call {
            method: method.into(),
            path,
            body,
        }
    }
}

/// The refusal of an action that `item`'s tracker does not take; `what` says why.
pub(crate) fn unsupported(item: &ItemRecord, what: &str) -> StoreError {
    StoreError::Unprocessable {
        code: ErrorCode::UnsupportedAction,
        message: format!("{what} ({} is a {})", item.identifier, item.kind),
    }
}

/// Why an attempt stops without an ending: the tracker could not be asked (unreachable,
/// unavailable, rate limited). The job tries again later.
pub(crate) struct Pause {
    pub(crate) code: &'static str,
    pub(crate) message: String,
    pub(crate) until: Option<chrono::DateTime<chrono::Utc>>,
}

/// What sending an action needs, besides the action.
pub(crate) struct Target<'a> {
    pub(crate) poller: &'a Poller,
    pub(crate) item: ItemRecord,
    pub(crate) tracker: Tracker,
    pub(crate) token: Option<Secret>,
}

impl Target<'_> {
    /// The item as the tracker has it now (asked by id); None when the tracker no longer
    /// has it.
    pub(crate) async fn current(&self) -> Result<Option<Value>, Pause> {
        let (item, tracker) = (&self.item, &self.tracker);
        let fetched = tracker
            .api()
            .fetch_items(self.poller, tracker, self.token.as_ref(), &[item])
            .await;
        if let Some((code, message)) = fetched.error {
            return Err(Pause {
                code,
                message,
                until: fetched.backoff_until,
            });
        }
        let wanted = id_text(&item.issue["id"]);
        Ok(fetched
            .items
            .into_iter()
            .find(|value| value.get("id").map(id_text).as_ref() == Some(&wanted)))
    }
}

/// A tracker id as text: GitHub's are numbers, the normalized item's strings.
fn id_text(id: &Value) -> String {
    match id {
        Value::String(id) => id.clone(),
        other => other.to_string(),
    }
}

/// One answer of the tracker, as the evidence keeps it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Answer {
    pub(crate) method: String,
    pub(crate) path: String,
    pub(crate) http_status: u16,
    pub(crate) body: Value,
}

impl Answer {
    /// What the action row keeps of it: the status, and what was written's id and URL.
    pub(crate) fn short(&self) -> Value {
        let url = self.body.get("html_url").or_else(|| self.body.get("url"));
        json!({ "http_status": self.http_status, "id": self.body.get("id"), "url": url })
    }
}

/// Why the calls did not all go through.
pub(crate) enum Failure {
    /// Not known to have been refused: try again later.
    Pause(Pause),
    /// The tracker refused a call (the answers so far, the refusal last).
    Refused {
        code: &'static str,
        message: String,
        answers: Vec<Answer>,
    },
}

/// What polls and imports need, in a worker or (for `POST .../poll`) in the API.
#[derive(Clone)]
pub(crate) struct Poller {
    pub(crate) pool: PgPool,
    pub(crate) rules: AdmissionRules,
    /// Where the evidence artifacts (the item, the prompt) of a started run go.
    pub(crate) content: ContentStore,
    /// Checked at each resolution of a tracker token.
    pub(crate) secrets: SecretPolicy,
    pub(crate) http: reqwest::Client,
}

impl Poller {
    pub(crate) fn new(
        pool: PgPool,
        rules: AdmissionRules,
        content: ContentStore,
        secrets: SecretPolicy,
    ) -> Poller {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a client with a timeout and a user agent builds");
        Poller {
            pool,
            rules,
            content,
            secrets,
            http,
        }
    }
}

/// One tracker item, normalized, with what keys it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Candidate {
    pub(crate) idempotency_key: String,
    pub(crate) kind: &'static str,
    pub(crate) issue: Issue,
}

/// The tracker's `api_key` of `source` (in `scope`) as it may be used now: None when the
/// workflow names none; `secret_not_granted`, nothing read, when a tenant registered the
/// source and its workspace is no longer granted the key. Checked before every use, since
/// the grants may have narrowed since the source was registered.
pub(crate) fn usable_key<'t>(
    tracker: &'t Tracker,
    (source, scope): (&SourceRecord, &Scope),
    secrets: &SecretPolicy,
) -> Result<Option<&'t SecretRef>, Unresolved> {
    let Some(key) = &tracker.api_key else {
        return Ok(None);
    };
    let registrant = Role::stored(&source.registered_by_role);
    // The runtime operator's key meets the policy alone, in `resolve` (`secret_not_allowed`).
    if !registrant.is_runtime_operator() {
        let workspace = scope.workspace();
        secrets
            .check_for(registrant, workspace, key)
            .map_err(|message| Unresolved {
                code: ErrorCode::SecretNotGranted,
                message: format!("tracker.api_key: {message}"),
            })?;
    }
    Ok(Some(key))
}

/// The tracker's token of `source` (in `scope`), resolved now (it is never kept): None
/// when the workflow names none (see [`usable_key`]).
pub(crate) fn token(
    tracker: &Tracker,
    source: (&SourceRecord, &Scope),
    secrets: &SecretPolicy,
) -> Result<Option<Secret>, Unresolved> {
    usable_key(tracker, source, secrets)?
        .map(|key| key.resolve(secrets))
        .transpose()
}

/// What the tracker's lists gave.
#[derive(Debug, Default)]
pub(crate) struct Fetched {
    pub(crate) items: Vec<Value>,
    pub(crate) etags: BTreeMap<String, String>,
    /// Some list answered 304 (and none answered anything new).
    pub(crate) not_modified: bool,
    pub(crate) backoff_until: Option<DateTime<Utc>>,
    pub(crate) error: Option<(&'static str, String)>,
}

/// Whether a tracker's answer refused the request for its rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The answer says so (a 429, Linear's `RATELIMITED`).
    Certain,
    /// A refusal that is a rate limit only when the limit is spent (GitHub's 403).
    Possible,
    None,
}

/// The headers in which a tracker tells how much of its limit is left and when it resets.
pub(crate) struct LimitHeaders {
    pub(crate) remaining: &'static str,
    pub(crate) reset: &'static str,
    /// The reset time is in epoch milliseconds, not seconds.
    pub(crate) reset_in_ms: bool,
}

/// When requests may resume, if the answer says to wait: `Retry-After` (seconds) on a
/// refusal, else the reset time once the remaining count is 0; a refusal that is certainly
/// a rate limit (or a possible one with the limit spent) naming neither waits
/// [`DEFAULT_BACKOFF`].
pub(crate) fn resume_at(
    refusal: Refusal,
    headers: &HeaderMap,
    names: &LimitHeaders,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i64>().ok())
    };
    let refused = refusal != Refusal::None;
    if refused && let Some(seconds) = number(header::RETRY_AFTER.as_str()) {
        return Some(now + chrono::Duration::seconds(seconds.max(1)));
    }
    let spent = number(names.remaining) == Some(0);
    if spent && let Some(reset) = number(names.reset) {
        let at = if names.reset_in_ms {
            DateTime::from_timestamp_millis(reset)
        } else {
            DateTime::from_timestamp(reset, 0)
        };
        return at.filter(|at| *at > now);
    }
    (refusal == Refusal::Certain || (refused && spent))
        .then(|| now + chrono::Duration::from_std(DEFAULT_BACKOFF).expect("a minute"))
}
