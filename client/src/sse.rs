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
use crate::types::{EventRecord, ModelDelta};
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

/// An item of a run's stream.
#[derive(Debug, Clone)]
pub enum RunItem {
    /// An event of the run's log.
    Event(EventRecord),
    /// Live model text (`model.delta`), not persisted: a reconnect does not replay it.
    Delta(ModelDelta),
}

/// What a run's stream ends after.
pub const RUN_TERMINAL_EVENTS: [&str; 3] = ["run.finished", "run.failed", "run.cancelled"];

impl Client {
    /// The run's events from after `after_sequence` on, resuming across dropped
    /// connections; ends after the run's terminal event.
    pub fn stream_run(
        &self,
        task_id: &str,
        run_id: &str,
        after_sequence: Option<i64>,
    ) -> impl Stream<Item = Result<RunItem, Error>> + Send + '_ {
        let path = format!(
            "/v1/tasks/{}/runs/{}/stream",
            segment(task_id),
            segment(run_id)
        );
        let call = Call::new(self, reqwest::Method::GET, path);
        let ends = |e: &SseEvent| RUN_TERMINAL_EVENTS.contains(&e.event.as_str());
        resumable(call, after_sequence.map(|s| s.to_string()), ends).map(|item| {
            let item = item?;
            if item.event == "model.delta" {
                decode(&item).map(RunItem::Delta)
            } else {
                decode(&item).map(RunItem::Event)
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
    /// Since when connecting has failed, and the wait before the next try.
    down_since: Option<Instant>,
    backoff: Duration,
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
                if let Err(error) = self.connect().await {
                    let since = *self.down_since.get_or_insert_with(Instant::now);
                    if !error.is_transient() || since.elapsed() >= RECONNECT_FOR {
                        self.done = true;
                        return Some(Err(error));
                    }
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
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
        self.backoff = FIRST_BACKOFF;
        Ok(())
    }
}
