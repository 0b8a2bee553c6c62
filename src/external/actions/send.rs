//! An action's requests to its tracker: what sending needs ([`Target`]), the target asked
//! for again and compared with the proposal's, the stored calls ([`Call`]) made, and the
//! marker looked for when an earlier attempt's outcome is unknown; a [`Pause`] when the
//! tracker could not be asked.

use chrono::Utc;
use keel_workers::media::Secret;
use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::external::actions::ActionRecord;
use crate::external::github::head_sha;
use crate::external::tracker::Poller;
use crate::external::workflow::{Tracker, TrackerKind};
use crate::external::{ItemRecord, github, linear};

/// Linear's comment mutation: the only write Keel makes there.
pub(crate) const COMMENT_CREATE: &str = "mutation KeelComment($issueId: String!, $body: String!) {
  commentCreate(input: { issueId: $issueId, body: $body }) { success comment { id url } }
}";

/// An issue's comments that carry a marker.
const MARKED_COMMENTS: &str = "query KeelMarked($id: String!, $marker: String!) {
  issue(id: $id) { comments(first: 50, filter: { body: { contains: $marker } }) {
    nodes { id url body } } }
}";

/// Pages of a GitHub list read when looking for a marker (100 entries each).
const MARKER_PAGES: u32 = 10;

/// One call to the tracker, as stored on the action and made by its job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Call {
    pub(crate) method: String,
    /// Relative to the tracker's endpoint (empty for Linear's GraphQL endpoint itself).
    pub(crate) path: String,
    pub(crate) body: Value,
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

/// Asks the tracker for the target again: why it changed since the proposal (and how it
/// is now), or None when it did not.
pub(crate) async fn changed(
    target: &Target<'_>,
    action: &ActionRecord,
) -> Result<Option<(String, Value)>, Pause> {
    let (item, tracker) = (&target.item, &target.tracker);
    let fetched = tracker
        .api()
        .fetch_items(target.poller, tracker, target.token.as_ref(), &[item])
        .await;
    if let Some((code, message)) = fetched.error {
        return Err(Pause {
            code,
            message,
            until: fetched.backoff_until,
        });
    }
    let current = fetched
        .items
        .iter()
        .find(|value| value.get("id").map(id_text) == Some(id_text(&item.issue["id"])));
    Ok(match current {
        Some(current) => compare(target, action, current),
        None => Some((
            format!(
                "{} changed since the proposal: the tracker no longer has it",
                item.identifier
            ),
            Value::Null,
        )),
    })
}

/// A tracker id as text: GitHub's are numbers, the normalized item's strings.
fn id_text(id: &Value) -> String {
    match id {
        Value::String(id) => id.clone(),
        other => other.to_string(),
    }
}

/// Whether the target changed since the proposal: the tracker's current version has
/// another key (a new `updated_at`, a new head SHA) or state. Returns why, and the target
/// now.
fn compare(target: &Target<'_>, action: &ActionRecord, current: &Value) -> Option<(String, Value)> {
    let tracker = &target.tracker;
    let candidate = match tracker.api().candidate(tracker, current) {
        Ok(candidate) => candidate,
        Err(message) => {
            return Some((
                format!("the tracker's answer is unreadable: {message}"),
                current.clone(),
            ));
        }
    };
    let key = &candidate.idempotency_key;
    let now = json!({
        "identifier": candidate.issue.identifier,
        "state": candidate.issue.state,
        "updated_at": candidate.issue.updated_at,
        "head_sha": head_sha(key),
        "idempotency_key": key,
    });
    let then = &action.target;
    let change = |field: &str| {
        let text = |value: &Value| value.as_str().unwrap_or("none").to_string();
        (now[field] != then[field]).then(|| (text(&now[field]), text(&then[field])))
    };
    let reason = if let Some((now, then)) = change("state") {
        format!("its state is now {now} (was {then})")
    } else if let Some((now, then)) = change("head_sha") {
        format!("its head is now {now} (was {then})")
    } else if *key != target.item.idempotency_key {
        let (now, then) = change("updated_at").unwrap_or_default();
        format!("it was updated at {now} (was {then})")
    } else {
        return None;
    };
    Some((
        format!(
            "{} changed since the proposal: {reason}",
            target.item.identifier
        ),
        now,
    ))
}

/// Makes the calls in order.
pub(crate) async fn perform(target: &Target<'_>, calls: &[Call]) -> Result<Vec<Answer>, Failure> {
    let mut answers = Vec::new();
    for call in calls {
        let answer = match target.tracker.kind {
            TrackerKind::Github => github_call(target, call).await?,
            TrackerKind::Linear => linear_call(target, call).await?,
        };
        let refused = answer.http_status >= 400;
        answers.push(answer);
        if refused {
            let last = answers.last().expect("just pushed");
            let detail = last.body["message"].as_str().unwrap_or("no message");
            let message = format!(
                "the tracker refused {} {} with {}: {detail}",
                call.method, call.path, last.http_status
            );
            return Err(Failure::Refused {
                code: "tracker_refused",
                message,
                answers,
            });
        }
    }
    Ok(answers)
}

/// One REST call. A label already gone (404 on its DELETE) is what the call wanted.
async fn github_call(target: &Target<'_>, call: &Call) -> Result<Answer, Failure> {
    let method = Method::from_bytes(call.method.as_bytes()).expect("a stored method");
    let url = format!(
        "{}{}",
        target.tracker.endpoint.trim_end_matches('/'),
        call.path
    );
    let mut request = github::request(target.poller, method.clone(), &url, target.token.as_ref());
    if !call.body.is_null() {
        request = request.json(&call.body);
    }
    let response = request.send().await.map_err(|error| {
        let message = format!(
            "{} {} failed: {}",
            call.method,
            call.path,
            error.without_url()
        );
        Failure::Pause(pause("tracker_unreachable", message))
    })?;
    let status = response.status();
    let limited = github::rate_limited(status, response.headers(), Utc::now());
    let refused_for_limit = matches!(
        status,
        StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS
    );
    if let Some(until) = limited.filter(|_| refused_for_limit) {
        let message = format!(
            "GitHub rate limited {} {} ({status})",
            call.method, call.path
        );
        return Err(Failure::Pause(Pause {
            code: "rate_limited",
            message,
            until: Some(until),
        }));
    }
    if status.is_server_error() {
        let message = format!(
            "GitHub answered {} {} with {status}",
            call.method, call.path
        );
        return Err(Failure::Pause(pause("tracker_unavailable", message)));
    }
    let body = response.json::<Value>().await.unwrap_or(Value::Null);
    let already_gone = method == Method::DELETE && status == StatusCode::NOT_FOUND;
    Ok(Answer {
        method: call.method.clone(),
        path: call.path.clone(),
        http_status: if already_gone { 200 } else { status.as_u16() },
        body,
    })
}

/// Linear's one mutation; GraphQL errors and `success: false` are refusals.
async fn linear_call(target: &Target<'_>, call: &Call) -> Result<Answer, Failure> {
    let (query, variables) = (
        call.body["query"].as_str().unwrap_or_default(),
        &call.body["variables"],
    );
    let what = "the commentCreate mutation";
    let answer = linear::graphql(
        target.poller,
        &target.tracker,
        target.token.as_ref(),
        what,
        query,
        variables.clone(),
    )
    .await;
    let refused = |message: String| Failure::Refused {
        code: "tracker_refused",
        message,
        answers: Vec::new(),
    };
    match answer {
        Ok((answer, _)) => {
            let created = &answer["data"]["commentCreate"];
            if created["success"] != true {
                return Err(refused(format!(
                    "Linear did not create the comment: {answer}"
                )));
            }
            Ok(Answer {
                method: call.method.clone(),
                path: call.path.clone(),
                http_status: 200,
                body: created["comment"].clone(),
            })
        }
        Err(stop) if stop.error.0 == "tracker_error" => Err(refused(stop.error.1)),
        Err(stop) => Err(Failure::Pause(Pause {
            code: stop.error.0,
            message: stop.error.1,
            until: stop.backoff_until,
        })),
    }
}

/// What an earlier attempt wrote, found by its marker: the comment or review whose body
/// has it. None when there is none, or for a label change (sent again: it is idempotent).
pub(crate) async fn find_marked(
    target: &Target<'_>,
    calls: &[Call],
    marker: &str,
) -> Result<Option<Answer>, Pause> {
    let Some(call) = calls
        .iter()
        .find(|call| body_text(call).is_some_and(|b| b.contains(marker)))
    else {
        return Ok(None);
    };
    match target.tracker.kind {
        TrackerKind::Github => github_marked(target, &call.path, marker).await,
        TrackerKind::Linear => linear_marked(target, marker).await,
    }
}

/// The text a call writes: a comment's or review's body.
fn body_text(call: &Call) -> Option<&str> {
    call.body
        .get("body")
        .or_else(|| call.body.pointer("/variables/body"))
        .and_then(Value::as_str)
}

/// Reads the list the call wrote to (its comments, its reviews), page by page.
async fn github_marked(
    target: &Target<'_>,
    path: &str,
    marker: &str,
) -> Result<Option<Answer>, Pause> {
    let base = target.tracker.endpoint.trim_end_matches('/');
    for page in 1..=MARKER_PAGES {
        let listed = format!("{path}?per_page=100&page={page}");
        let url = format!("{base}{listed}");
        let request = github::request(target.poller, Method::GET, &url, target.token.as_ref());
        let response = request.send().await.map_err(|error| {
            pause(
                "tracker_unreachable",
                format!("GET {path} failed: {}", error.without_url()),
            )
        })?;
        let status = response.status();
        if !status.is_success() {
            let until = github::rate_limited(status, response.headers(), Utc::now());
            let message = format!("GitHub answered GET {path} with {status}");
            return Err(Pause {
                code: if until.is_some() {
                    "rate_limited"
                } else {
                    "tracker_unavailable"
                },
                message,
                until,
            });
        }
        let entries = response.json::<Vec<Value>>().await.unwrap_or_default();
        let found = entries
            .iter()
            .find(|entry| entry["body"].as_str().is_some_and(|b| b.contains(marker)));
        if let Some(found) = found {
            return Ok(Some(Answer {
                method: "GET".into(),
                path: listed,
                http_status: status.as_u16(),
                body: found.clone(),
            }));
        }
        if entries.len() < 100 {
            break;
        }
    }
    Ok(None)
}

async fn linear_marked(target: &Target<'_>, marker: &str) -> Result<Option<Answer>, Pause> {
    let variables = json!({ "id": target.item.issue["id"], "marker": marker });
    let what = "the marked comments query";
    let (answer, _) = linear::graphql(
        target.poller,
        &target.tracker,
        target.token.as_ref(),
        what,
        MARKED_COMMENTS,
        variables,
    )
    .await
    .map_err(|stop| Pause {
        code: stop.error.0,
        message: stop.error.1,
        until: stop.backoff_until,
    })?;
    let nodes = answer
        .pointer("/data/issue/comments/nodes")
        .and_then(Value::as_array);
    let found = nodes
        .into_iter()
        .flatten()
        .find(|node| node["body"].as_str().is_some_and(|b| b.contains(marker)));
    Ok(found.map(|found| Answer {
        method: "POST".into(),
        path: String::new(),
        http_status: 200,
        body: found.clone(),
    }))
}

fn pause(code: &'static str, message: String) -> Pause {
    Pause {
        code,
        message,
        until: None,
    }
}
