//! A local tracker that remembers what it was sent, for the approval-gated action tests:
//! GitHub's comment and review lists answer with what was POSTed to them (so a worker can
//! find an earlier attempt's marker).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

/// What one list (an issue's comments, a pull request's reviews) was sent, in order.
#[derive(Clone, Default)]
pub struct Written(Arc<Mutex<Vec<Value>>>);

impl Written {
    pub fn all(&self) -> Vec<Value> {
        self.0.lock().unwrap().clone()
    }
}

/// Records a POSTed entry the moment it arrives (before any delay: the write happened even
/// if its answer never reaches the worker), and answers 201 with it.
struct Record {
    written: Written,
    delay: Duration,
}

impl Respond for Record {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let sent: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
        let mut entries = self.written.0.lock().unwrap();
        let id = 900 + entries.len() as u64;
        let mut entry = json!({ "id": id, "body": sent["body"],
            "html_url": format!("https://github.example{}#{id}", request.url.path()) });
        if let Some(event) = sent.get("event") {
            entry["state"] = event.clone();
        }
        entries.push(entry.clone());
        ResponseTemplate::new(201)
            .set_body_json(entry)
            .set_delay(self.delay)
    }
}

/// Answers a GET of the list with what it was sent.
struct List(Written);

impl Respond for List {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        ResponseTemplate::new(200).set_body_json(self.0.all())
    }
}

/// Mounts a list at `list_path` (`/repos/o/r/issues/7/comments`) that records POSTs
/// (answering each after `delay`) and answers GETs with them.
pub async fn mount_list(server: &MockServer, list_path: &str, delay: Duration) -> Written {
    let written = Written::default();
    let record = Record {
        written: written.clone(),
        delay,
    };
    Mock::given(method("POST"))
        .and(path(list_path))
        .respond_with(record)
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path(list_path))
        .respond_with(List(written.clone()))
        .mount(server)
        .await;
    written
}

/// The requests `server` received with this method and path.
pub async fn requests(server: &MockServer, verb: &str, at: &str) -> Vec<Request> {
    let all = server.received_requests().await.unwrap_or_default();
    all.into_iter()
        .filter(|r| r.method.as_str() == verb && r.url.path() == at)
        .collect()
}
