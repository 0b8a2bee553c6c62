//! Media executors against an in-memory context and mock vendors speaking each protocol.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, Request, ResponseTemplate};

use super::*;

const KEY: &str = "sk-test-key-5ecr3t";
const SECRET_HEADER: &str = "hdr-5ecr3t-value";
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR-test-image";
const MP4: &[u8] = b"\0\0\0\x18ftypmp42\0\0\0\0-test-video";

#[derive(Debug, Clone, PartialEq)]
enum Event {
    SavedTask(String),
    Progress(Value),
}

#[derive(Debug)]
struct Artifact {
    name: String,
    kind: MediaArtifactKind,
    content_type: String,
    bytes: Vec<u8>,
    closed: bool,
}

#[derive(Default)]
struct Recorder {
    cancel: CancellationToken,
    resume_task: Option<String>,
    save_fails_with: Option<ContextError>,
    events: Mutex<Vec<Event>>,
    artifacts: Mutex<Vec<Artifact>>,
}

impl MediaContext for Recorder {
    fn cancellation(&self) -> &CancellationToken {
        &self.cancel
    }

    async fn clear_ahead(&self) -> Result<(), ContextError> {
        Ok(())
    }

    fn vendor_task(&self) -> Option<String> {
        self.resume_task.clone()
    }

    async fn save_vendor_task(&self, task_id: &str) -> Result<(), ContextError> {
        if let Some(error) = &self.save_fails_with {
            return Err(error.clone());
        }
        self.record(Event::SavedTask(task_id.to_string()))
    }

    async fn progress(&self, data: Value) -> Result<(), ContextError> {
        self.record(Event::Progress(data))
    }

    async fn open_artifact(
        &self,
        name: &str,
        kind: MediaArtifactKind,
        content_type: &str,
    ) -> Result<ArtifactHandle, ContextError> {
        let mut artifacts = self.artifacts.lock().unwrap();
        artifacts.push(Artifact {
            name: name.to_string(),
            kind,
            content_type: content_type.to_string(),
            bytes: Vec::new(),
            closed: false,
        });
        Ok(ArtifactHandle((artifacts.len() - 1).to_string()))
    }

    async fn append_artifact(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> Result<(), ContextError> {
        let index: usize = artifact.0.parse().unwrap();
        let mut artifacts = self.artifacts.lock().unwrap();
        assert!(!artifacts[index].closed, "append after close");
        artifacts[index].bytes.extend_from_slice(bytes);
        Ok(())
    }

    async fn close_artifact(&self, artifact: &ArtifactHandle) -> Result<(), ContextError> {
        let index: usize = artifact.0.parse().unwrap();
        self.artifacts.lock().unwrap()[index].closed = true;
        Ok(())
    }
}

impl Recorder {
    fn record(&self, event: Event) -> Result<(), ContextError> {
        if self.cancel.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        self.events.lock().unwrap().push(event);
        Ok(())
    }

    fn saved_tasks(&self) -> Vec<String> {
        let events = self.events.lock().unwrap();
        let saved = events.iter().filter_map(|event| match event {
            Event::SavedTask(id) => Some(id.clone()),
            Event::Progress(_) => None,
        });
        saved.collect()
    }

    fn progress(&self) -> Vec<Value> {
        let events = self.events.lock().unwrap();
        let progress = events.iter().filter_map(|event| match event {
            Event::Progress(data) => Some(data.clone()),
            Event::SavedTask(_) => None,
        });
        progress.collect()
    }

    /// (name, kind, content type, bytes) of each closed artifact, in order.
    fn closed(&self) -> Vec<(String, MediaArtifactKind, String, Vec<u8>)> {
        let artifacts = self.artifacts.lock().unwrap();
        let closed = artifacts.iter().filter(|artifact| artifact.closed);
        closed
            .map(|a| {
                (
                    a.name.clone(),
                    a.kind,
                    a.content_type.clone(),
                    a.bytes.clone(),
                )
            })
            .collect()
    }

    fn metadata(&self) -> Value {
        let artifacts = self.artifacts.lock().unwrap();
        let metadata = artifacts
            .iter()
            .find(|a| a.name == "metadata.json")
            .unwrap();
        assert_eq!(metadata.kind, MediaArtifactKind::Metadata);
        assert!(metadata.closed);
        serde_json::from_slice(&metadata.bytes).unwrap()
    }

    /// Neither secret appears in the outcome, the progress or any artifact.
    fn assert_no_secrets(&self, outcome: &MediaOutcome) {
        let mut texts = vec![format!("{outcome:?}")];
        texts.extend(self.progress().iter().map(Value::to_string));
        let artifacts = self.artifacts.lock().unwrap();
        texts.extend(
            artifacts
                .iter()
                .map(|a| String::from_utf8_lossy(&a.bytes).into_owned()),
        );
        for text in texts {
            assert!(!text.contains(KEY), "api key leaked into {text}");
            assert!(
                !text.contains(SECRET_HEADER),
                "secret header leaked into {text}"
            );
        }
    }
}

fn spec(vendor: Vendor, operation: Operation, server: &MockServer, model: &str) -> MediaSpec {
    MediaSpec {
        vendor,
        operation,
        base_url: format!("{}/api/v3/", server.uri()),
        model: model.into(),
        api_key: Secret::new(KEY.into()),
        headers: vec![("X-Client".into(), "keel".into())],
        secret_headers: vec![("X-Api-Secret".into(), Secret::new(SECRET_HEADER.into()))],
        prompt: "a lighthouse at dusk".into(),
        input: json!({}),
        limits: MediaLimits {
            request_timeout: Duration::from_secs(10),
            download_timeout: Duration::from_secs(10),
            download_max_bytes: 1024 * 1024,
            poll_interval: Duration::from_millis(10),
            poll_timeout: Duration::from_secs(10),
            allow_private_addresses: true,
            ..MediaLimits::default()
        },
    }
}

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

/// The vendor API mock: every call must carry the key and the preset's headers.
fn vendor_call(verb: &str, route: &str) -> wiremock::MockBuilder {
    Mock::given(method(verb))
        .and(path(route))
        .and(header("authorization", format!("Bearer {KEY}").as_str()))
        .and(header("x-client", "keel"))
        .and(header("x-api-secret", SECRET_HEADER))
}

async fn serve_media(server: &MockServer, route: &str, content_type: &str, body: &[u8]) {
    Mock::given(method("GET"))
        .and(path(route))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body.to_vec(), content_type))
        .mount(server)
        .await;
}

async fn requests_to(server: &MockServer, route: &str) -> Vec<Request> {
    let requests = server.received_requests().await.unwrap();
    requests
        .into_iter()
        .filter(|r| r.url.path() == route)
        .collect()
}

fn failed(code: MediaErrorCode) -> impl Fn(&MediaOutcome) -> bool {
    move |outcome| matches!(outcome, MediaOutcome::Failed { code: c, .. } if *c == code)
}

/// Whether an outcome asks to try again, for `code`.
fn retried(code: MediaErrorCode) -> impl Fn(&MediaOutcome) -> bool {
    move |outcome| matches!(outcome, MediaOutcome::Retry { code: c, .. } if *c == code)
}

#[tokio::test]
async fn openai_b64_result_becomes_an_image_artifact_and_metadata() {
    let server = MockServer::start().await;
    vendor_call("POST", "/api/v3/images/generations")
        .and(body_partial_json(json!({
            "model": "gpt-image-1", "prompt": "a lighthouse at dusk", "size": "1024x1024", "n": 1
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "created": 1, "data": [{"b64_json": b64(PNG)}]
        })))
        .expect(1)
        .mount(&server)
        .await;
    let mut spec = spec(
        Vendor::OpenAiImages,
        Operation::ImageGenerate,
        &server,
        "gpt-image-1",
    );
    spec.input = json!({"size": "1024x1024", "n": 1, "forceFailure": false});
    let ctx = Recorder::default();

    let outcome = execute(&spec, &ctx).await;

    assert_eq!(outcome, MediaOutcome::Succeeded);
    let sent: Value = requests_to(&server, "/api/v3/images/generations").await[0]
        .body_json()
        .unwrap();
    assert!(
        sent.get("forceFailure").is_none(),
        "only OpenAI's options are forwarded"
    );
    let closed = ctx.closed();
    assert_eq!(
        closed[0],
        (
            "image-1.png".into(),
            MediaArtifactKind::Image,
            "image/png".into(),
            PNG.to_vec()
        )
    );
    assert_eq!(closed.len(), 2);
    let metadata = ctx.metadata();
    assert_eq!(metadata["vendor"], "openai-images");
    assert_eq!(metadata["model"], "gpt-image-1");
    assert_eq!(metadata["operation"], "image_generate");
    assert_eq!(metadata["vendor_task_id"], Value::Null);
    assert_eq!(
        metadata["outputs"],
        json!([{"artifact": "image-1.png", "kind": "image", "content_type": "image/png",
                "bytes": PNG.len(), "source": "b64_json"}])
    );
    ctx.assert_no_secrets(&outcome);
}

#[tokio::test]
async fn seedream_url_results_are_downloaded_without_credentials() {
    let server = MockServer::start().await;
    let jpeg = b"\xFF\xD8\xFF\xE0-test-jpeg".to_vec();
    vendor_call("POST", "/api/v3/images/generations")
        .and(body_partial_json(json!({
            "model": "seedream-4-0", "prompt": "a lighthouse at dusk",
            "response_format": "url", "size": "2K"
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"data": [
            {"url": format!("{}/media/a.png?X-Tos-Signature=abc", server.uri()), "size": "2048x2048"},
            {"url": format!("{}/media/b", server.uri())},
            {"url": format!("data:image/webp;base64,{}", b64(b"RIFF\0\0\0\0WEBPVP8 "))},
        ]})))
        .expect(1)
        .mount(&server)
        .await;
    serve_media(&server, "/media/a.png", "image/png", PNG).await;
    // Object stores often say octet-stream: the bytes decide.
    serve_media(&server, "/media/b", "application/octet-stream", &jpeg).await;
    let mut spec = spec(
        Vendor::Seedream,
        Operation::ImageGenerate,
        &server,
        "seedream-4-0",
    );
    spec.input = json!({"size": "2K"});
    let ctx = Recorder::default();

    let outcome = execute(&spec, &ctx).await;

    assert_eq!(outcome, MediaOutcome::Succeeded);
    for route in ["/media/a.png", "/media/b"] {
        let downloads = requests_to(&server, route).await;
        assert_eq!(downloads.len(), 1);
        let headers = &downloads[0].headers;
        assert!(
            headers.get("authorization").is_none(),
            "no Authorization to {route}"
        );
        assert!(
            headers.get("x-api-secret").is_none(),
            "no secret header to {route}"
        );
        assert!(
            headers.get("x-client").is_none(),
            "no preset header to {route}"
        );
    }
    let closed = ctx.closed();
    let names: Vec<_> = closed
        .iter()
        .map(|a| (a.0.as_str(), a.2.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("image-1.png", "image/png"),
            ("image-2.jpg", "image/jpeg"),
            ("image-3.webp", "image/webp"),
            ("metadata.json", "application/json")
        ]
    );
    assert_eq!(closed[0].3, PNG);
    assert_eq!(closed[1].3, jpeg);
    let sources: Vec<_> = ctx.metadata()["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["source"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(sources, ["url", "url", "data_url"]);
    assert!(
        !ctx.metadata().to_string().contains("X-Tos-Signature"),
        "no signed URLs in metadata"
    );
    ctx.assert_no_secrets(&outcome);
}

#[tokio::test]
async fn seedream_image_edit_sends_the_reference_image() {
    let server = MockServer::start().await;
    let data_url = format!("data:image/png;base64,{}", b64(PNG));
    for image in ["https://cdn.example.com/in.png".to_string(), data_url] {
        vendor_call("POST", "/api/v3/images/generations")
            .and(body_partial_json(json!({"image": image})))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"data": [{"b64_json": b64(PNG)}]})),
            )
            .expect(1)
            .mount(&server)
            .await;
        let mut spec = spec(
            Vendor::Seedream,
            Operation::ImageEdit,
            &server,
            "seedream-4-0",
        );
        spec.input = json!({"image_url": image});
        let outcome = execute(&spec, &Recorder::default()).await;
        assert_eq!(outcome, MediaOutcome::Succeeded);
    }
}

#[tokio::test]
async fn image_edit_without_an_image_fails_before_calling_the_vendor() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .expect(0)
        .mount(&server)
        .await;
    let ctx = Recorder::default();

    let edit = spec(
        Vendor::Seedream,
        Operation::ImageEdit,
        &server,
        "seedream-4-0",
    );
    assert!(failed(MediaErrorCode::InvalidRequest)(
        &execute(&edit, &ctx).await
    ));
    let unsupported = spec(
        Vendor::OpenAiImages,
        Operation::ImageEdit,
        &server,
        "gpt-image-1",
    );
    let outcome = execute(&unsupported, &ctx).await;
    assert_eq!(
        outcome,
        MediaOutcome::Failed {
            code: MediaErrorCode::InvalidRequest,
            message: "openai-images does not support image_edit".into()
        }
    );
}

/// A Seedance task endpoint: `running` for `running_polls` polls, then `final_task`.
/// It records, at each poll, whether the task id had been saved by then.
fn seedance_task(
    ctx: &Arc<Recorder>,
    running_polls: usize,
    final_task: Value,
) -> (
    impl Fn(&Request) -> ResponseTemplate + Send + Sync + 'static,
    Arc<Mutex<Vec<bool>>>,
) {
    let polls = AtomicUsize::new(0);
    let saved_at_poll = Arc::new(Mutex::new(Vec::new()));
    let seen = saved_at_poll.clone();
    let ctx = ctx.clone();
    let respond = move |_: &Request| {
        seen.lock().unwrap().push(!ctx.saved_tasks().is_empty());
        if polls.fetch_add(1, Ordering::SeqCst) < running_polls {
            ResponseTemplate::new(200).set_body_json(json!({"id": "cgt-1", "status": "running"}))
        } else {
            ResponseTemplate::new(200).set_body_json(final_task.clone())
        }
    };
    (respond, saved_at_poll)
}

#[tokio::test]
async fn seedance_submits_saves_polls_and_downloads_the_video() {
    let server = MockServer::start().await;
    let ctx = Arc::new(Recorder::default());
    vendor_call("POST", "/api/v3/contents/generations/tasks")
        .and(body_partial_json(json!({
            "model": "seedance-1-0-pro",
            "content": [
                {"type": "text", "text": "a lighthouse at dusk"},
                {"type": "image_url", "image_url": {"url": "https://cdn.example.com/first.png"}}
            ],
            "ratio": "16:9", "duration": 5
        })))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "cgt-1"})))
        .expect(1)
        .mount(&server)
        .await;
    let done = json!({"id": "cgt-1", "status": "succeeded",
                      "content": {"video_url": format!("{}/media/v.mp4", server.uri())}});
    let (respond, saved_at_poll) = seedance_task(&ctx, 3, done);
    vendor_call("GET", "/api/v3/contents/generations/tasks/cgt-1")
        .respond_with(respond)
        .expect(4)
        .mount(&server)
        .await;
    serve_media(&server, "/media/v.mp4", "video/mp4", MP4).await;
    let mut spec = spec(
        Vendor::Seedance,
        Operation::VideoGenerate,
        &server,
        "seedance-1-0-pro",
    );
    spec.input =
        json!({"image_url": "https://cdn.example.com/first.png", "ratio": "16:9", "duration": 5});

    let outcome = execute(&spec, ctx.as_ref()).await;

    assert_eq!(outcome, MediaOutcome::Succeeded);
    assert_eq!(ctx.saved_tasks(), ["cgt-1"]);
    assert_eq!(
        *saved_at_poll.lock().unwrap(),
        [true; 4],
        "saved before the first poll"
    );
    let statuses: Vec<_> = ctx
        .progress()
        .into_iter()
        .filter(|p| p["stage"] == "polling")
        .map(|p| p["status"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        statuses,
        ["running", "succeeded"],
        "one report per status change"
    );
    let video = &ctx.closed()[0];
    assert_eq!(
        video,
        &(
            "video.mp4".into(),
            MediaArtifactKind::Video,
            "video/mp4".into(),
            MP4.to_vec()
        )
    );
    assert!(
        requests_to(&server, "/media/v.mp4").await[0]
            .headers
            .get("authorization")
            .is_none()
    );
    let metadata = ctx.metadata();
    assert_eq!(metadata["vendor_task_id"], "cgt-1");
    assert_eq!(metadata["outputs"][0]["kind"], "video");
    ctx.assert_no_secrets(&outcome);
}

#[tokio::test]
async fn seedance_never_polls_a_task_it_could_not_save() {
    let runtime_down = ContextError::Runtime("database unreachable".into());
    let cases = [
        (
            runtime_down,
            MediaOutcome::Retry {
                code: MediaErrorCode::ProviderUnavailable,
                message: "the runtime could not record the attempt: database unreachable".into(),
                after: None,
            },
        ),
        (ContextError::Interrupted, MediaOutcome::Interrupted),
    ];
    for (error, expected) in cases {
        let server = MockServer::start().await;
        vendor_call("POST", "/api/v3/contents/generations/tasks")
            .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "cgt-1"})))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .respond_with(ResponseTemplate::new(500))
            .expect(0)
            .mount(&server)
            .await;
        let ctx = Recorder {
            save_fails_with: Some(error),
            ..Recorder::default()
        };
        let spec = spec(
            Vendor::Seedance,
            Operation::VideoGenerate,
            &server,
            "seedance-1-0-pro",
        );

        assert_eq!(execute(&spec, &ctx).await, expected);
    }
}

#[tokio::test]
async fn seedance_resumes_a_saved_task_without_submitting() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200))
        .expect(0)
        .mount(&server)
        .await;
    let ctx = Arc::new(Recorder {
        resume_task: Some("cgt-9".into()),
        ..Recorder::default()
    });
    let done = json!({"status": "succeeded", "content": {"video_url": format!("{}/media/v.mp4", server.uri())}});
    let (respond, _) = seedance_task(&ctx, 1, done);
    vendor_call("GET", "/api/v3/contents/generations/tasks/cgt-9")
        .respond_with(respond)
        .expect(2)
        .mount(&server)
        .await;
    serve_media(&server, "/media/v.mp4", "video/mp4", MP4).await;
    let spec = spec(
        Vendor::Seedance,
        Operation::VideoGenerate,
        &server,
        "seedance-1-0-pro",
    );

    let outcome = execute(&spec, ctx.as_ref()).await;

    assert_eq!(outcome, MediaOutcome::Succeeded);
    assert!(
        ctx.saved_tasks().is_empty(),
        "the saved id is not saved again"
    );
    assert_eq!(ctx.metadata()["vendor_task_id"], "cgt-9");
}

#[tokio::test]
async fn seedance_task_failure_is_a_provider_error_with_the_vendor_message() {
    let server = MockServer::start().await;
    let ctx = Arc::new(Recorder {
        resume_task: Some("cgt-1".into()),
        ..Recorder::default()
    });
    let task = json!({"status": "failed", "error": {
        "code": "OutputVideoSensitiveContentDetected", "message": "The output video may contain sensitive information."
    }});
    let (respond, _) = seedance_task(&ctx, 1, task);
    vendor_call("GET", "/api/v3/contents/generations/tasks/cgt-1")
        .respond_with(respond)
        .mount(&server)
        .await;
    let spec = spec(
        Vendor::Seedance,
        Operation::VideoGenerate,
        &server,
        "seedance-1-0-pro",
    );

    let outcome = execute(&spec, ctx.as_ref()).await;

    assert_eq!(
        outcome,
        MediaOutcome::Failed {
            code: MediaErrorCode::ProviderError,
            message: "the vendor task ended failed: OutputVideoSensitiveContentDetected: The output video may contain sensitive information.".into()
        }
    );
    assert!(ctx.closed().is_empty());
}

#[tokio::test]
async fn seedance_poll_gives_up_after_the_poll_timeout() {
    let server = MockServer::start().await;
    let ctx = Arc::new(Recorder {
        resume_task: Some("cgt-1".into()),
        ..Recorder::default()
    });
    let (respond, _) = seedance_task(&ctx, usize::MAX, Value::Null);
    vendor_call("GET", "/api/v3/contents/generations/tasks/cgt-1")
        .respond_with(respond)
        .mount(&server)
        .await;
    let mut spec = spec(
        Vendor::Seedance,
        Operation::VideoGenerate,
        &server,
        "seedance-1-0-pro",
    );
    spec.limits.poll_timeout = Duration::from_millis(200);

    let outcome = execute(&spec, ctx.as_ref()).await;

    assert!(failed(MediaErrorCode::Timeout)(&outcome), "{outcome:?}");
    assert!(
        requests_to(&server, "/api/v3/contents/generations/tasks/cgt-1")
            .await
            .len()
            >= 2
    );
}

#[tokio::test]
async fn cancellation_during_polling_interrupts_the_attempt() {
    let server = MockServer::start().await;
    let ctx = Arc::new(Recorder {
        resume_task: Some("cgt-1".into()),
        ..Recorder::default()
    });
    let polled = Arc::new(tokio::sync::Notify::new());
    let notify = polled.clone();
    let respond = move |_: &Request| {
        notify.notify_one();
        ResponseTemplate::new(200).set_body_json(json!({"status": "running"}))
    };
    vendor_call("GET", "/api/v3/contents/generations/tasks/cgt-1")
        .respond_with(respond)
        .mount(&server)
        .await;
    let mut spec = spec(
        Vendor::Seedance,
        Operation::VideoGenerate,
        &server,
        "seedance-1-0-pro",
    );
    // Only cancellation can end the attempt within the test's bound.
    spec.limits.poll_interval = Duration::from_secs(600);
    spec.limits.poll_timeout = Duration::from_secs(3600);
    let cancel_after_first_poll = async {
        polled.notified().await;
        ctx.cancel.cancel();
    };

    let (outcome, ()) = tokio::time::timeout(Duration::from_secs(30), async {
        tokio::join!(execute(&spec, ctx.as_ref()), cancel_after_first_poll)
    })
    .await
    .expect("cancellation ends the attempt");

    assert_eq!(outcome, MediaOutcome::Interrupted);
    let polls = requests_to(&server, "/api/v3/contents/generations/tasks/cgt-1").await;
    assert_eq!(polls.len(), 1);
    assert!(ctx.closed().is_empty());
}

#[tokio::test]
async fn vendor_http_errors_map_to_outcomes() {
    let cases = [
        (
            401,
            None,
            (|o| {
                matches!(
                    o,
                    MediaOutcome::Failed {
                        code: MediaErrorCode::AuthFailed,
                        ..
                    }
                )
            }) as fn(&MediaOutcome) -> bool,
        ),
        (403, None, |o| {
            matches!(
                o,
                MediaOutcome::Failed {
                    code: MediaErrorCode::AuthFailed,
                    ..
                }
            )
        }),
        (400, None, |o| {
            matches!(
                o,
                MediaOutcome::Failed {
                    code: MediaErrorCode::InvalidRequest,
                    ..
                }
            )
        }),
        (404, None, |o| {
            matches!(
                o,
                MediaOutcome::Failed {
                    code: MediaErrorCode::InvalidRequest,
                    ..
                }
            )
        }),
        (422, None, |o| {
            matches!(
                o,
                MediaOutcome::Failed {
                    code: MediaErrorCode::InvalidRequest,
                    ..
                }
            )
        }),
        (503, None, |o| {
            matches!(
                o,
                MediaOutcome::Retry {
                    code: MediaErrorCode::ProviderUnavailable,
                    after: None,
                    ..
                }
            )
        }),
        (500, None, |o| {
            matches!(
                o,
                MediaOutcome::Retry {
                    code: MediaErrorCode::ProviderUnavailable,
                    ..
                }
            )
        }),
        (
            429,
            Some("7"),
            |o| matches!(o, MediaOutcome::Retry { code: MediaErrorCode::RateLimited, after: Some(d), .. } if *d == Duration::from_secs(7)),
        ),
        (429, None, |o| {
            matches!(
                o,
                MediaOutcome::Retry {
                    code: MediaErrorCode::RateLimited,
                    after: None,
                    ..
                }
            )
        }),
    ];
    for (status, retry_after, expected) in cases {
        let server = MockServer::start().await;
        let mut response = ResponseTemplate::new(status).set_body_json(json!({"error": {
            "code": "InvalidParameter", "message": format!("rejected with {status}"), "type": "BadRequest"
        }}));
        if let Some(seconds) = retry_after {
            response = response.insert_header("retry-after", seconds);
        }
        vendor_call("POST", "/api/v3/images/generations")
            .respond_with(response)
            .mount(&server)
            .await;
        let spec = spec(
            Vendor::OpenAiImages,
            Operation::ImageGenerate,
            &server,
            "gpt-image-1",
        );
        let ctx = Recorder::default();

        let outcome = execute(&spec, &ctx).await;

        assert!(expected(&outcome), "HTTP {status}: {outcome:?}");
        let message = match &outcome {
            MediaOutcome::Failed { message, .. } | MediaOutcome::Retry { message, .. } => message,
            other => panic!("HTTP {status}: {other:?}"),
        };
        assert_eq!(
            message,
            &format!("vendor returned HTTP {status}: InvalidParameter: rejected with {status}")
        );
        assert!(ctx.closed().is_empty());
    }
}

#[tokio::test]
async fn an_unreachable_vendor_is_retried() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    drop(listener);
    let server = MockServer::start().await;
    let mut spec = spec(
        Vendor::OpenAiImages,
        Operation::ImageGenerate,
        &server,
        "gpt-image-1",
    );
    spec.base_url = format!("http://{address}/v1");

    let outcome = execute(&spec, &Recorder::default()).await;

    assert!(
        retried(MediaErrorCode::ProviderUnavailable)(&outcome),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_slow_vendor_times_out_and_is_retried() {
    let server = MockServer::start().await;
    let slow = ResponseTemplate::new(200).set_delay(Duration::from_secs(5));
    vendor_call("POST", "/api/v3/images/generations")
        .respond_with(slow)
        .mount(&server)
        .await;
    let mut spec = spec(
        Vendor::OpenAiImages,
        Operation::ImageGenerate,
        &server,
        "gpt-image-1",
    );
    spec.limits.request_timeout = Duration::from_millis(200);

    let outcome = execute(&spec, &Recorder::default()).await;

    assert!(retried(MediaErrorCode::Timeout)(&outcome), "{outcome:?}");
}

#[tokio::test]
async fn a_slow_download_times_out_and_is_retried() {
    let server = MockServer::start().await;
    image_result_at(&server, &format!("{}/media/slow.png", server.uri())).await;
    Mock::given(path("/media/slow.png"))
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(5)))
        .mount(&server)
        .await;
    let mut spec = spec(
        Vendor::Seedream,
        Operation::ImageGenerate,
        &server,
        "seedream-4-0",
    );
    spec.limits.download_timeout = Duration::from_millis(200);

    let outcome = execute(&spec, &Recorder::default()).await;

    assert!(retried(MediaErrorCode::Timeout)(&outcome), "{outcome:?}");
}

#[tokio::test]
async fn secrets_echoed_by_the_vendor_are_scrubbed_from_messages() {
    let server = MockServer::start().await;
    let echo = format!("Incorrect API key provided: {KEY}; header {SECRET_HEADER}");
    vendor_call("POST", "/api/v3/images/generations")
        .respond_with(ResponseTemplate::new(401).set_body_json(json!({"error": {"message": echo}})))
        .mount(&server)
        .await;
    let spec = spec(
        Vendor::OpenAiImages,
        Operation::ImageGenerate,
        &server,
        "gpt-image-1",
    );
    let ctx = Recorder::default();

    let outcome = execute(&spec, &ctx).await;

    assert_eq!(
        outcome,
        MediaOutcome::Failed {
            code: MediaErrorCode::AuthFailed,
            message: "vendor returned HTTP 401: Incorrect API key provided: [redacted]; header [redacted]".into()
        }
    );
    ctx.assert_no_secrets(&outcome);
    assert!(
        !format!("{spec:?}").contains(KEY),
        "the spec's Debug hides the key"
    );
    assert!(!format!("{spec:?}").contains(SECRET_HEADER));
}

/// An image vendor whose one result is the URL `media_url`.
async fn image_result_at(server: &MockServer, media_url: &str) {
    vendor_call("POST", "/api/v3/images/generations")
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"data": [{"url": media_url}]})),
        )
        .mount(server)
        .await;
}

#[tokio::test]
async fn a_download_over_the_limit_by_content_length_is_refused_before_writing() {
    let server = MockServer::start().await;
    image_result_at(&server, &format!("{}/media/big.png", server.uri())).await;
    serve_media(&server, "/media/big.png", "image/png", &[0u8; 4096]).await;
    let mut spec = spec(
        Vendor::Seedream,
        Operation::ImageGenerate,
        &server,
        "seedream-4-0",
    );
    spec.limits.download_max_bytes = 1000;
    let ctx = Recorder::default();

    let outcome = execute(&spec, &ctx).await;

    assert!(
        failed(MediaErrorCode::DownloadTooLarge)(&outcome),
        "{outcome:?}"
    );
    assert!(ctx.artifacts.lock().unwrap().is_empty(), "nothing opened");
}

/// A server that streams `chunks` chunks of 512 bytes with no Content-Length.
async fn chunked_server(chunks: usize) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let mut buffer = [0u8; 1024];
        while !request.windows(4).any(|w| w == b"\r\n\r\n") {
            let read = socket.read(&mut buffer).await.unwrap();
            assert!(read > 0, "connection closed before the request ended");
            request.extend_from_slice(&buffer[..read]);
        }
        let head =
            b"HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nTransfer-Encoding: chunked\r\n\r\n";
        socket.write_all(head).await.unwrap();
        for _ in 0..chunks {
            let chunk = [b"200\r\n".as_slice(), &[7u8; 512], b"\r\n"].concat();
            // The client hangs up once it has seen too much; that is the point.
            if socket.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = socket.write_all(b"0\r\n\r\n").await;
    });
    format!("http://{address}/stream.png")
}

#[tokio::test]
async fn a_streamed_download_over_the_limit_stops_at_the_limit() {
    let server = MockServer::start().await;
    image_result_at(&server, &chunked_server(64).await).await;
    let mut spec = spec(
        Vendor::Seedream,
        Operation::ImageGenerate,
        &server,
        "seedream-4-0",
    );
    spec.limits.download_max_bytes = 2000;
    let ctx = Recorder::default();

    let outcome = execute(&spec, &ctx).await;

    assert!(
        failed(MediaErrorCode::DownloadTooLarge)(&outcome),
        "{outcome:?}"
    );
    let artifacts = ctx.artifacts.lock().unwrap();
    assert!(
        artifacts.iter().all(|a| !a.closed && a.bytes.len() <= 2000),
        "{artifacts:?}"
    );
}

#[tokio::test]
async fn a_streamed_download_within_the_limit_is_saved() {
    let server = MockServer::start().await;
    image_result_at(&server, &chunked_server(4).await).await;
    let spec = spec(
        Vendor::Seedream,
        Operation::ImageGenerate,
        &server,
        "seedream-4-0",
    );
    let ctx = Recorder::default();

    assert_eq!(execute(&spec, &ctx).await, MediaOutcome::Succeeded);
    assert_eq!(ctx.closed()[0].3, vec![7u8; 2048]);
}

#[tokio::test]
async fn private_download_targets_are_refused_unless_allowed() {
    let server = MockServer::start().await;
    let port = server.address().port();
    let mut limits = spec(
        Vendor::Seedream,
        Operation::ImageGenerate,
        &server,
        "seedream-4-0",
    )
    .limits;
    limits.allow_private_addresses = false;
    for (url, why) in [
        (
            format!("http://127.0.0.1:{port}/media/a.png"),
            "127.0.0.1 is not a public address",
        ),
        // A name is checked where it resolves, so DNS cannot swap in a private address.
        (
            format!("http://localhost:{port}/media/a.png"),
            "localhost resolves to no public address",
        ),
        (
            format!("http://[::1]:{port}/media/a.png"),
            "::1 is not a public address",
        ),
    ] {
        let ctx = Recorder::default();

        let outcome = download::fetch(&ctx, &limits, &url, "image-1", MediaArtifactKind::Image)
            .await
            .err();

        let expected = MediaOutcome::Failed {
            code: MediaErrorCode::DownloadRefused,
            message: format!("refused to download the media: {why}"),
        };
        assert_eq!(outcome, Some(expected), "{url}");
        assert!(ctx.artifacts.lock().unwrap().is_empty());
    }
    assert!(
        requests_to(&server, "/media/a.png").await.is_empty(),
        "never connected"
    );
}

#[tokio::test]
async fn vendor_calls_reach_only_public_addresses_unless_allowed() {
    let server = MockServer::start().await;
    image_result_at(&server, "https://cdn.example.com/a.png").await;
    let port = server.address().port();
    for (base_url, why) in [
        (
            format!("http://127.0.0.1:{port}/api/v3"),
            "127.0.0.1 is not a public address",
        ),
        // Resolved once and the checked addresses used to connect: no rebinding inward.
        (
            format!("http://localhost:{port}/api/v3"),
            "localhost resolves to no public address",
        ),
        (
            "http://169.254.169.254/latest".to_string(),
            "169.254.169.254 is not a public address",
        ),
        (
            "http://[2002:7f00:1::1]/v1".to_string(),
            "2002:7f00:1::1 is not a public address",
        ),
    ] {
        let mut spec = spec(
            Vendor::Seedream,
            Operation::ImageGenerate,
            &server,
            "seedream-4-0",
        );
        spec.base_url = base_url.clone();
        spec.limits.allow_private_addresses = false;
        let ctx = Recorder::default();

        let outcome = execute(&spec, &ctx).await;

        let expected = MediaOutcome::Failed {
            code: MediaErrorCode::AddressRefused,
            message: format!(
                "refused to call the vendor: {why} (KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES)"
            ),
        };
        assert_eq!(outcome, expected, "{base_url}");
    }
    assert!(
        server.received_requests().await.unwrap().is_empty(),
        "never connected"
    );
}

#[tokio::test]
async fn vendor_responses_and_results_are_capped() {
    let server = MockServer::start().await;
    let data: Vec<Value> = (0..3).map(|_| json!({"b64_json": b64(PNG)})).collect();
    vendor_call("POST", "/api/v3/images/generations")
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "data": data })))
        .mount(&server)
        .await;
    let spec_with = |change: &dyn Fn(&mut MediaLimits)| {
        let mut spec = spec(
            Vendor::OpenAiImages,
            Operation::ImageGenerate,
            &server,
            "gpt-image-1",
        );
        change(&mut spec.limits);
        spec
    };
    for (spec, code) in [
        (
            spec_with(&|l| l.response_max_bytes = 64),
            MediaErrorCode::ResponseTooLarge,
        ),
        (
            spec_with(&|l| l.max_outputs = 2),
            MediaErrorCode::TooManyOutputs,
        ),
        (
            spec_with(&|l| l.outputs_max_bytes = PNG.len() as u64 + 1),
            MediaErrorCode::OutputsTooLarge,
        ),
    ] {
        let ctx = Recorder::default();
        let outcome = execute(&spec, &ctx).await;
        assert!(failed(code)(&outcome), "{code:?}: {outcome:?}");
    }
    let ctx = Recorder::default();
    assert_eq!(
        execute(&spec_with(&|_| ()), &ctx).await,
        MediaOutcome::Succeeded
    );
}

#[tokio::test]
async fn redirects_are_rechecked_and_bounded() {
    let server = MockServer::start().await;
    Mock::given(path("/media/elsewhere"))
        .respond_with(
            ResponseTemplate::new(302).insert_header("location", "ftp://files.example.com/a.png"),
        )
        .mount(&server)
        .await;
    Mock::given(path("/media/loop"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/media/loop"))
        .mount(&server)
        .await;
    for (route, why) in [
        ("/media/elsewhere", "is not http(s)"),
        ("/media/loop", "too many redirects"),
    ] {
        let vendor = MockServer::start().await;
        image_result_at(&vendor, &format!("{}{route}", server.uri())).await;
        let spec = spec(
            Vendor::Seedream,
            Operation::ImageGenerate,
            &vendor,
            "seedream-4-0",
        );

        let outcome = execute(&spec, &Recorder::default()).await;

        match outcome {
            MediaOutcome::Failed {
                code: MediaErrorCode::DownloadRefused,
                message,
            } => {
                assert!(message.contains(why), "{message}")
            }
            other => panic!("{route}: {other:?}"),
        }
    }
    assert_eq!(requests_to(&server, "/media/loop").await.len(), 6);
}

#[test]
fn names_round_trip() {
    for vendor in [Vendor::OpenAiImages, Vendor::Seedream, Vendor::Seedance] {
        assert_eq!(Vendor::parse(vendor.as_str()), Some(vendor));
    }
    for operation in [
        Operation::ImageGenerate,
        Operation::ImageEdit,
        Operation::VideoGenerate,
    ] {
        assert_eq!(Operation::parse(operation.as_str()), Some(operation));
    }
    assert_eq!(Vendor::parse("jimeng"), None);
    assert!(Vendor::Seedream.supports(Operation::ImageEdit));
    assert!(!Vendor::Seedance.supports(Operation::ImageGenerate));
    assert!(!Vendor::OpenAiImages.supports(Operation::VideoGenerate));
    assert_eq!(
        format!("{} {:?}", Secret::new(KEY.into()), Secret::new(KEY.into())),
        "[redacted] [redacted]"
    );
}
