//! External actions: the only writes Keel makes on a tracker. One is proposed on an item
//! (a comment, a label change, a pull-request review, or a pull request from a run's
//! pushed branch), gated by an `external_action` approval, and sent once after it was
//! approved and executed. Its state machine ([`ActionStatus::next`] decides it):
//! `pending_approval` → `approved` → (execute) `sending` → `sent` | `stale_target` |
//! `failed`; `pending_approval` → `rejected`; `pending_approval` | `approved` → `cancelled`.

use serde_json::{Value, json};

use crate::domain::Invalid;
use keel_api_types::ActionStatus;

use keel_api_types::{MAX_ACTION_BODY_BYTES, MAX_LABEL_BYTES, MAX_LABELS, MAX_TITLE_BYTES};

pub(crate) use keel_api_types::ReviewEvent;

/// A proposal as a request has it, before it is checked.
#[derive(Debug, Clone, Default)]
pub(crate) struct ActionDraft {
    pub(crate) kind: Option<String>,
    pub(crate) body: Option<String>,
    pub(crate) add: Option<Vec<String>>,
    pub(crate) remove: Option<Vec<String>>,
    pub(crate) event: Option<String>,
    pub(crate) title: Option<String>,
    pub(crate) head: Option<String>,
    pub(crate) base: Option<String>,
}

/// One checked proposal: exactly one thing to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProposedAction {
    Comment {
        body: String,
    },
    Labels {
        add: Vec<String>,
        remove: Vec<String>,
    },
    /// A pull request's review; the body is required but for `APPROVE`.
    Review {
        event: ReviewEvent,
        body: Option<String>,
    },
    /// A pull request; the branches, when not given, are the run's pushed one and the
    /// task's base ([`ProposedAction::with_branches`]).
    PullRequest {
        title: Option<String>,
        body: Option<String>,
        head: Option<String>,
        base: Option<String>,
    },
}

impl ProposedAction {
    /// Checks a draft: its kind's fields only, bodies non-empty and at most
    /// [`MAX_ACTION_BODY_BYTES`], at most [`MAX_LABELS`] distinct, sane label names.
    pub(crate) fn parse(draft: ActionDraft) -> Result<ProposedAction, Invalid> {
        let kind = draft
            .kind
            .as_deref()
            .ok_or_else(|| Invalid::new("kind", format!("is required ({KINDS})")))?;
        let allowed: &[&str] = match kind {
            "comment" => &["body"],
            "labels" => &["add", "remove"],
            "review" => &["event", "body"],
            "pull_request" => &["title", "body", "head", "base"],
            other => {
                return Err(Invalid::new(
                    "kind",
                    format!("must be {KINDS}, not '{other}'"),
                ));
            }
        };
        let given = [
            ("body", draft.body.is_some()),
            ("add", draft.add.is_some()),
            ("remove", draft.remove.is_some()),
            ("event", draft.event.is_some()),
            ("title", draft.title.is_some()),
            ("head", draft.head.is_some()),
            ("base", draft.base.is_some()),
        ];
        if let Some((field, _)) = given
            .iter()
            .find(|(field, set)| *set && !allowed.contains(field))
        {
            return Err(Invalid::new(
                "kind",
                format!("a {kind} action has no field {field}"),
            ));
        }
        match kind {
            "comment" => {
                let body = draft
                    .body
                    .ok_or_else(|| Invalid::new("body", "is required for a comment"))?;
                Ok(ProposedAction::Comment {
                    body: checked_body(body)?,
                })
            }
            "labels" => {
                let (add, remove) = (
                    draft.add.unwrap_or_default(),
                    draft.remove.unwrap_or_default(),
                );
                check_labels(&add, &remove)?;
                Ok(ProposedAction::Labels { add, remove })
            }
            "pull_request" => Ok(ProposedAction::PullRequest {
                title: draft.title.map(|t| checked_line("title", t)).transpose()?,
                body: draft.body.map(checked_body).transpose()?,
                head: draft.head.map(|b| checked_branch("head", b)).transpose()?,
                base: draft.base.map(|b| checked_branch("base", b)).transpose()?,
            }),
            _ => {
                let event = match draft.event.as_deref() {
                    Some(name) if let Some(event) = ReviewEvent::parse(name) => event,
                    Some(other) => {
                        return Err(Invalid::new(
                            "event",
                            format!("must be COMMENT, APPROVE or REQUEST_CHANGES, not '{other}'"),
                        ));
                    }
                    None => return Err(Invalid::new("event", "is required for a review")),
                };
                let body = draft.body.map(checked_body).transpose()?;
                if body.is_none() && event != ReviewEvent::Approve {
                    return Err(Invalid::new(
                        "body",
                        format!("is required for a {} review", event.as_str()),
                    ));
                }
                Ok(ProposedAction::Review { event, body })
            }
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ProposedAction::Comment { .. } => "comment",
            ProposedAction::Labels { .. } => "labels",
            ProposedAction::Review { .. } => "review",
            ProposedAction::PullRequest { .. } => "pull_request",
        }
    }

    /// A pull request with its branches named: `head` by default the branch the run
    /// pushed, `base` the task's. Other actions are as they were.
    pub(crate) fn with_branches(
        self,
        pushed: Option<String>,
        task_base: Option<String>,
    ) -> Result<ProposedAction, Unbranched> {
        let ProposedAction::PullRequest {
            title,
            body,
            head,
            base,
        } = self
        else {
            return Ok(self);
        };
        let head = head.or(pushed).ok_or(Unbranched::NothingPushed)?;
        let base = base.or(task_base).ok_or(Unbranched::NoBase)?;
        if head == base {
            return Err(Unbranched::SameBranch(head));
        }
        Ok(ProposedAction::PullRequest {
            title,
            body,
            head: Some(head),
            base: Some(base),
        })
    }

    /// The proposal as stored and shown.
    pub(crate) fn to_json(&self) -> Value {
        match self {
            ProposedAction::Comment { body } => json!({ "kind": "comment", "body": body }),
            ProposedAction::Labels { add, remove } => {
                json!({ "kind": "labels", "add": add, "remove": remove })
            }
            ProposedAction::Review { event, body } => {
                json!({ "kind": "review", "event": event.as_str(), "body": body })
            }
            ProposedAction::PullRequest {
                title,
                body,
                head,
                base,
            } => {
                json!({ "kind": "pull_request", "title": title, "body": body, "head": head,
                        "base": base })
            }
        }
    }
}

/// What an operator does to an action; [`Step::moves`] is the one place that says from
/// which status, to which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Approve,
    Reject,
    /// Asks for its sending: the action stays `approved` until its job marks it `sending`.
    Execute,
    Cancel,
}

impl Step {
    /// The status the step moves an action in `from` to, or why it does not.
    pub(crate) fn moves(self, from: ActionStatus) -> Result<ActionStatus, String> {
        use ActionStatus::{Approved, Cancelled, PendingApproval, Rejected};
        match (self, from) {
            (Step::Approve, PendingApproval) => Ok(Approved),
            (Step::Reject, PendingApproval) => Ok(Rejected),
            (Step::Execute, Approved) => Ok(Approved),
            (Step::Cancel, PendingApproval | Approved) => Ok(Cancelled),
            (Step::Approve | Step::Reject, _) => Err(format!("is {from}, not pending approval")),
            (Step::Execute, PendingApproval) => {
                Err("is pending approval: it is executed once approved".into())
            }
            (Step::Execute, _) => Err(format!("is {from}: only an approved action is executed")),
            (Step::Cancel, _) => Err(format!(
                "is {from}: only a pending or approved action is cancelled"
            )),
        }
    }
}

/// The kinds, as a message names them.
const KINDS: &str = "comment, labels, review or pull_request";

/// Why a pull request has no branches to name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unbranched {
    /// No `head` given, and the run pushed none.
    NothingPushed,
    /// No `base` given, and the task names none.
    NoBase,
    SameBranch(String),
}

/// A one-line text: a title.
fn checked_line(field: &'static str, text: String) -> Result<String, Invalid> {
    if text.trim().is_empty() || text.len() > MAX_TITLE_BYTES || text.chars().any(char::is_control)
    {
        return Err(Invalid::new(
            field,
            format!("must be one line of at most {MAX_TITLE_BYTES} bytes, not blank"),
        ));
    }
    Ok(text)
}

/// A branch name as git takes one.
fn checked_branch(field: &'static str, name: String) -> Result<String, Invalid> {
    crate::tasks::check_branch(&name).map_err(|why| Invalid::new(field, why))?;
    checked_line(field, name)
}

/// The hidden marker appended to what an action writes: a worker that cannot tell whether
/// an earlier attempt's call went through looks for it before writing again.
pub(crate) fn marker(action_id: &str) -> String {
    format!("<!-- keel-action:{action_id} -->")
}

/// `body` as sent: the proposed text, then the marker.
pub(crate) fn marked(body: &str, action_id: &str) -> String {
    format!("{body}\n\n{}", marker(action_id))
}

fn checked_body(body: String) -> Result<String, Invalid> {
    if body.trim().is_empty() {
        return Err(Invalid::new("body", "must not be empty"));
    }
    if body.len() > MAX_ACTION_BODY_BYTES {
        return Err(Invalid::new(
            "body",
            format!("is {} bytes; at most {MAX_ACTION_BODY_BYTES}", body.len()),
        ));
    }
    if body.contains('\0') {
        return Err(Invalid::new("body", "must not contain NUL characters"));
    }
    Ok(body)
}

fn check_labels(add: &[String], remove: &[String]) -> Result<(), Invalid> {
    let all: Vec<&String> = add.iter().chain(remove).collect();
    if all.is_empty() {
        return Err(Invalid::new(
            "add",
            "or remove must name at least one label",
        ));
    }
    if all.len() > MAX_LABELS {
        return Err(Invalid::new(
            "add",
            format!("and remove name {} labels; at most {MAX_LABELS}", all.len()),
        ));
    }
    for (index, name) in all.iter().enumerate() {
        let field = if index < add.len() { "add" } else { "remove" };
        if name.trim().is_empty() || name.trim() != name.as_str() {
            return Err(Invalid::new(
                field,
                format!("label '{name}' must be non-empty without surrounding spaces"),
            ));
        }
        if name.len() > MAX_LABEL_BYTES || name.chars().any(char::is_control) {
            return Err(Invalid::new(
                field,
                format!(
                    "label names are at most {MAX_LABEL_BYTES} bytes without control characters"
                ),
            ));
        }
        // GitHub's label names do not differ by case alone.
        if all[..index].iter().any(|n| n.eq_ignore_ascii_case(name)) {
            return Err(Invalid::new(
                field,
                format!("label '{name}' is named twice"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(kind: &str) -> ActionDraft {
        ActionDraft {
            kind: Some(kind.into()),
            ..ActionDraft::default()
        }
    }

    #[test]
    fn each_kind_takes_its_own_fields() {
        let comment = ActionDraft {
            body: Some("hi".into()),
            ..draft("comment")
        };
        assert_eq!(
            ProposedAction::parse(comment.clone()).unwrap(),
            ProposedAction::Comment { body: "hi".into() }
        );
        let mixed = ActionDraft {
            add: Some(vec!["a".into()]),
            ..comment
        };
        assert_eq!(ProposedAction::parse(mixed).unwrap_err().field, "kind");
        let approve = ActionDraft {
            event: Some("APPROVE".into()),
            ..draft("review")
        };
        assert!(ProposedAction::parse(approve).is_ok());
        let bare = ActionDraft {
            event: Some("REQUEST_CHANGES".into()),
            ..draft("review")
        };
        assert_eq!(ProposedAction::parse(bare).unwrap_err().field, "body");
        assert_eq!(
            ProposedAction::parse(draft("merge")).unwrap_err().field,
            "kind"
        );
        assert_eq!(
            ProposedAction::parse(ActionDraft::default())
                .unwrap_err()
                .field,
            "kind"
        );
    }

    #[test]
    fn bodies_and_labels_are_bounded() {
        let long = ActionDraft {
            body: Some("x".repeat(MAX_ACTION_BODY_BYTES + 1)),
            ..draft("comment")
        };
        assert_eq!(ProposedAction::parse(long).unwrap_err().field, "body");
        let blank = ActionDraft {
            body: Some("  \n".into()),
            ..draft("comment")
        };
        assert!(ProposedAction::parse(blank).is_err());
        let labels = |add: &[&str], remove: &[&str]| {
            ProposedAction::parse(ActionDraft {
                add: Some(add.iter().map(|s| s.to_string()).collect()),
                remove: Some(remove.iter().map(|s| s.to_string()).collect()),
                ..draft("labels")
            })
        };
        assert!(labels(&["bug"], &["triage"]).is_ok());
        assert!(labels(&[], &[]).is_err());
        assert!(labels(&["Bug"], &["bug"]).is_err());
        assert!(labels(&[" bug"], &[]).is_err());
        assert!(labels(&["a\nb"], &[]).is_err());
        let many: Vec<String> = (0..21).map(|i| format!("l{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(labels(&many, &[]).is_err());
        assert!(labels(&many[..20], &[]).is_ok());
    }

    #[test]
    fn steps_move_only_from_their_statuses() {
        use ActionStatus::*;
        assert_eq!(Step::Approve.moves(PendingApproval), Ok(Approved));
        assert_eq!(Step::Execute.moves(Approved), Ok(Approved));
        assert_eq!(Step::Cancel.moves(Approved), Ok(Cancelled));
        assert_eq!(Step::Cancel.moves(PendingApproval), Ok(Cancelled));
        for ended in [Sending, Sent, StaleTarget, Failed, Rejected, Cancelled] {
            assert!(Step::Cancel.moves(ended).is_err(), "{ended}");
            assert!(Step::Execute.moves(ended).is_err(), "{ended}");
            assert!(Step::Approve.moves(ended).is_err(), "{ended}");
        }
        assert!(Step::Execute.moves(PendingApproval).is_err());
    }

    #[test]
    fn a_pull_request_names_its_branches() {
        let bare = ProposedAction::parse(draft("pull_request")).unwrap();
        let named = bare
            .clone()
            .with_branches(Some("keel/fix".into()), Some("main".into()))
            .unwrap();
        assert_eq!(
            named.to_json()["head"]
                .as_str()
                .zip(named.to_json()["base"].as_str()),
            Some(("keel/fix", "main"))
        );
        assert_eq!(
            bare.clone().with_branches(None, Some("main".into())),
            Err(Unbranched::NothingPushed)
        );
        assert_eq!(
            bare.clone().with_branches(Some("x".into()), None),
            Err(Unbranched::NoBase)
        );
        assert_eq!(
            bare.with_branches(Some("main".into()), Some("main".into())),
            Err(Unbranched::SameBranch("main".into()))
        );
        let bad_head = ActionDraft {
            head: Some("a..b".into()),
            ..draft("pull_request")
        };
        assert_eq!(ProposedAction::parse(bad_head).unwrap_err().field, "head");
        let event = ActionDraft {
            event: Some("APPROVE".into()),
            ..draft("pull_request")
        };
        assert_eq!(ProposedAction::parse(event).unwrap_err().field, "kind");
    }

    #[test]
    fn the_marker_follows_the_body() {
        assert_eq!(marked("hi", "xa_1"), "hi\n\n<!-- keel-action:xa_1 -->");
    }
}
