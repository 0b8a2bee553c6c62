//! Linear: the GraphQL `issues` of one project (by its slug) in the workflow's active
//! states, paginated, with Linear's rate limits honoured, and their normalization; an
//! action's one mutation (a comment) and the query its marker is looked for with.

use std::collections::BTreeMap;

use chrono::Utc;
use futures_util::future::BoxFuture;
use keel_api_types::{BlockerRef, Issue};
use keel_workers::media::Secret;
use reqwest::StatusCode;
use reqwest::header;
use serde_json::{Value, json};

use crate::db::StoreError;
use crate::external::ItemRecord;
use crate::external::actions::{ProposedAction, marked};
use crate::external::tracker::{Answer, Call, Failure, Pause, Target, Tracker, TrackerApi};
use crate::external::tracker::{Candidate, Fetched, LimitHeaders, Poller, Refusal, resume_at};
use crate::external::tracker::{ITEMS_PER_FETCH, unsupported};

/// Linear's page size (its default and Symphony's).
const PAGE: u32 = 50;

/// Linear's implementation of [`TrackerApi`].
pub(crate) struct Linear;

impl TrackerApi for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn default_endpoint(&self) -> &'static str {
        "https://api.linear.app/graphql"
    }

    /// Symphony's defaults.
    fn default_states(&self) -> (&'static [&'static str], &'static [&'static str]) {
        (
            &["Todo", "In Progress"],
            &["Closed", "Cancelled", "Canceled", "Duplicate", "Done"],
        )
    }

    fn default_key(&self) -> Option<&'static str> {
        Some("LINEAR_API_KEY")
    }

    fn check(&self, tracker: &Tracker) -> Result<(), String> {
        if tracker
            .project_slug
            .as_deref()
            .is_none_or(|s| s.trim().is_empty())
        {
            return Err("tracker.project_slug is required for linear".into());
        }
        Ok(())
    }

    fn subject<'t>(&self, tracker: &'t Tracker) -> Option<&'t str> {
        tracker.project_slug.as_deref()
    }

    fn candidate(&self, tracker: &Tracker, value: &Value) -> Result<Candidate, String> {
        candidate(tracker, value)
    }

    fn payload_candidate(&self, tracker: &Tracker, payload: &Value) -> Result<Candidate, String> {
        payload_candidate(tracker, payload)
    }

    /// Linear has no ETags: `etags` is not read.
    fn fetch<'a>(
        &self,
        poller: &'a Poller,
        tracker: &'a Tracker,
        token: Option<&'a Secret>,
        _etags: &'a BTreeMap<String, String>,
        limit: u32,
    ) -> BoxFuture<'a, Fetched> {
        Box::pin(fetch(poller, tracker, token, limit))
    }

    fn fetch_items<'a>(
        &self,
        poller: &'a Poller,
        tracker: &'a Tracker,
        token: Option<&'a Secret>,
        items: &'a [&'a ItemRecord],
    ) -> BoxFuture<'a, Fetched> {
        Box::pin(fetch_items(poller, tracker, token, items))
    }

    /// A comment: the only write Keel makes on Linear.
    fn calls(
        &self,
        _: &Tracker,
        item: &ItemRecord,
        action: &ProposedAction,
        id: &str,
    ) -> Result<Vec<Call>, StoreError> {
        let ProposedAction::Comment { body } = action else {
            return Err(unsupported(
                item,
                "Keel writes only comments on Linear issues",
            ));
        };
        let variables = json!({ "issueId": item.issue["id"], "body": marked(body, id) });
        let body = json!({ "query": COMMENT_CREATE, "variables": variables });
        Ok(vec![Call::new("POST", String::new(), body)])
    }

    fn send<'a>(
        &self,
        target: &'a Target<'a>,
        call: &'a Call,
    ) -> BoxFuture<'a, Result<Answer, Failure>> {
        Box::pin(send(target, call))
    }

    /// Asks for the issue's comments that have the marker.
    fn find_marked<'a>(
        &self,
        target: &'a Target<'a>,
        _: &'a Call,
        marker: &'a str,
    ) -> BoxFuture<'a, Result<Option<Answer>, Pause>> {
        Box::pin(find_marked(target, marker))
    }
}

/// An issue's fields: what the prompt's `issue` needs. A blocker is an inverse relation of
/// type `blocks`.
macro_rules! issue_fields {
    () => {
        "id identifier title description priority branchName url createdAt updatedAt
      state { name }
      assignee { id isMe }
      labels { nodes { name } }
      inverseRelations { nodes { type issue { id identifier state { name } } } }"
    };
}

/// The candidates: issues of the project in the active states.
const CANDIDATES: &str = concat!(
    "query KeelCandidates($projectSlug: String!, $states: [String!]!, $first: Int!, \
     $after: String) {
  issues(first: $first, after: $after, filter: {
      project: { slugId: { eq: $projectSlug } }
      state: { name: { in: $states } }
  }) {
    nodes { ",
    issue_fields!(),
    " }
    pageInfo { hasNextPage endCursor }
  }
}"
);

/// Issues by id, whatever their state: reconciliation's question.
const BY_IDS: &str = concat!(
    "query KeelIssues($ids: [ID!]!, $first: Int!) {
  issues(first: $first, filter: { id: { in: $ids } }) {
    nodes { ",
    issue_fields!(),
    " }
    pageInfo { hasNextPage endCursor }
  }
}"
);

/// Linear's own limit headers; the reset is in epoch milliseconds.
const LIMIT_HEADERS: LimitHeaders = LimitHeaders {
    remaining: "x-ratelimit-requests-remaining",
    reset: "x-ratelimit-requests-reset",
    reset_in_ms: true,
};

/// The comment mutation.
const COMMENT_CREATE: &str = "mutation KeelComment($issueId: String!, $body: String!) {
  commentCreate(input: { issueId: $issueId, body: $body }) { success comment { id url } }
}";

/// An issue's comments that carry a marker.
const MARKED_COMMENTS: &str = "query KeelMarked($id: String!, $marker: String!) {
  issue(id: $id) { comments(first: 50, filter: { body: { contains: $marker } }) {
    nodes { id url body } } }
}";

/// Pages through the project's active issues, up to `limit`. A rate limit stops the poll
/// there, without failing the source.
async fn fetch(poller: &Poller, tracker: &Tracker, token: Option<&Secret>, limit: u32) -> Fetched {
    let mut fetched = Fetched::default();
    let mut after: Option<String> = None;
    while (fetched.items.len() as u32) < limit {
        let first = (limit - fetched.items.len() as u32).min(PAGE);
        let page = match fetch_page(poller, tracker, token, first, after.as_deref()).await {
            Ok(page) => page,
            Err(stop) => {
                fetched.backoff_until = stop.backoff_until;
                fetched.error = Some(stop.error);
                return fetched;
            }
        };
        fetched.backoff_until = page.backoff_until;
        fetched.items.extend(page.nodes);
        match page.next {
            // The remaining count is spent: the next page would be refused.
            Some(cursor) if page.backoff_until.is_none() => after = Some(cursor),
            _ => break,
        }
    }
    fetched
}

struct Page {
    nodes: Vec<Value>,
    /// The cursor of the next page, when there is one.
    next: Option<String>,
    backoff_until: Option<chrono::DateTime<Utc>>,
}

/// Why a poll (or an action) stops at a request.
struct Stop {
    error: (&'static str, String),
    backoff_until: Option<chrono::DateTime<Utc>>,
}

/// An action's attempt waits out what stopped its request.
impl From<Stop> for Pause {
    fn from(stop: Stop) -> Pause {
        Pause {
            code: stop.error.0,
            message: stop.error.1,
            until: stop.backoff_until,
        }
    }
}

/// The current versions of these items' issues, whatever their state.
async fn fetch_items(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    items: &[&ItemRecord],
) -> Fetched {
    let mut fetched = Fetched::default();
    let ids: Vec<&str> = items
        .iter()
        .filter_map(|item| item.issue["id"].as_str())
        .collect();
    let variables = json!({ "ids": ids, "first": ITEMS_PER_FETCH });
    match query(poller, tracker, token, BY_IDS, variables).await {
        Ok(page) => {
            fetched.items = page.nodes;
            fetched.backoff_until = page.backoff_until;
        }
        Err(stop) => {
            fetched.backoff_until = stop.backoff_until;
            fetched.error = Some(stop.error);
        }
    }
    fetched
}

async fn fetch_page(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    first: u32,
    after: Option<&str>,
) -> Result<Page, Stop> {
    let variables = json!({
        "projectSlug": tracker.project_slug.as_deref().unwrap_or_default(),
        "states": tracker.active_states,
        "first": first,
        "after": after,
    });
    query(poller, tracker, token, CANDIDATES, variables).await
}

/// Sends one `issues` query and reads its page.
async fn query(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    query: &str,
    variables: Value,
) -> Result<Page, Stop> {
    let (answer, backoff_until) =
        graphql(poller, tracker, token, "the issues query", query, variables).await?;
    let issues = &answer["data"]["issues"];
    let Some(nodes) = issues["nodes"].as_array() else {
        let message = "Linear's answer has no data.issues.nodes".to_string();
        return Err(Stop {
            error: ("tracker_error", message),
            backoff_until: None,
        });
    };
    let info = &issues["pageInfo"];
    let next = (info["hasNextPage"] == true)
        .then(|| info["endCursor"].as_str().map(String::from))
        .flatten();
    Ok(Page {
        nodes: nodes.clone(),
        next,
        backoff_until,
    })
}

/// Sends one GraphQL document (`what` names it in errors) and returns Linear's answer
/// without errors, with when requests must pause if its limit is spent. A rate limit, a
/// failed request, or an answer with errors is a [`Stop`].
async fn graphql(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    what: &str,
    query: &str,
    variables: Value,
) -> Result<(Value, Option<chrono::DateTime<Utc>>), Stop> {
    let body = json!({ "query": query, "variables": variables });
    let mut request = poller.http.post(&tracker.endpoint).json(&body);
    if let Some(token) = token {
        // Linear's personal API keys go in the header as they are, without a scheme.
        request = request.header(header::AUTHORIZATION, token.expose());
    }
    let stop = |code, message: String| Stop {
        error: (code, message),
        backoff_until: None,
    };
    let response = request.send().await.map_err(|error| {
        let message = format!("Linear's {what} failed: {}", error.without_url());
        stop("tracker_unreachable", message)
    })?;
    let status = response.status();
    let headers = response.headers().clone();
    let answer: Option<Value> = response.json().await.ok();
    let refusal = match answer.as_ref() {
        _ if status == StatusCode::TOO_MANY_REQUESTS => Refusal::Certain,
        Some(answer) if graphql_codes(answer).any(|code| code == "RATELIMITED") => Refusal::Certain,
        _ => Refusal::None,
    };
    let backoff_until = resume_at(refusal, &headers, &LIMIT_HEADERS, Utc::now());
    if refusal == Refusal::Certain {
        let message = format!("Linear rate limited {what} ({status})");
        return Err(Stop {
            error: ("rate_limited", message),
            backoff_until,
        });
    }
    let Some(answer) = answer.filter(|_| status.is_success()) else {
        let code = if status.is_server_error() {
            "tracker_unavailable"
        } else {
            "tracker_error"
        };
        return Err(stop(code, format!("Linear answered {what} with {status}")));
    };
    if let Some(messages) = graphql_messages(&answer) {
        let message = format!("Linear refused {what}: {messages}");
        return Err(stop("tracker_error", message));
    }
    Ok((answer, backoff_until))
}

/// The `extensions.code` of each GraphQL error of an answer.
fn graphql_codes(answer: &Value) -> impl Iterator<Item = &str> {
    answer["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|error| error.pointer("/extensions/code").and_then(Value::as_str))
}

/// The answer's GraphQL error messages, joined, when it has errors.
fn graphql_messages(answer: &Value) -> Option<String> {
    let errors = answer["errors"].as_array().filter(|e| !e.is_empty())?;
    let messages: Vec<&str> = errors
        .iter()
        .map(|error| error["message"].as_str().unwrap_or("an unnamed error"))
        .collect();
    Some(messages.join("; "))
}

/// A Linear issue as the GraphQL API (or a webhook's `data`) has it, normalized. The key
/// carries `updatedAt`: a changed issue is a new version, the same version a duplicate.
fn candidate(tracker: &Tracker, value: &Value) -> Result<Candidate, String> {
    let text = |field: &str| value.get(field).and_then(Value::as_str);
    let identifier = text("identifier").ok_or("a Linear issue needs its identifier")?;
    let updated_at = text("updatedAt").ok_or("a Linear issue needs its updatedAt")?;
    let state = value
        .pointer("/state/name")
        .and_then(Value::as_str)
        .ok_or("a Linear issue needs its state.name")?;
    let project = tracker.project_slug.as_deref().unwrap_or_default();
    // Symphony drops an item without a title: nothing to tell an agent what to do.
    let title = text("title")
        .filter(|title| !title.trim().is_empty())
        .ok_or("a Linear item needs a title")?;
    let issue = Issue {
        id: text("id").unwrap_or(identifier).to_string(),
        identifier: identifier.to_string(),
        title: title.to_string(),
        description: text("description").map(String::from),
        priority: value.get("priority").and_then(Value::as_i64),
        state: state.to_string(),
        branch_name: text("branchName").map(String::from),
        url: text("url").map(String::from),
        labels: names(value.get("labels")).map(str::to_lowercase).collect(),
        blocked_by: blockers(value),
        created_at: text("createdAt").map(String::from),
        updated_at: Some(updated_at.to_string()),
        assignee_id: assignee_id(value).map(String::from),
        assigned_to_worker: assigned_to_worker(tracker, value),
    };
    Ok(Candidate {
        idempotency_key: format!("linear:issue:{project}:{identifier}:{updated_at}"),
        kind: "linear_issue",
        issue,
    })
}

/// The assignee's id: the API's `assignee { id }`, a webhook's `assigneeId`.
fn assignee_id(value: &Value) -> Option<&str> {
    value
        .pointer("/assignee/id")
        .or_else(|| value.get("assigneeId"))
        .and_then(Value::as_str)
}

/// Symphony's routing: with a `tracker.assignee`, an item is worked on only when assigned to
/// that user, or for `me` to the key's own user (the API's `assignee { isMe }`; a webhook
/// does not say, so its item waits for the next poll). Unassigned items are not.
fn assigned_to_worker(tracker: &Tracker, value: &Value) -> bool {
    match tracker.assignee.as_deref() {
        None => true,
        Some("me") => value.pointer("/assignee/isMe") == Some(&Value::Bool(true)),
        Some(user) => assignee_id(value) == Some(user),
    }
}

/// A webhook payload (`{"type": "Issue", "data": {…}}`) or the issue itself.
fn payload_candidate(tracker: &Tracker, payload: &Value) -> Result<Candidate, String> {
    if let Some(kind) = payload.get("type").and_then(Value::as_str)
        && kind != "Issue"
    {
        return Err(format!("a Linear {kind} webhook is not an issue"));
    }
    candidate(tracker, payload.get("data").unwrap_or(payload))
}

/// Label names: a connection (`{"nodes": [...]}`, the API) or a list (webhooks).
fn names(labels: Option<&Value>) -> impl Iterator<Item = &str> {
    let list = labels.and_then(|l| l.get("nodes").unwrap_or(l).as_array());
    list.into_iter()
        .flatten()
        .filter_map(|label| label.get("name").and_then(Value::as_str))
}

/// The issues that block this one: its inverse relations of type `blocks`.
fn blockers(value: &Value) -> Vec<BlockerRef> {
    let relations = value
        .pointer("/inverseRelations/nodes")
        .and_then(Value::as_array);
    relations
        .into_iter()
        .flatten()
        .filter(|relation| relation["type"] == "blocks")
        .map(|relation| {
            let issue = &relation["issue"];
            let text = |pointer: &str| issue.pointer(pointer).and_then(Value::as_str);
            BlockerRef {
                id: text("/id").map(String::from),
                identifier: text("/identifier").map(String::from),
                state: text("/state/name").map(String::from),
            }
        })
        .collect()
}

/// Linear's one mutation; GraphQL errors and `success: false` are refusals.
async fn send(target: &Target<'_>, call: &Call) -> Result<Answer, Failure> {
    let (query, variables) = (
        call.body["query"].as_str().unwrap_or_default(),
        &call.body["variables"],
    );
    let what = "the commentCreate mutation";
    let answer = graphql(
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
        Err(stop) => Err(Failure::Pause(stop.into())),
    }
}

/// The issue's comments that have the marker (the first 50 of them).
async fn find_marked(target: &Target<'_>, marker: &str) -> Result<Option<Answer>, Pause> {
    let variables = json!({ "id": target.item.issue["id"], "marker": marker });
    let what = "the marked comments query";
    let (answer, _) = graphql(
        target.poller,
        &target.tracker,
        target.token.as_ref(),
        what,
        MARKED_COMMENTS,
        variables,
    )
    .await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderMap;

    fn tracker() -> Tracker {
        let settings =
            "{kind: linear, project_slug: eng, active_states: Todo, terminal_states: Done}";
        crate::external::workflow::test_tracker(settings)
    }

    fn node() -> Value {
        json!({ "id": "uuid-1", "identifier": "ENG-7", "title": "Broken", "priority": 2,
            "state": { "name": "Todo" }, "updatedAt": "2026-11-30T10:00:00.000Z",
            "branchName": "eng-7-broken", "labels": { "nodes": [{ "name": "Bug" }] },
            "inverseRelations": { "nodes": [
                { "type": "blocks", "issue": { "id": "uuid-2", "identifier": "ENG-3",
                  "state": { "name": "In Progress" } } },
                { "type": "related", "issue": { "id": "uuid-4", "identifier": "ENG-4" } }
            ] } })
    }

    #[test]
    fn issues_are_normalized_and_keyed_by_version() {
        let found = candidate(&tracker(), &node()).unwrap();
        assert_eq!(
            found.idempotency_key,
            "linear:issue:eng:ENG-7:2026-11-30T10:00:00.000Z"
        );
        assert_eq!(found.kind, "linear_issue");
        assert_eq!(found.issue.labels, ["bug"]);
        assert_eq!(found.issue.priority, Some(2));
        assert_eq!(found.issue.branch_name.as_deref(), Some("eng-7-broken"));
        assert_eq!(found.issue.blocked_by.len(), 1);
        assert_eq!(
            found.issue.blocked_by[0].identifier.as_deref(),
            Some("ENG-3")
        );
        assert_eq!(
            found.issue.blocked_by[0].state.as_deref(),
            Some("In Progress")
        );
        assert!(candidate(&tracker(), &json!({ "identifier": "ENG-1" })).is_err());
    }

    /// Symphony: "linear client marks explicitly unassigned issues as not routed to
    /// worker", and "issue assigned to another worker is not dispatch-eligible".
    #[test]
    fn symphony_issues_assigned_elsewhere_or_to_nobody_are_not_routed_to_the_worker() {
        let routed = |assignee: &str, issue: Value| {
            let settings = format!(
                "{{kind: linear, project_slug: eng, assignee: '{assignee}', active_states: Todo}}"
            );
            let tracker = crate::external::workflow::test_tracker(&settings);
            let found = candidate(&tracker, &issue).unwrap();
            (found.issue.assigned_to_worker, tracker.wants(&found.issue))
        };
        let with = |assignee: Value| {
            let mut issue = node();
            issue["assignee"] = assignee;
            issue
        };
        let mine = json!({ "id": "user-1", "isMe": true });
        let theirs = json!({ "id": "user-2", "isMe": false });
        assert_eq!(routed("user-1", with(mine.clone())), (true, true));
        assert_eq!(routed("user-1", with(theirs.clone())), (false, false));
        assert_eq!(routed("me", with(mine)), (true, true));
        assert_eq!(routed("me", with(theirs)), (false, false));
        assert_eq!(routed("user-1", with(Value::Null)), (false, false));
        // A blank assignee is none: every item is routed.
        assert_eq!(routed("  ", with(Value::Null)), (true, true));
        let found = candidate(&tracker(), &with(json!({ "id": "user-2" }))).unwrap();
        assert_eq!(found.issue.assignee_id.as_deref(), Some("user-2"));
        assert!(found.issue.assigned_to_worker);
    }

    #[test]
    fn webhook_payloads_carry_the_issue_in_data() {
        let mut data = node();
        data["labels"] = json!([{ "name": "Feature" }]);
        let payload = json!({ "action": "update", "type": "Issue", "data": data });
        let found = payload_candidate(&tracker(), &payload).unwrap();
        assert_eq!(found.issue.identifier, "ENG-7");
        assert_eq!(found.issue.labels, ["feature"]);
        let comment = json!({ "type": "Comment", "data": {} });
        assert!(payload_candidate(&tracker(), &comment).is_err());
    }

    #[test]
    fn rate_limits_come_from_linears_headers_in_milliseconds() {
        let now = Utc::now();
        let reset = now + chrono::Duration::seconds(30);
        let mut headers = HeaderMap::new();
        headers.insert("x-ratelimit-requests-remaining", "0".parse().unwrap());
        let millis = reset.timestamp_millis().to_string();
        headers.insert("x-ratelimit-requests-reset", millis.parse().unwrap());
        let at = resume_at(Refusal::None, &headers, &LIMIT_HEADERS, now);
        assert_eq!(
            at.map(|at| at.timestamp_millis()),
            Some(reset.timestamp_millis())
        );
        let refused = resume_at(Refusal::Certain, &HeaderMap::new(), &LIMIT_HEADERS, now);
        assert!(refused.is_some_and(|at| at > now));
        let answer = json!({ "errors": [{ "message": "slow down",
            "extensions": { "code": "RATELIMITED" } }] });
        assert_eq!(graphql_codes(&answer).collect::<Vec<_>>(), ["RATELIMITED"]);
        assert_eq!(graphql_messages(&answer).as_deref(), Some("slow down"));
    }
}
