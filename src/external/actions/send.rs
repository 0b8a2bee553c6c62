//! An action's requests to its tracker: the target asked for again and compared with the
//! proposal's, the stored calls made, and the marker looked for when an earlier attempt's
//! outcome is unknown. Each tracker makes its own calls and finds its own marked writes
//! ([`TrackerApi`](crate::external::tracker::TrackerApi)); this is what they share. The
//! calls' and answers' types are the tracker contract's, in `tracker`, beneath the trackers.

use serde_json::{Value, json};

use crate::external::actions::ActionRecord;
use crate::external::github::head_sha;
use crate::external::tracker::{Answer, Call, Failure, Pause, Target};

/// Asks the tracker for the target again: why it changed since the proposal (and how it
/// is now), or None when it did not.
pub(crate) async fn changed(
    target: &Target<'_>,
    action: &ActionRecord,
) -> Result<Option<(String, Value)>, Pause> {
    let current = target.current().await?;
    Ok(match current {
        Some(current) => compare(target, action, &current),
        None => Some((
            format!(
                "{} changed since the proposal: the tracker no longer has it",
                target.item.identifier
            ),
            Value::Null,
        )),
    })
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
        let answer = target.tracker.api().send(target, call).await?;
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
    target.tracker.api().find_marked(target, call, marker).await
}

/// The text a call writes: a comment's or review's body.
fn body_text(call: &Call) -> Option<&str> {
    call.body
        .get("body")
        .or_else(|| call.body.pointer("/variables/body"))
        .and_then(Value::as_str)
}
