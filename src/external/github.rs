//! GitHub: REST `GET`s of a repository's issues and pull requests, with the stored ETags
//! as `If-None-Match` and the rate-limit headers honoured, and their normalization; an
//! action's REST calls (a comment, labels, a pull request's review, a pull request) and
//! the lists its marker is looked for in.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use keel_api_types::Issue;
use keel_workers::media::Secret;
use reqwest::header::{self, HeaderMap};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::db::StoreError;
use crate::external::ItemRecord;
use crate::external::actions::{ProposedAction, marked, marker};
use crate::external::tracker::unsupported;
use crate::external::tracker::{Answer, Call, Failure, Pause, Target, Tracker, TrackerApi};
use crate::external::tracker::{Candidate, Fetched, LimitHeaders, Poller, Refusal, resume_at};

/// GitHub's implementation of [`TrackerApi`].
pub(crate) struct GitHub;

impl TrackerApi for GitHub {
    fn name(&self) -> &'static str {
        "github"
    }

    fn default_endpoint(&self) -> &'static str {
        "https://api.github.com"
    }

    /// GitHub has two states.
    fn default_states(&self) -> (&'static [&'static str], &'static [&'static str]) {
        (&["open"], &["closed"])
    }

    fn check(&self, tracker: &Tracker) -> Result<(), String> {
        let valid = tracker
            .repository
            .as_deref()
            .and_then(|r| r.split_once('/'))
            .is_some_and(|(owner, name)| {
                let part = |p: &str| {
                    !p.is_empty()
                        && p.chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                };
                part(owner) && part(name)
            });
        if !valid {
            return Err("tracker.repository must be owner/repo for github".into());
        }
        if tracker.assignee.is_some() {
            return Err("tracker.assignee is for linear: github items are not routed".into());
        }
        // GitHub's issues and pull requests are open or closed; a state it never reports
        // would hold every item back, or end every open one.
        let states = [("active_states", &tracker.active_states, "open")];
        let states =
            states
                .into_iter()
                .chain([("terminal_states", &tracker.terminal_states, "closed")]);
        for (field, listed, only) in states {
            if let Some(other) = listed.iter().find(|s| !s.trim().eq_ignore_ascii_case(only)) {
                return Err(format!(
                    "tracker.{field} may name only {only} for github, not {other:?}"
                ));
            }
        }
        Ok(())
    }

    fn subject<'t>(&self, tracker: &'t Tracker) -> Option<&'t str> {
        tracker.repository.as_deref()
    }

    fn candidate(&self, tracker: &Tracker, value: &Value) -> Result<Candidate, String> {
        candidate(tracker, value)
    }

    fn payload_candidate(&self, tracker: &Tracker, payload: &Value) -> Result<Candidate, String> {
        payload_candidate(tracker, payload)
    }

    fn fetch<'a>(
        &self,
        poller: &'a Poller,
        tracker: &'a Tracker,
        token: Option<&'a Secret>,
        etags: &'a BTreeMap<String, String>,
        limit: u32,
    ) -> BoxFuture<'a, Fetched> {
        Box::pin(fetch(poller, tracker, token, etags, limit))
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

    fn calls(
        &self,
        tracker: &Tracker,
        item: &ItemRecord,
        action: &ProposedAction,
        id: &str,
    ) -> Result<Vec<Call>, StoreError> {
        calls(tracker, item, action, id)
    }

    fn send<'a>(
        &self,
        target: &'a Target<'a>,
        call: &'a Call,
    ) -> BoxFuture<'a, Result<Answer, Failure>> {
        Box::pin(send(target, call))
    }

    /// Reads the list the call wrote to.
    fn find_marked<'a>(
        &self,
        target: &'a Target<'a>,
        call: &'a Call,
        marker: &'a str,
    ) -> BoxFuture<'a, Result<Option<Answer>, Pause>> {
        Box::pin(find_marked(target, &call.path, marker))
    }
}

/// A GitHub issue or pull request (as the REST API or a webhook payload has it) of
/// `repository`, normalized. The key carries `updated_at` (and a pull request's head SHA):
/// a changed item is a new version, the same version again a duplicate.
fn candidate(tracker: &Tracker, value: &Value) -> Result<Candidate, String> {
    let repository = tracker.repository.as_deref().unwrap_or_default();
    let text = |field: &str| value.get(field).and_then(Value::as_str);
    let number = value
        .get("number")
        .and_then(Value::as_u64)
        .ok_or("a GitHub item needs its number")?;
    let updated_at = text("updated_at").ok_or("a GitHub item needs its updated_at")?;
    let state = text("state").ok_or("a GitHub item needs its state")?;
    let head = value.get("head");
    let (kind, key) = match head {
        Some(head) => {
            let sha = head
                .get("sha")
                .and_then(Value::as_str)
                .ok_or("a pull request needs its head.sha")?;
            let key = format!("github:pull_request:{repository}:{number}:{sha}:{updated_at}");
            ("github_pull_request", key)
        }
        None => (
            "github_issue",
            format!("github:issue:{repository}:{number}:{updated_at}"),
        ),
    };
    let labels = value
        .get("labels")
        .and_then(Value::as_array)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|l| l.get("name").and_then(Value::as_str))
                .map(str::to_lowercase)
                .collect()
        })
        .unwrap_or_default();
    let id = match value.get("id") {
        Some(Value::String(id)) => id.clone(),
        Some(id) => id.to_string(),
        None => number.to_string(),
    };
    // Symphony drops an item without a title: nothing to tell an agent what to do.
    let title = text("title")
        .filter(|title| !title.trim().is_empty())
        .ok_or("a GitHub item needs a title")?;
    let issue = Issue {
        id,
        identifier: format!("{repository}#{number}"),
        title: title.to_string(),
        description: text("body").map(String::from),
        priority: None,
        state: state.to_string(),
        branch_name: head
            .and_then(|h| h.get("ref"))
            .and_then(Value::as_str)
            .map(String::from),
        url: text("html_url").map(String::from),
        labels,
        blocked_by: Vec::new(),
        created_at: text("created_at").map(String::from),
        updated_at: Some(updated_at.to_string()),
        assignee_id: value
            .pointer("/assignee/login")
            .and_then(Value::as_str)
            .map(String::from),
        assigned_to_worker: true,
    };
    Ok(Candidate {
        idempotency_key: key,
        kind,
        issue,
    })
}

/// A pull request version's head SHA, from its key
/// (`github:pull_request:owner/repo:123:<head_sha>:<updated_at>`).
pub(crate) fn head_sha(key: &str) -> Option<&str> {
    let mut parts = key.splitn(6, ':');
    (parts.nth(1) == Some("pull_request"))
        .then(|| parts.nth(2))
        .flatten()
}

/// A webhook payload (`pull_request` or `issue` beside `repository`) or the item itself.
fn payload_candidate(tracker: &Tracker, payload: &Value) -> Result<Candidate, String> {
    let repository = tracker.repository.as_deref().unwrap_or_default();
    if let Some(named) = payload
        .pointer("/repository/full_name")
        .and_then(Value::as_str)
        && !named.eq_ignore_ascii_case(repository)
    {
        return Err(format!(
            "the payload is of {named}, not of the source's repository {repository}"
        ));
    }
    let item = ["pull_request", "issue"]
        .iter()
        .find_map(|field| payload.get(*field))
        .unwrap_or(payload);
    candidate(tracker, item)
}

/// Pages of the open items read per list, 100 items each.
const MAX_OPEN_PAGES: u32 = 10;

/// GETs the repository's issues, then its pull requests: for each, one page of the most
/// recently updated (of every state: a change of state shows there), then every page of
/// the open ones, oldest first (Symphony pages its state reads: an open item that has not
/// moved for long is still seen), up to [`MAX_OPEN_PAGES`]. The issues list has pull
/// requests too, without their head SHA: those entries are left to the second list. Each
/// page keeps its ETag: a page that answers 304 (nothing changed) ends that list's walk.
/// A rate limit stops the poll there, without failing the source.
async fn fetch(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    etags: &BTreeMap<String, String>,
    limit: u32,
) -> Fetched {
    let mut fetched = Fetched::default();
    let base = tracker.endpoint.trim_end_matches('/');
    let repository = tracker.repository.as_deref().unwrap_or_default();
    let per_page = limit.clamp(1, 100);
    let mut seen = std::collections::BTreeSet::new();
    for list in ["issues", "pulls"] {
        let recent = format!(
            "{base}/repos/{repository}/{list}?state=all&sort=updated&direction=desc&per_page={per_page}"
        );
        let open = format!(
            "{base}/repos/{repository}/{list}?state=open&sort=created&direction=asc&per_page=100"
        );
        let walks = [
            (recent, 1, Some(limit as usize)),
            (open, MAX_OPEN_PAGES, None),
        ];
        for (first, pages, take) in walks {
            let mut url = Some(first);
            for _ in 0..pages {
                let Some(at) = url.take() else { break };
                let page = match read_page(poller, token, etags, &at, list, &mut fetched).await {
                    Some(page) => page,
                    None if fetched.error.is_some() => return fetched,
                    None => break,
                };
                let items = page.items.into_iter().filter(|item| {
                    (list == "pulls" || item.get("pull_request").is_none())
                        && seen.insert((list, item.get("id").map(Value::to_string)))
                });
                fetched.items.extend(items.take(take.unwrap_or(usize::MAX)));
                url = page.next;
            }
        }
    }
    fetched
}

/// One page of a list, and the next page's URL.
struct Page {
    items: Vec<Value>,
    next: Option<String>,
}

/// GETs one page with its stored ETag. None when there is nothing to read: it answered 304
/// (its ETag is kept), or the pass must stop (recorded on `fetched`).
async fn read_page(
    poller: &Poller,
    token: Option<&Secret>,
    etags: &BTreeMap<String, String>,
    url: &str,
    list: &str,
    fetched: &mut Fetched,
) -> Option<Page> {
    let what = format!("the {list} list");
    let etag = etags.get(url).map(String::as_str);
    let response = get(poller, token, url, etag, &what, fetched).await?;
    match response.status() {
        StatusCode::NOT_MODIFIED => {
            fetched.not_modified = true;
            if let Some(etag) = etag {
                fetched.etags.insert(url.to_string(), etag.to_string());
            }
            None
        }
        status if status.is_success() => {
            let headers = response.headers();
            if let Some(etag) = headers.get(header::ETAG).and_then(|v| v.to_str().ok()) {
                fetched.etags.insert(url.to_string(), etag.to_string());
            }
            let next = next_link(headers);
            let items = read::<Vec<Value>>(response, &what, fetched).await?;
            Some(Page { items, next })
        }
        status => {
            unexpected(fetched, &what, status);
            None
        }
    }
}

/// The `rel="next"` URL of a `Link` header (GitHub's pagination).
fn next_link(headers: &HeaderMap) -> Option<String> {
    let link = headers.get(header::LINK)?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| {
                target
                    .trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_string()
            })
    })
}

/// The current version of each of these items: `GET /repos/{repository}/pulls/{n}` for a
/// pull request, `/issues/{n}` for an issue. A rate limit stops there; an item that is gone
/// (404, or 410 for a deleted issue) is left out.
async fn fetch_items(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    items: &[&ItemRecord],
) -> Fetched {
    let mut fetched = Fetched::default();
    let base = tracker.endpoint.trim_end_matches('/');
    let repository = tracker.repository.as_deref().unwrap_or_default();
    for item in items {
        let Some((_, number)) = item.identifier.rsplit_once('#') else {
            continue;
        };
        let list = match item.kind.as_str() {
            "github_pull_request" => "pulls",
            _ => "issues",
        };
        let url = format!("{base}/repos/{repository}/{list}/{number}");
        let what = format!("{list}/{number}");
        let Some(response) = get(poller, token, &url, None, &what, &mut fetched).await else {
            return fetched;
        };
        match response.status() {
            StatusCode::NOT_FOUND | StatusCode::GONE => {}
            status if status.is_success() => {
                let Some(value) = read::<Value>(response, &what, &mut fetched).await else {
                    return fetched;
                };
                fetched.items.push(value);
            }
            status => {
                unexpected(&mut fetched, &what, status);
                return fetched;
            }
        }
    }
    fetched
}

/// A request to GitHub's REST API, with its media type, version and the token.
pub(crate) fn request(
    poller: &Poller,
    method: reqwest::Method,
    url: &str,
    token: Option<&Secret>,
) -> reqwest::RequestBuilder {
    let request = poller
        .http
        .request(method, url)
        .header(header::ACCEPT, "application/vnd.github+json")
        .header("X-GitHub-Api-Version", "2022-11-28");
    match token {
        Some(token) => request.bearer_auth(token.expose()),
        None => request,
    }
}

/// One GET of GitHub's REST API. None when the pass must stop there: the request failed
/// or GitHub refused it for its rate limit (recorded on `fetched`). A rate limit that an
/// answer announces without refusing it sets `fetched.backoff_until` too.
async fn get(
    poller: &Poller,
    token: Option<&Secret>,
    url: &str,
    etag: Option<&str>,
    what: &str,
    fetched: &mut Fetched,
) -> Option<reqwest::Response> {
    let mut request = request(poller, reqwest::Method::GET, url, token);
    if let Some(etag) = etag {
        request = request.header(header::IF_NONE_MATCH, etag);
    }
    let response = match request.send().await {
        Ok(response) => response,
        Err(error) => {
            // Without the URL: reqwest's message would repeat it, and it is known.
            let message = format!("GET {what} failed: {}", error.without_url());
            fetched.error = Some(("tracker_unreachable", message));
            return None;
        }
    };
    let status = response.status();
    if let Some(until) = rate_limited(status, response.headers(), Utc::now()) {
        fetched.backoff_until = Some(until);
        if status == StatusCode::FORBIDDEN || status == StatusCode::TOO_MANY_REQUESTS {
            let message = format!("GitHub rate limited {what} ({status})");
            fetched.error = Some(("rate_limited", message));
            return None;
        }
    }
    Some(response)
}

/// A successful answer's JSON; None (recorded on `fetched`) when it is not.
async fn read<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
    what: &str,
    fetched: &mut Fetched,
) -> Option<T> {
    match response.json::<T>().await {
        Ok(value) => Some(value),
        Err(error) => {
            let message = format!("GitHub's {what} is not JSON: {error}");
            fetched.error = Some(("tracker_error", message));
            None
        }
    }
}

fn unexpected(fetched: &mut Fetched, what: &str, status: StatusCode) {
    let message = format!("GitHub answered {what} with {status}");
    fetched.error = Some(("tracker_error", message));
}

/// When requests may resume, if the response says to wait: GitHub refuses with 429, or
/// with 403 once `X-RateLimit-Remaining` is 0 (its `X-RateLimit-Reset` in epoch seconds).
pub(crate) fn rate_limited(
    status: StatusCode,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let refusal = match status {
        StatusCode::TOO_MANY_REQUESTS => Refusal::Certain,
        StatusCode::FORBIDDEN => Refusal::Possible,
        _ => Refusal::None,
    };
    let names = LimitHeaders {
        remaining: "x-ratelimit-remaining",
        reset: "x-ratelimit-reset",
        reset_in_ms: false,
    };
    resume_at(refusal, headers, &names, now)
}

/// An action's calls on the issue or pull request: a comment, a label change (the labels
/// added, then each removed one deleted) or a review.
fn calls(
    tracker: &Tracker,
    item: &ItemRecord,
    action: &ProposedAction,
    id: &str,
) -> Result<Vec<Call>, StoreError> {
    let repository = tracker.repository.as_deref().unwrap_or_default();
    let number = item
        .identifier
        .rsplit_once('#')
        .map(|(_, n)| n)
        .unwrap_or_default();
    let issue = format!("/repos/{repository}/issues/{number}");
    Ok(match action {
        ProposedAction::Comment { body } => {
            let body = json!({ "body": marked(body, id) });
            vec![Call::new("POST", format!("{issue}/comments"), body)]
        }
        ProposedAction::Labels { add, remove } => {
            let added = (!add.is_empty())
                .then(|| Call::new("POST", format!("{issue}/labels"), json!({ "labels": add })));
            let removed = remove.iter().map(|name| {
                let path = format!("{issue}/labels/{}", path_segment(name));
                Call::new("DELETE", path, Value::Null)
            });
            added.into_iter().chain(removed).collect()
        }
        ProposedAction::Review { event, body } => {
            if item.kind != "github_pull_request" {
                return Err(unsupported(item, "a review is for pull requests only"));
            }
            let text = body
                .as_deref()
                .map_or_else(|| marker(id), |b| marked(b, id));
            let mut review = json!({ "event": event.as_str(), "body": text });
            // Pinned to the commit proposed on: GitHub refuses it for another head.
            if let Some(sha) = head_sha(&item.idempotency_key) {
                review["commit_id"] = json!(sha);
            }
            vec![Call::new(
                "POST",
                format!("/repos/{repository}/pulls/{number}/reviews"),
                review,
            )]
        }
        ProposedAction::PullRequest {
            title,
            body,
            head,
            base,
        } => {
            if item.kind != "github_issue" {
                return Err(unsupported(
                    item,
                    "a pull request is opened for an issue (a pull request's fixes push to \
                     its own branch)",
                ));
            }
            let title = title
                .as_deref()
                .unwrap_or(item.issue["title"].as_str().unwrap_or(""));
            // Merging it closes the issue: the loop ends where it began.
            let closes = format!("Closes #{number}.");
            let text = body.as_deref().unwrap_or(&closes);
            let pull = json!({ "title": title, "head": head, "base": base,
                               "body": marked(text, id) });
            vec![Call::new(
                "POST",
                format!("/repos/{repository}/pulls"),
                pull,
            )]
        }
    })
}

/// `name` as one URL path segment.
fn path_segment(name: &str) -> String {
    let mut url = reqwest::Url::parse("http://keel.invalid/").expect("a valid base");
    url.path_segments_mut()
        .expect("a base")
        .pop_if_empty()
        .push(name);
    url.path()[1..].to_string()
}

/// One REST call. A label already gone (404 on its DELETE) is what the call wanted.
async fn send(target: &Target<'_>, call: &Call) -> Result<Answer, Failure> {
    let method = Method::from_bytes(call.method.as_bytes()).expect("a stored method");
    let url = format!(
        "{}{}",
        target.tracker.endpoint.trim_end_matches('/'),
        call.path
    );
    let mut request = request(target.poller, method.clone(), &url, target.token.as_ref());
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
    let limited = rate_limited(status, response.headers(), Utc::now());
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

/// Pages of a GitHub list read when looking for a marker (100 entries each).
const MARKER_PAGES: u32 = 10;

/// Reads the list at `path` (a call's comments, its reviews), page by page.
async fn find_marked(
    target: &Target<'_>,
    path: &str,
    marker: &str,
) -> Result<Option<Answer>, Pause> {
    let base = target.tracker.endpoint.trim_end_matches('/');
    // The pulls list has only open ones unless asked: a sent one may be closed by now.
    let every = if path.ends_with("/pulls") {
        "state=all&"
    } else {
        ""
    };
    for page in 1..=MARKER_PAGES {
        let listed = format!("{path}?{every}per_page=100&page={page}");
        let url = format!("{base}{listed}");
        let request = request(target.poller, Method::GET, &url, target.token.as_ref());
        let response = request.send().await.map_err(|error| {
            pause(
                "tracker_unreachable",
                format!("GET {path} failed: {}", error.without_url()),
            )
        })?;
        let status = response.status();
        if !status.is_success() {
            let until = rate_limited(status, response.headers(), Utc::now());
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

fn pause(code: &'static str, message: String) -> Pause {
    Pause {
        code,
        message,
        until: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_the_link_headers_rel_next() {
        let mut headers = HeaderMap::new();
        let link = "<https://api.github.com/repositories/1/issues?page=2>; rel=\"next\", \
                    <https://api.github.com/repositories/1/issues?page=5>; rel=\"last\"";
        headers.insert(header::LINK, link.parse().unwrap());
        assert_eq!(
            next_link(&headers).as_deref(),
            Some("https://api.github.com/repositories/1/issues?page=2")
        );
        let last = "<https://api.github.com/x?page=1>; rel=\"prev\"";
        headers.insert(header::LINK, last.parse().unwrap());
        assert_eq!(next_link(&headers), None);
    }
    use serde_json::json;

    fn tracker() -> Tracker {
        crate::external::workflow::test_tracker("{kind: github, repository: a/b}")
    }

    #[test]
    fn head_shas_come_from_pull_request_keys() {
        let key = "github:pull_request:a/b:8:abc:2026-01-02T00:00:00Z";
        assert_eq!(head_sha(key), Some("abc"));
        assert_eq!(head_sha("github:issue:a/b:7:2026-01-01T00:00:00Z"), None);
        assert_eq!(head_sha("linear:issue:eng:ENG-1:2026"), None);
    }

    #[test]
    fn github_items_are_keyed_by_version() {
        let issue = json!({ "id": 11, "number": 7, "title": "Broken", "state": "open",
            "updated_at": "2026-01-01T00:00:00Z", "labels": [{ "name": "Bug" }],
            "html_url": "https://github.com/a/b/issues/7" });
        let found = candidate(&tracker(), &issue).unwrap();
        assert_eq!(
            found.idempotency_key,
            "github:issue:a/b:7:2026-01-01T00:00:00Z"
        );
        assert_eq!(found.kind, "github_issue");
        assert_eq!(found.issue.identifier, "a/b#7");
        assert_eq!(found.issue.labels, ["bug"]);
        let pull = json!({ "id": 12, "number": 8, "title": "Fix", "state": "open",
            "updated_at": "2026-01-02T00:00:00Z", "head": { "sha": "abc", "ref": "fix-it" } });
        let found = candidate(&tracker(), &pull).unwrap();
        assert_eq!(
            found.idempotency_key,
            "github:pull_request:a/b:8:abc:2026-01-02T00:00:00Z"
        );
        assert_eq!(found.issue.branch_name.as_deref(), Some("fix-it"));
        assert!(candidate(&tracker(), &json!({ "number": 1 })).is_err());
    }

    #[test]
    fn label_names_are_one_path_segment() {
        assert_eq!(path_segment("needs review/ok"), "needs%20review%2Fok");
        assert_eq!(path_segment("bug"), "bug");
    }

    #[test]
    fn rate_limits_come_from_the_headers() {
        let now = Utc::now();
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        let retry = rate_limited(
            StatusCode::TOO_MANY_REQUESTS,
            &headers(&[("retry-after", "7")]),
            now,
        );
        assert_eq!(retry, Some(now + chrono::Duration::seconds(7)));
        let reset = (now + chrono::Duration::seconds(90)).timestamp();
        let spent = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset.to_string()),
        ]);
        assert_eq!(
            rate_limited(StatusCode::FORBIDDEN, &spent, now),
            DateTime::from_timestamp(reset, 0)
        );
        assert_eq!(
            rate_limited(
                StatusCode::OK,
                &headers(&[("x-ratelimit-remaining", "5")]),
                now
            ),
            None
        );
        assert_eq!(
            rate_limited(StatusCode::FORBIDDEN, &HeaderMap::new(), now),
            None
        );
        assert!(rate_limited(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), now).is_some());
    }
}
