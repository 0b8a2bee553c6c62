//! The public feed without a deployment-wide lock, against real `keel` processes: many
//! writers and a reader that reconnects to another replica get every event exactly once,
//! each run's in order; a writing transaction left open holds the feed back (delays, never
//! loses) and a rolled-back one lets it move on; a malformed cursor is refused. One identity
//! holds a bounded number of streams, and gets each slot back when its stream ends or its
//! client goes away.

use crate::support;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::support::two_orgs::{self, operator_client};
use crate::support::{Client, KeelProcess, SseEvent, SseReader, spawn_api, spawn_worker, wait_for};
use futures_util::{StreamExt, TryStreamExt};
use keel::domain::{EventType, Scope};
use keel::events;
use keel::events::{FeedCursor, NewEvent};
use keel_client::EventRecord;
use reqwest::StatusCode;
use serde_json::Value;
use sqlx::{Connection, PgConnection};

const LONG: Duration = Duration::from_secs(180);
const RUNS: usize = 200;

fn position(cursor: &str) -> FeedCursor {
    FeedCursor::parse(cursor).unwrap_or_else(|| panic!("{cursor} is a feed cursor"))
}

/// Checks an SSE frame of the feed: its id is the event's cursor, past the previous one.
fn checked_cursor(event: &SseEvent, previous: Option<&str>) -> String {
    let cursor = event.data["cursor"].as_str().unwrap().to_string();
    assert_eq!(
        event.id.as_deref(),
        Some(cursor.as_str()),
        "SSE id is the cursor"
    );
    if let Some(previous) = previous {
        assert!(
            position(previous) < position(&cursor),
            "{previous} then {cursor}"
        );
    }
    cursor
}

/// The default workspace's events as stored: event id → (run id, sequence).
async fn stored_events(db: &str) -> BTreeMap<String, (String, i64)> {
    let mut conn = PgConnection::connect(db).await.unwrap();
    let rows: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT event_id, run_id, sequence FROM run_events WHERE run_id IS NOT NULL",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    rows.into_iter().map(|(e, r, s)| (e, (r, s))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_reconnecting_to_the_other_replica_gets_every_event_once_in_run_order() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let apis: Vec<KeelProcess> = vec![
        spawn_api(&db, dir.path(), "api-a").await,
        spawn_api(&db, dir.path(), "api-b").await,
    ];
    let clients: Vec<Client> = apis.iter().map(|a| a.client.clone().unwrap()).collect();
    let _workers: Vec<KeelProcess> = (0..3)
        .map(|i| {
            let name = format!("worker-{i}");
            spawn_worker(&db, dir.path(), &name, 10_000, &dir.path().join(&name))
        })
        .collect();

    // Writers: RUNS short runs started through both replicas, 8 at a time.
    let submitter = {
        let clients = clients.clone();
        tokio::spawn(async move {
            futures_util::stream::iter(0..RUNS)
                .map(|i| {
                    let client = clients[i % 2].clone();
                    async move { Ok::<_, ()>(client.run_shell("true").await.1) }
                })
                .buffer_unordered(8)
                .try_collect::<HashSet<String>>()
                .await
                .unwrap()
        })
    };

    // The reader drops its connection after these many events (counted since it opened)
    // and resumes with Last-Event-ID on the other replica.
    let drops = [1, 37, 5, 150, 2, 100];
    let (mut seen, mut cursor) = (Vec::<Value>::new(), None::<String>);
    let (mut replica, mut drop_at) = (0, 0);
    let mut feed = SseReader::open(&clients[0], "/v1/events/stream", None).await;
    let mut since_open = 0;
    let mut ended = HashSet::new();
    let deadline = tokio::time::Instant::now() + LONG;
    while ended.len() < RUNS {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} runs ended",
            ended.len()
        );
        let Some(event) = feed.next(Duration::from_secs(30)).await else {
            panic!(
                "the feed went quiet with {} of {RUNS} runs ended",
                ended.len()
            );
        };
        cursor = Some(checked_cursor(&event, cursor.as_deref()));
        if matches!(event.event.as_deref(), Some("run.finished" | "run.failed")) {
            ended.insert(event.data["run_id"].as_str().unwrap().to_string());
        }
        seen.push(event.data);
        since_open += 1;
        if drop_at < drops.len() && since_open == drops[drop_at] {
            drop(feed);
            (replica, drop_at, since_open) = (1 - replica, drop_at + 1, 0);
            feed = SseReader::open(&clients[replica], "/v1/events/stream", cursor.as_deref()).await;
        }
    }
    assert_eq!(
        drop_at,
        drops.len(),
        "the reader reconnected at every drop point"
    );
    let started = submitter.await.unwrap();
    assert_eq!(ended, started, "every started run ended in the feed");

    // Every run has ended, so the table is final; the feed catches up to it exactly.
    let stored = stored_events(&db).await;
    while seen.len() < stored.len() {
        let Some(event) = feed.next(Duration::from_secs(30)).await else {
            panic!(
                "the feed delivered {} of {} events",
                seen.len(),
                stored.len()
            );
        };
        cursor = Some(checked_cursor(&event, cursor.as_deref()));
        seen.push(event.data);
    }
    let ids: Vec<&str> = seen
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        ids.len(),
        "none twice"
    );
    let stored_ids: HashSet<&str> = stored.keys().map(String::as_str).collect();
    assert_eq!(
        ids.into_iter().collect::<HashSet<_>>(),
        stored_ids,
        "every event"
    );
    // Each run's events arrive as 1..n, in order, without gaps.
    let mut by_run: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    for event in &seen {
        let run = event["run_id"].as_str().unwrap();
        by_run
            .entry(run)
            .or_default()
            .push(event["sequence"].as_i64().unwrap());
    }
    assert_eq!(by_run.len(), RUNS);
    for (run, sequences) in by_run {
        let expected: Vec<i64> = (1..=sequences.len() as i64).collect();
        assert_eq!(sequences, expected, "{run}'s sequences in the feed");
    }
}

/// Appends one run event in its own committed transaction.
async fn commit_event(conn: &mut PgConnection, run_id: &str) {
    let mut tx = conn.begin().await.unwrap();
    append(&mut tx, run_id).await;
    tx.commit().await.unwrap();
}

async fn append(conn: &mut PgConnection, run_id: &str) {
    let event = NewEvent::new("task_feed", run_id, EventType::ArtifactCreated);
    events::append(conn, &Scope::local(), &[event])
        .await
        .unwrap();
}

/// The feed page after `cursor`, as (run id, sequence) pairs with their last cursor.
async fn page_after(client: &Client, cursor: &str) -> (Vec<(String, i64)>, Option<String>) {
    let (status, page) = client
        .get(&format!("/v1/events?after={cursor}&limit=200"))
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    // keel-client has no operation for the feed: its page is read raw.
    let data = support::page::<EventRecord>(&page).data;
    let events = data
        .iter()
        .map(|e| (e.run_id.clone().unwrap(), e.sequence))
        .collect();
    (events, data.last().map(|e| e.cursor.clone()))
}

/// Reads `n` events off the stream, as (run id, sequence) pairs.
async fn next_events(feed: &mut SseReader, n: usize, last: &mut String) -> Vec<(String, i64)> {
    let mut events = Vec::new();
    for _ in 0..n {
        let event = feed
            .next(Duration::from_secs(30))
            .await
            .expect("an event within 30 s");
        *last = checked_cursor(&event, Some(last));
        let data = &event.data;
        events.push((
            data["run_id"].as_str().unwrap().to_string(),
            data["sequence"].as_i64().unwrap(),
        ));
    }
    events
}

fn pairs(expected: &[(&str, i64)]) -> Vec<(String, i64)> {
    expected.iter().map(|(r, s)| (r.to_string(), *s)).collect()
}

#[tokio::test]
async fn an_open_writing_transaction_holds_the_feed_back_until_it_ends() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api(&db, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let mut writer = PgConnection::connect(&db).await.unwrap();
    // Raw connections: no idle-in-transaction timeout ends the held transaction early.
    let mut holder = PgConnection::connect(&db).await.unwrap();

    commit_event(&mut writer, "run_first").await;
    let mut feed = SseReader::open(&client, "/v1/events/stream", None).await;
    let mut last = "0-0".to_string();
    assert_eq!(
        next_events(&mut feed, 1, &mut last).await,
        pairs(&[("run_first", 1)])
    );
    let before_hold = last.clone();

    // An event written in a transaction left open, then two committed after it.
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    append(&mut holder, "run_held").await;
    commit_event(&mut writer, "run_later").await;
    commit_event(&mut writer, "run_later").await;
    assert_eq!(
        stored_events(&db).await.len(),
        3,
        "the later events are committed"
    );
    assert_eq!(
        page_after(&client, &before_hold).await.0,
        vec![],
        "held back"
    );
    // A run's own events follow `sequence` and are not held back.
    let own = events::list_for_run(&mut writer, &Scope::local(), "run_later", 0, 10).await;
    assert_eq!(own.unwrap().len(), 2, "a run's list is not held back");
    // The stream too (three of its polling intervals pass without a delivery).
    assert!(
        feed.next(Duration::from_millis(1500)).await.is_none(),
        "held back"
    );

    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    let all = pairs(&[("run_held", 1), ("run_later", 1), ("run_later", 2)]);
    assert_eq!(next_events(&mut feed, 3, &mut last).await, all);
    let (page, page_end) = page_after(&client, &before_hold).await;
    assert_eq!(
        page, all,
        "from the cursor before the hold: all of them, none twice"
    );
    assert_eq!(page_end.as_deref(), Some(last.as_str()));

    // A rolled-back writer leaves nothing, and the feed moves on past it.
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    append(&mut holder, "run_rolled_back").await;
    commit_event(&mut writer, "run_after_rollback").await;
    assert_eq!(page_after(&client, &last).await.0, vec![], "held back");
    sqlx::query("ROLLBACK").execute(&mut holder).await.unwrap();
    let after_rollback = pairs(&[("run_after_rollback", 1)]);
    assert_eq!(next_events(&mut feed, 1, &mut last).await, after_rollback);

    // A transaction that writes no event (and so sends no NOTIFY) holds the feed back too,
    // and its end releases it without waiting for another event.
    sqlx::query("BEGIN").execute(&mut holder).await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut holder)
        .await
        .unwrap();
    commit_event(&mut writer, "run_quiet").await;
    assert_eq!(page_after(&client, &last).await.0, vec![], "held back");
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    assert_eq!(
        next_events(&mut feed, 1, &mut last).await,
        pairs(&[("run_quiet", 1)])
    );
}

#[tokio::test]
async fn a_subjects_events_stay_in_sequence_order_whatever_order_their_transactions_began() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api(&db, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let mut early = PgConnection::connect(&db).await.unwrap();
    let mut late = PgConnection::connect(&db).await.unwrap();

    // `early` takes its transaction id first but appends after `late` committed, so its
    // event comes second in the run although its transaction id is lower.
    sqlx::query("BEGIN").execute(&mut early).await.unwrap();
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut early)
        .await
        .unwrap();
    commit_event(&mut late, "run_s").await;
    append(&mut early, "run_s").await;
    sqlx::query("COMMIT").execute(&mut early).await.unwrap();

    // One call appending for two subjects numbers each on from its own last event.
    let mut tx = late.begin().await.unwrap();
    let batch = [
        NewEvent::new("task_feed", "run_s", EventType::StepStarted),
        NewEvent::new("task_feed", "run_t", EventType::StepStarted),
        NewEvent::new("task_feed", "run_s", EventType::StepFinished),
    ];
    events::append(&mut tx, &Scope::local(), &batch)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let expected = pairs(&[
        ("run_s", 1),
        ("run_s", 2),
        ("run_s", 3),
        ("run_t", 1),
        ("run_s", 4),
    ]);
    let page = wait_for(
        Duration::from_secs(30),
        "the feed to deliver all",
        || async {
            let (page, _) = page_after(&client, "0-0").await;
            (page.len() == expected.len()).then_some(page)
        },
    )
    .await;
    assert_eq!(page, expected);
}

#[tokio::test]
async fn a_malformed_feed_cursor_is_refused_with_the_envelope() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api(&db, dir.path(), "api").await;
    let client = api.client.clone().unwrap();
    let bad = [
        "abc",
        "12",
        "-1",
        "1-",
        "-1-2",
        "1--2",
        "+1-2",
        "1-2-3",
        "18446744073709551616-1",
        "1-9223372036854775808",
        "١-٢",
    ];
    for cursor in bad {
        let query = format!("/v1/events?after={}", urlencode(cursor));
        let (status, body) = client.get(&query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{cursor}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request", "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("after"),
            "{body}"
        );
        let request = client
            .http
            .get(format!("{}/v1/events/stream", client.base))
            .header("Last-Event-ID", cursor);
        let (status, body) = client.send(request).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{cursor}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Last-Event-ID"),
            "{body}"
        );
    }
    // The largest positions are still cursors: nothing lies after them.
    let (status, body) = client
        .get("/v1/events?after=18446744073709551615-9223372036854775807")
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(
        support::page::<EventRecord>(&body).data.is_empty(),
        "{body}"
    );
}

fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Opens the stream at `path`: the stream, or the refusal's status and envelope.
async fn try_stream(client: &Client, path: &str) -> Result<SseReader, (StatusCode, Value)> {
    let response = client.http.get(format!("{}{path}", client.base)).send();
    SseReader::from_response(response.await.expect("a response")).await
}

/// Waits until `client` may open one more stream at `path` (a slot was given back).
async fn stream_when_free(client: &Client, path: &str, why: &str) -> SseReader {
    wait_for(Duration::from_secs(20), why, || async {
        try_stream(client, path).await.ok()
    })
    .await
}

/// A member holds at most `KEEL_MAX_STREAMS_PER_IDENTITY` (by default 16) streams at once,
/// runs' and the feed's together; one more is 429 with the envelope, while other identities
/// open theirs. A stream whose client goes away, and one that ends (its run was canceled),
/// give their slots back.
#[tokio::test]
async fn an_identity_holds_a_bounded_number_of_streams_and_gets_them_back() {
    const FEED: &str = "/v1/events/stream";
    let stack = two_orgs::stack().await;
    let a = &stack.a;
    // Queued for good: the stack has no worker. Its stream lasts until it is canceled.
    let (task, run) = a.run_shell("true").await;
    let mut run_stream =
        SseReader::open(a, &format!("/v1/tasks/{task}/runs/{run}/stream"), None).await;
    let mut feeds = Vec::new();
    for _ in 1..keel::config::DEFAULT_MAX_STREAMS_PER_IDENTITY {
        feeds.push(SseReader::open(a, FEED, None).await);
    }
    let (status, body) = try_stream(a, FEED)
        .await
        .err()
        .expect("one stream too many");
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_exceeded", "{body}");
    assert!(body["error"]["request_id"].is_string(), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("16 streams are open"), "{message}");

    // Counted per identity: the org's operator and the other org open theirs.
    let operator = operator_client(&a.base, "a");
    let _operators = SseReader::open(&operator, FEED, None).await;
    let _org_b = SseReader::open(&stack.b, FEED, None).await;

    // A client that goes away gives its slot back.
    drop(feeds.pop());
    feeds.push(stream_when_free(a, FEED, "the slot of the stream whose client left").await);

    // So does a stream that ends: the run's, once it is canceled. Its client stays.
    let (status, _) = a
        .api
        .cancel_run(&task, &run)
        .send_with_status()
        .await
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    let mut last = None;
    while let Some(event) = run_stream.next(Duration::from_secs(20)).await {
        last = event.event;
    }
    assert_eq!(
        last.as_deref(),
        Some("run.cancelled"),
        "the run's stream ended with the run"
    );
    let _reopened = stream_when_free(a, FEED, "the slot of the stream that ended").await;
}
