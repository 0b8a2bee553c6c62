//! Event streams that survive a dropped connection: after an error, an idle connection or
//! an end the stream did not announce, the client reconnects with `Last-Event-ID` set to
//! the last id it saw, so the server resumes exactly after it (nothing missed, nothing
//! twice), for as long as [`RECONNECT_FOR`] of failures in a row.

use std::pin::Pin;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use tokio::time::Instant;

use crate::call::{Call, checked};
use crate::error::Error;
use crate::types::{EventRecord, ModelDelta, ProjectedEvent, RunHeartbeat};
use crate::{Client, segment};

/// How long a stream keeps reconnecting to an API that is down before giving up.
pub const RECONNECT_FOR: Duration = Duration::from_secs(120);
/// A connection silent this long is taken as dead: the server sends a keep-alive every 15 s.
const IDLE: Duration = Duration::from_secs(45);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// One server-sent event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The last id the stream set (SSE ids persist over events that set none).
    pub id: String,
    pub event: String,
    pub data: String,
}

/// An item of a run's stream: `E` is an [`EventRecord`], or with the run's state a
/// [`ProjectedEvent`] ([`Client::stream_run_states`]).
#[derive(Debug, Clone)]
pub enum RunItem<E = EventRecord> {
    /// An event of the run's log.
    Event(E),
    /// Live model text (`model.delta`), not persisted: a reconnect does not replay it.
    Delta(ModelDelta),
    /// How the active run is doing (`run.heartbeat`, when asked for), not persisted.
    Heartbeat(RunHeartbeat),
}

/// What a run's stream ends after.
pub const RUN_TERMINAL_EVENTS: [&str; 3] = ["run.finished", "run.failed", "run.cancelled"];

impl Client {
    /// The run's events from after `after_sequence` on, resuming across dropped
    /// connections; ends after the run's terminal event.
    pub fn stream_run_events(
        &self,
        task_id: &str,
        run_id: &str,
        after_sequence: Option<i64>,
    ) -> impl Stream<Item = Result<RunItem, Error>> + Send + '_ {
        self.run_stream(task_id, run_id, after_sequence, None, None)
    }

    /// [`Client::stream_run_events`] with a [`RunItem::Heartbeat`] every `heartbeat_s`
    /// seconds (1 to 300) while the run is active: what a watch shows of a long run.
    pub fn watch_run_events(
        &self,
        task_id: &str,
        run_id: &str,
        after_sequence: Option<i64>,
        heartbeat_s: u32,
    ) -> impl Stream<Item = Result<RunItem, Error>> + Send + '_ {
        self.run_stream(task_id, run_id, after_sequence, None, Some(heartbeat_s))
    }

    /// [`Client::stream_run_events`] with `projection=state`: the last event of each burst
    /// the server read together carries the run's state after it (its steps, artifacts and
    /// pending approvals), so a live view needs no other request.
    pub fn stream_run_states(
        &self,
        task_id: &str,
        run_id: &str,
        after_sequence: Option<i64>,
    ) -> impl Stream<Item = Result<RunItem<ProjectedEvent>, Error>> + Send + '_ {
        self.run_stream(task_id, run_id, after_sequence, Some("state"), None)
    }

    /// [`Client::stream_run_events`] with `projection=activity`: the last event of each
    /// burst carries the run's whole activity after it (`activity`), a timeline to show
    /// as it is.
    pub fn stream_run_activity(
        &self,
        task_id: &str,
        run_id: &str,
        after_sequence: Option<i64>,
    ) -> impl Stream<Item = Result<RunItem<ProjectedEvent>, Error>> + Send + '_ {
        self.run_stream(task_id, run_id, after_sequence, Some("activity"), None)
    }

    fn run_stream<E: serde::de::DeserializeOwned>(
        &self,
        task_id: &str,
        run_id: &str,
        after_sequence: Option<i64>,
        projection: Option<&str>,
        heartbeat_s: Option<u32>,
    ) -> impl Stream<Item = Result<RunItem<E>, Error>> + Send + '_ {
        let path = format!(
            "/v1/tasks/{}/runs/{}/stream",
            segment(task_id),
            segment(run_id)
        );
        let call = Call::new(self, reqwest::Method::GET, path)
            .query("projection", projection)
            .query("heartbeat_s", heartbeat_s);
        let ends = |e: &SseEvent| RUN_TERMINAL_EVENTS.contains(&e.event.as_str());
        resumable(call, after_sequence.map(|s| s.to_string()), ends).map(|item| {
            let item = item?;
            match item.event.as_str() {
                "model.delta" => decode(&item).map(RunItem::Delta),
                "run.heartbeat" => decode(&item).map(RunItem::Heartbeat),
                _ => decode(&item).map(RunItem::Event),
            }
        })
    }

    /// The workspace's public feed (only `media_job_id`'s events, when given) after the
    /// feed cursor `after`; never ends by itself.
    pub fn stream_feed(
        &self,
        media_job_id: Option<&str>,
        after: Option<String>,
    ) -> impl Stream<Item = Result<EventRecord, Error>> + Send + '_ {
        let call = Call::new(self, reqwest::Method::GET, "/v1/events/stream".into())
            .query("media_job_id", media_job_id);
        resumable(call, after, |_| false).map(|item| decode(&item?))
    }
}

fn decode<T: serde::de::DeserializeOwned>(event: &SseEvent) -> Result<T, Error> {
    serde_json::from_str(&event.data).map_err(|e| Error::Decode {
        url: format!("event stream ({})", event.event),
        message: e.to_string(),
    })
}

type Frames = Pin<Box<dyn Stream<Item = Result<eventsource_stream::Event, String>> + Send>>;

struct Resumable<'c> {
    call: Call<'c, ()>,
    last_id: Option<String>,
    ends: fn(&SseEvent) -> bool,
    frames: Option<Frames>,
    /// The stream announced its end: the next disconnect is the end, not a drop.
    ending: bool,
    done: bool,
    /// Since when connecting has failed.
    down_since: Option<Instant>,
    /// The wait before the next connection: it grows while connections fail or end with
    /// no event (a server refusing or cutting every stream is not hammered), and is reset
    /// by the next event.
    backoff: Duration,
    /// Whether a connection was made before: the first one does not wait.
    reconnecting: bool,
}

/// The events of `call`'s stream after `last_id`, reconnecting as the module says; it
/// ends at the first disconnect after an event `ends` accepts.
pub(crate) fn resumable<'c>(
    call: Call<'c, ()>,
    last_id: Option<String>,
    ends: fn(&SseEvent) -> bool,
) -> impl Stream<Item = Result<SseEvent, Error>> + Send + 'c {
    let state = Resumable {
        call,
        last_id,
        ends,
        frames: None,
        ending: false,
        done: false,
        down_since: None,
        backoff: FIRST_BACKOFF,
        reconnecting: false,
    };
    futures_util::stream::unfold(state, |mut state| async move {
        let item = state.next().await?;
        Some((item, state))
    })
}

impl Resumable<'_> {
    async fn next(&mut self) -> Option<Result<SseEvent, Error>> {
        loop {
            if self.done {
                return None;
            }
            let Some(frames) = self.frames.as_mut() else {
                if self.ending {
                    return None;
                }
                if self.reconnecting {
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                }
                self.reconnecting = true;
                if let Err(error) = self.connect().await {
                    let since = *self.down_since.get_or_insert_with(Instant::now);
                    if !error.is_transient() || since.elapsed() >= RECONNECT_FOR {
                        self.done = true;
                        return Some(Err(error));
                    }
                }
                continue;
            };
            match tokio::time::timeout(IDLE, frames.next()).await {
                Ok(Some(Ok(frame))) => {
                    // The server's notice that it broke the stream off: resume elsewhere.
                    if frame.event == "error" {
                        self.frames = None;
                        continue;
                    }
                    let event = SseEvent {
                        id: frame.id,
                        event: frame.event,
                        data: frame.data,
                    };
                    if !event.id.is_empty() {
                        self.last_id = Some(event.id.clone());
                    }
                    self.backoff = FIRST_BACKOFF;
                    self.ending |= (self.ends)(&event);
                    return Some(Ok(event));
                }
                // Broken, silent or closed: reconnect (or end, after the announced end).
                _ => self.frames = None,
            }
        }
    }

    async fn connect(&mut self) -> Result<(), Error> {
        let mut request = self
            .call
            .request()
            .header(reqwest::header::ACCEPT, "text/event-stream");
        if let Some(id) = &self.last_id {
            request = request.header("last-event-id", id);
        }
        let url = self.call.url();
        let transport = |source| Error::Transport {
            url: url.clone(),
            source,
        };
        let response = match tokio::time::timeout(IDLE, request.send()).await {
            Ok(sent) => sent.map_err(transport)?,
            Err(_) => return Err(Error::Stalled { url }),
        };
        let response = checked(response, &url).await?;
        use eventsource_stream::Eventsource;
        let frames = response
            .bytes_stream()
            .eventsource()
            .map(|frame| frame.map_err(|e| e.to_string()));
        self.frames = Some(Box::pin(frames));
        self.down_since = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures_util::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::sse::RunItem;
    use crate::{Client, Credentials};

    fn event(sequence: i64, kind: &str) -> String {
        let data = serde_json::json!({
            "schema_version": 1, "event_id": format!("evt_{sequence}"), "task_id": "task_1",
            "run_id": "run_1", "media_job_id": null, "sequence": sequence,
            "cursor": format!("1-{sequence}"), "occurred_at": "2026-12-01T00:00:00Z",
            "type": kind, "data": {}
        });
        format!("id: {sequence}\nevent: {kind}\ndata: {data}\n\n")
    }

    /// A stream server that answers each connection with the next of `bodies` and closes
    /// it; it returns the `Last-Event-ID` each connection sent.
    async fn serve(bodies: Vec<String>) -> (String, tokio::task::JoinHandle<Vec<Option<String>>>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for body in bodies {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                while !request.ends_with(b"\r\n\r\n") {
                    let mut byte = [0u8; 1];
                    socket.read_exact(&mut byte).await.unwrap();
                    request.push(byte[0]);
                }
                let request = String::from_utf8(request).unwrap().to_ascii_lowercase();
                let last = request
                    .lines()
                    .find_map(|l| l.strip_prefix("last-event-id: "))
                    .map(str::to_string);
                seen.push(last);
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                socket.write_all(head.as_bytes()).await.unwrap();
                socket.write_all(body.as_bytes()).await.unwrap();
            }
            seen
        });
        (url, server)
    }

    /// A `run.heartbeat` frame as the server sends it.
    const HEARTBEAT: &str = "event: run.heartbeat\ndata: {\"run_id\":\"run_1\",\"status\":\"running\",\
        \"attempt\":1,\"elapsed_ms\":5,\"step\":null,\"model_calls\":0,\"cost_micros_usd\":0,\
        \"budget_micros_usd\":null,\"at\":\"2026-12-07T00:00:00Z\"}\n\n";

    #[tokio::test]
    async fn a_dropped_stream_resumes_after_the_last_event_and_ends_with_the_run() {
        let bodies = vec![
            // Cut off after two events, then the server's own interruption notice.
            format!("{}{}", event(1, "run.started"), event(2, "step.started")),
            format!("{}event: error\ndata: {{}}\n\n", event(3, "step.finished")),
            format!(
                "event: model.delta\ndata: {{\"model_call_index\":1,\"text\":\"hi\"}}\n\n{HEARTBEAT}{}",
                event(4, "run.finished")
            ),
        ];
        let (url, server) = serve(bodies).await;
        let client = Client::new(&url, Credentials::None, Duration::from_secs(5)).unwrap();
        let items: Vec<_> = client
            .stream_run_events("task_1", "run_1", None)
            .collect()
            .await;
        let sequences: Vec<String> = items
            .into_iter()
            .map(|item| match item.unwrap() {
                RunItem::Event(e) => e.sequence.to_string(),
                RunItem::Delta(d) => d.text,
                RunItem::Heartbeat(beat) => format!("{} ms", beat.elapsed_ms.unwrap()),
            })
            .collect();
        // A heartbeat has no id: it moves no cursor, and a reconnect does not replay it.
        assert_eq!(sequences, ["1", "2", "3", "hi", "5 ms", "4"]);
        let seen = server.await.unwrap();
        assert_eq!(seen, [None, Some("2".into()), Some("3".into())]);
    }
}
