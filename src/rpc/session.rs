//! One peer. Request lines are answered as they come: bridged requests run concurrently,
//! so a slow one holds up nothing, and one writer task owns the output, so lines never
//! interleave. A bad line is answered and skipped; only the input closing ends the
//! session, which then lets the requests in flight answer and stops its subscriptions.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::BytesMut;
use chrono::{DateTime, Utc};
use futures_util::StreamExt;
use keel_client::Client;
use keel_client::sse::RunItem;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::codec::{Decoder, LinesCodec, LinesCodecError};
use tokio_util::sync::CancellationToken;

use crate::rpc::methods::{Outbound, Own, Table};
use crate::rpc::protocol;
use crate::rpc::protocol::{MAX_LINE_BYTES, Request, RpcError, code};

/// Lines waiting for a slow host before events and answers wait for it.
const OUTPUT_BUFFER: usize = 1024;
/// The most subscriptions one session holds at once.
const MAX_SUBSCRIPTIONS: usize = 64;
/// How long `daemon.status` waits for the API's health answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// What every session of one `keel rpc` process shares.
pub(crate) struct Server {
    client: Client,
    table: Table,
    started_at: DateTime<Utc>,
}

impl Server {
    pub(crate) fn new(client: Client) -> Arc<Server> {
        let document =
            serde_json::to_value(crate::api::openapi()).expect("the OpenAPI document serializes");
        Arc::new(Server {
            client,
            table: Table::new(&document),
            started_at: Utc::now(),
        })
    }
}

/// Serves one peer until its input closes.
pub async fn run<R, W>(server: Arc<Server>, input: R, output: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (lines, pending) = mpsc::channel(OUTPUT_BUFFER);
    let writer = tokio::spawn(write_lines(output, pending));
    let mut session = Session {
        server,
        lines,
        requests: JoinSet::new(),
        subscriptions: HashMap::new(),
        next_subscription: 1,
        ended: CancellationToken::new(),
    };
    let read = session.read_lines(input).await;
    session.finish().await;
    drop(session);
    writer.await.map_err(io::Error::other)??;
    read
}

async fn write_lines<W: AsyncWrite + Unpin>(
    mut output: W,
    mut pending: mpsc::Receiver<String>,
) -> io::Result<()> {
    while let Some(line) = pending.recv().await {
        output.write_all(line.as_bytes()).await?;
        // Everything already waiting goes out before the flush.
        while let Ok(line) = pending.try_recv() {
            output.write_all(line.as_bytes()).await?;
        }
        output.flush().await?;
    }
    Ok(())
}

struct Session {
    server: Arc<Server>,
    lines: mpsc::Sender<String>,
    requests: JoinSet<()>,
    /// Live subscriptions by id; a subscription's task cancels its own token when it ends.
    subscriptions: HashMap<String, CancellationToken>,
    next_subscription: u64,
    /// Cancelled when the session ends: every subscription's token is its child.
    ended: CancellationToken,
}

impl Session {
    /// Handles every line of `input` until it closes. A line over the limit is answered
    /// and skipped up to its newline; the lines after it are read as usual.
    async fn read_lines<R: AsyncRead + Unpin>(&mut self, mut input: R) -> io::Result<()> {
        let mut lines = LinesCodec::new_with_max_length(MAX_LINE_BYTES);
        let mut buffer = BytesMut::new();
        let mut closed = false;
        loop {
            let decoded = match closed {
                false => lines.decode(&mut buffer),
                true => lines.decode_eof(&mut buffer),
            };
            match decoded {
                Ok(Some(line)) if line.trim().is_empty() => {}
                Ok(Some(line)) => self.handle(&line).await,
                Ok(None) if closed => return Ok(()),
                Ok(None) => closed = input.read_buf(&mut buffer).await? == 0,
                Err(LinesCodecError::MaxLineLengthExceeded) => {
                    let message =
                        format!("a line is at most {MAX_LINE_BYTES} bytes; it was skipped");
                    let error = RpcError::new(code::LINE_TOO_LONG, message);
                    self.send(protocol::error_line(&Value::Null, &error)).await;
                }
                Err(LinesCodecError::Io(error)) => return Err(error),
            }
        }
    }

    async fn send(&self, line: String) {
        // Fails only once the writer is gone (the output broke): nothing left to tell.
        let _ = self.lines.send(line).await;
    }

    async fn handle(&mut self, line: &str) {
        let request = match protocol::parse(line) {
            Ok(request) => request,
            Err(refused) => {
                self.send(protocol::error_line(&refused.id, &refused.error))
                    .await;
                return;
            }
        };
        if let Some(own) = Own::named(&request.method) {
            return self.own(own, request).await;
        }
        let Some(route) = self.server.table.route(&request.method) else {
            let message = format!("no method {}; harness.methods lists them", request.method);
            let error = RpcError::new(code::METHOD_NOT_FOUND, message);
            self.send(protocol::error_line(&request.id, &error)).await;
            return;
        };
        let outbound = match route.outbound(request.params) {
            Ok(outbound) => outbound,
            Err(error) => return self.send(protocol::error_line(&request.id, &error)).await,
        };
        let (server, lines, id) = (self.server.clone(), self.lines.clone(), request.id);
        self.requests.spawn(async move {
            let line = match bridge(&server.client, &outbound).await {
                Ok(result) => protocol::result_line(&id, &result),
                Err(error) => protocol::error_line(&id, &error),
            };
            let _ = lines.send(line).await;
        });
    }

    async fn answer(&self, id: &Value, answer: Result<Value, RpcError>) {
        let line = match answer {
            Ok(result) => protocol::result_line(id, &result),
            Err(error) => protocol::error_line(id, &error),
        };
        self.send(line).await;
    }

    async fn own(&mut self, own: Own, request: Request) {
        let answer = match own {
            Own::Methods => Ok(self.server.table.describe()),
            Own::Status => Ok(self.status().await),
            Own::Unsubscribe => self.unsubscribe(&request.params),
            Own::Subscribe => match self.subscribe(request.params).await {
                // The answer goes out before the first event line: the host knows the id.
                Ok(pump) => {
                    let answer = json!({ "subscription": pump.subscription });
                    self.send(protocol::result_line(&request.id, &answer)).await;
                    tokio::spawn(pump.run());
                    return;
                }
                Err(error) => Err(error),
            },
        };
        self.answer(&request.id, answer).await;
    }

    async fn status(&self) -> Value {
        let health = Outbound::get("/healthz");
        let live = tokio::time::timeout(HEALTH_TIMEOUT, bridge(&self.server.client, &health))
            .await
            .is_ok_and(|answer| answer.is_ok());
        json!({
            "pid": std::process::id(),
            "started_at": self.server.started_at,
            "live": live,
            "api_url": self.server.client.base_url(),
        })
    }

    /// A new subscription, ready to pump its events.
    async fn subscribe(&mut self, params: Map<String, Value>) -> Result<Pump, RpcError> {
        let target = Target::new(params)?;
        self.subscriptions.retain(|_, token| !token.is_cancelled());
        if self.subscriptions.len() >= MAX_SUBSCRIPTIONS {
            let message = format!("a session holds at most {MAX_SUBSCRIPTIONS} subscriptions");
            return Err(RpcError::new(code::TOO_MANY_SUBSCRIPTIONS, message)
                .with_hint("events.unsubscribe the ones you no longer read"));
        }
        if let Target::Run {
            task_id, run_id, ..
        } = &target
        {
            // A run that does not exist is this request's error, not a failed stream.
            let run = self.server.client.get_run(task_id, run_id);
            run.raw().await.map_err(failure)?;
        }
        let subscription = format!("sub_{}", self.next_subscription);
        self.next_subscription += 1;
        let token = self.ended.child_token();
        self.subscriptions
            .insert(subscription.clone(), token.clone());
        Ok(Pump {
            client: self.server.client.clone(),
            lines: self.lines.clone(),
            subscription,
            target,
            token,
        })
    }

    fn unsubscribe(&mut self, params: &Map<String, Value>) -> Result<Value, RpcError> {
        let Some(Value::String(subscription)) = params.get("subscription") else {
            return Err(RpcError::new(
                code::INVALID_PARAMS,
                "`subscription` is required",
            ));
        };
        match self.subscriptions.remove(subscription) {
            Some(token) => {
                token.cancel();
                Ok(json!({ "unsubscribed": subscription }))
            }
            None => Err(RpcError::new(
                code::NOT_FOUND,
                format!("this session has no subscription {subscription}"),
            )),
        }
    }

    async fn finish(&mut self) {
        while self.requests.join_next().await.is_some() {}
        self.ended.cancel();
    }
}

/// What a subscription follows.
enum Target {
    /// One run's events, from after `after_sequence`; ends with the run.
    Run {
        task_id: String,
        run_id: String,
        after_sequence: Option<i64>,
    },
    /// The workspace's feed (one media job's events, when given), after the cursor.
    Feed {
        media_job_id: Option<String>,
        after: Option<String>,
    },
}

impl Target {
    fn new(mut params: Map<String, Value>) -> Result<Target, RpcError> {
        let mut text = |key: &str| match params.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(value)) => Ok(Some(value)),
            Some(_) => Err(RpcError::new(
                code::INVALID_PARAMS,
                format!("`{key}` is a string"),
            )),
        };
        let (task_id, run_id) = (text("task_id")?, text("run_id")?);
        let (media_job_id, after) = (text("media_job_id")?, text("after")?);
        if let Some(unknown) = params.keys().next() {
            let message = format!("unknown param `{unknown}`; harness.methods lists them");
            return Err(RpcError::new(code::INVALID_PARAMS, message));
        }
        match (task_id, run_id, media_job_id) {
            (Some(task_id), Some(run_id), None) => {
                let after_sequence = after
                    .map(|after| after.parse::<i64>())
                    .transpose()
                    .map_err(|_| {
                        RpcError::new(code::INVALID_PARAMS, "a run's `after` is a sequence number")
                    })?;
                Ok(Target::Run {
                    task_id,
                    run_id,
                    after_sequence,
                })
            }
            (None, None, media_job_id) => Ok(Target::Feed {
                media_job_id,
                after,
            }),
            _ => Err(RpcError::new(
                code::INVALID_PARAMS,
                "subscribe to a run (task_id and run_id) or to the feed (optionally media_job_id)",
            )),
        }
    }
}

/// Moves one subscription's events to the output until it ends or is cancelled.
struct Pump {
    client: Client,
    lines: mpsc::Sender<String>,
    subscription: String,
    target: Target,
    token: CancellationToken,
}

impl Pump {
    async fn run(self) {
        let ending = tokio::select! {
            ending = self.pump() => Some(ending),
            () = self.token.cancelled() => None,
        };
        self.token.cancel();
        if let Some(ending) = ending {
            let mut notice =
                json!({"kind": "subscription.ended", "subscription": self.subscription});
            if let Err(error) = ending {
                notice["error"] = json!(error);
            }
            let _ = self.lines.send(protocol::notice_line(&notice)).await;
        }
    }

    /// The events of the target, as the API persisted them (live model text is not
    /// persisted, so it is not pushed).
    async fn pump(&self) -> Result<(), RpcError> {
        match &self.target {
            Target::Run {
                task_id,
                run_id,
                after_sequence,
            } => {
                let events = self
                    .client
                    .stream_run_events(task_id, run_id, *after_sequence);
                let mut events = std::pin::pin!(events);
                while let Some(item) = events.next().await {
                    if let RunItem::Event(event) = item.map_err(failure)? {
                        self.push(&event).await;
                    }
                }
            }
            Target::Feed {
                media_job_id,
                after,
            } => {
                let events = self
                    .client
                    .stream_feed(media_job_id.as_deref(), after.clone());
                let mut events = std::pin::pin!(events);
                while let Some(event) = events.next().await {
                    self.push(&event.map_err(failure)?).await;
                }
            }
        }
        Ok(())
    }

    async fn push(&self, event: &impl serde::Serialize) {
        let event = serde_json::to_value(event).expect("events serialize");
        let _ = self
            .lines
            .send(protocol::event_line(&self.subscription, &event))
            .await;
    }
}

/// Sends one request to the API; its JSON answer (null when it has no body) is the result,
/// or for an artifact's content, [`content`].
async fn bridge(client: &Client, outbound: &Outbound) -> Result<Value, RpcError> {
    let Outbound {
        method,
        path,
        query,
        headers,
        body,
        bytes,
    } = outbound.clone();
    let offset = query
        .iter()
        .find(|(name, _)| name == "offset")
        .and_then(|(_, value)| value.parse::<u64>().ok())
        .unwrap_or(0);
    let answer = client
        .request(method, path, query, headers, body)
        .raw()
        .await
        .map_err(failure)?;
    if bytes {
        return Ok(content(&answer, offset));
    }
    if answer.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&answer).map_err(|error| {
        RpcError::new(
            code::UNAVAILABLE,
            format!("the API answered something that is not JSON: {error}"),
        )
    })
}

/// The most content bytes one answer carries: as base64 they stay well inside the lines a
/// host reads (the same bound as those it sends, [`MAX_LINE_BYTES`]).
const CONTENT_BYTES: usize = MAX_LINE_BYTES / 2;

/// An artifact's bytes from `offset` as JSON, at most [`CONTENT_BYTES`] of them: UTF-8
/// text as `text` (cut before a character the bound would split), anything else as
/// `base64`, with where they start, how many there are, and where the next read starts
/// (`next_offset`, the `offset` to ask for the bytes not read yet; `complete` when none).
fn content(bytes: &[u8], offset: u64) -> Value {
    let bounded = &bytes[..bytes.len().min(CONTENT_BYTES)];
    let (body, taken) = match std::str::from_utf8(bounded) {
        Ok(text) => (json!({ "encoding": "utf8", "text": text }), bounded.len()),
        // Only the bound split a character: the text up to it.
        Err(cut) if cut.error_len().is_none() && cut.valid_up_to() > 0 => {
            let text = std::str::from_utf8(&bounded[..cut.valid_up_to()]).unwrap_or_default();
            (
                json!({ "encoding": "utf8", "text": text }),
                cut.valid_up_to(),
            )
        }
        Err(_) => (
            json!({ "encoding": "base64", "base64": STANDARD.encode(bounded) }),
            bounded.len(),
        ),
    };
    let mut answer = body;
    answer["offset"] = json!(offset);
    answer["length"] = json!(taken);
    answer["next_offset"] = json!(offset + taken as u64);
    answer["complete"] = json!(taken == bytes.len());
    answer
}

/// A client error as the host sees it: the API's envelope kept, its `type` as the code.
fn failure(error: keel_client::Error) -> RpcError {
    match &error {
        keel_client::Error::Api(api) => {
            let body = &api.error;
            let message = match &body.request_id {
                Some(request_id) => format!("{} (request {request_id})", body.message),
                None => body.message.clone(),
            };
            RpcError::new(&body.kind, message).with_hint(body.operator_action.clone())
        }
        keel_client::Error::Usage(message) => RpcError::new(code::INVALID_PARAMS, message.clone()),
        _ => RpcError::new(code::UNAVAILABLE, error.to_string())
            .with_hint("is the Keel API running at --url (KEEL_URL)?"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_is_text_when_it_is_utf8_and_base64_when_not() {
        let text = content("héllo".as_bytes(), 3);
        assert_eq!(
            text,
            json!({ "encoding": "utf8", "text": "héllo", "offset": 3, "length": 6,
                    "next_offset": 9, "complete": true })
        );
        let binary = content(&[0xff, 0x00, 0x01], 0);
        assert_eq!(binary["encoding"], "base64");
        assert_eq!(binary["base64"], "/wAB");
        assert_eq!(binary["next_offset"], 3);
    }

    #[test]
    fn a_long_content_is_bounded_without_splitting_a_character() {
        // 'é' is two bytes: one straddles the bound.
        let bytes = format!("{}é{}", "a".repeat(CONTENT_BYTES - 1), "b".repeat(10));
        let answer = content(bytes.as_bytes(), 0);
        assert_eq!(answer["encoding"], "utf8");
        assert_eq!(answer["length"], CONTENT_BYTES - 1);
        assert_eq!(answer["next_offset"], CONTENT_BYTES - 1);
        assert_eq!(answer["complete"], false);
    }
}
