//! Seedance on BytePlus ModelArk / Volcengine Ark: an asynchronous task. Submit
//! `POST /contents/generations/tasks`, save its id durably, poll
//! `GET /contents/generations/tasks/{id}` until it ends, then download `content.video_url`.
//! An attempt that finds a saved id resumes polling it instead of paying for a new video.

use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::api::{VendorApi, error_text};
use super::artifacts::{self, Media};
use super::input::{copy_fields, input_object, reference_images};
use super::{
    MediaArtifactKind, MediaContext, MediaErrorCode, MediaOutcome, MediaSpec, Step, cancellable,
};

const TASKS: &str = "contents/generations/tasks";

const OPTIONS: &[&str] = &[
    "ratio",
    "resolution",
    "duration",
    "frames",
    "seed",
    "camera_fixed",
    "watermark",
    "generate_audio",
];

pub(super) async fn run(spec: &MediaSpec, ctx: &impl MediaContext) -> Step<()> {
    let api = VendorApi::new(spec)?;
    let task_id = match ctx.vendor_task() {
        Some(task_id) => {
            ctx.progress(json!({"stage": "resuming", "task_id": task_id}))
                .await?;
            task_id
        }
        None => submit(spec, ctx, &api).await?,
    };
    let video_url = poll(spec, ctx, &api, &task_id).await?;
    let video = Media::Url(video_url);
    let output = artifacts::save(ctx, spec, "video", MediaArtifactKind::Video, video).await?;
    artifacts::check_total(&spec.limits, std::slice::from_ref(&output))?;
    artifacts::write_metadata(ctx, spec, Some(&task_id), &[output]).await
}

async fn submit(spec: &MediaSpec, ctx: &impl MediaContext, api: &VendorApi<'_>) -> Step<String> {
    let body = request_body(spec, &input_object(&spec.input)?)?;
    ctx.progress(json!({"stage": "submitting", "vendor": spec.vendor.as_str()}))
        .await?;
    ctx.clear_ahead().await?;
    let response = api.post(ctx, TASKS, &body).await?;
    let task_id = task_id(&response)?;
    // Saved before the first poll, so a retry after a crash finds the task it paid for.
    ctx.save_vendor_task(&task_id).await?;
    ctx.progress(json!({"stage": "submitted", "task_id": task_id}))
        .await?;
    Ok(task_id)
}

fn request_body(spec: &MediaSpec, input: &Map<String, Value>) -> Step<Value> {
    let mut content = vec![json!({"type": "text", "text": spec.prompt})];
    let images = match reference_images(input)? {
        Some(Value::Array(urls)) => urls,
        Some(url) => vec![url],
        None => Vec::new(),
    };
    content.extend(
        images
            .into_iter()
            .map(|url| json!({"type": "image_url", "image_url": {"url": url}})),
    );
    let mut body = Map::new();
    body.insert("model".into(), spec.model.clone().into());
    body.insert("content".into(), content.into());
    copy_fields(input, OPTIONS, &mut body);
    Ok(Value::Object(body))
}

/// The submitted task's id. It becomes a URL path segment, so it must be a plain token.
fn task_id(response: &Value) -> Step<String> {
    let id = response.get("id").and_then(Value::as_str).unwrap_or("");
    let plain = id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if id.is_empty() || !plain {
        return Err(MediaOutcome::failed(
            MediaErrorCode::ProviderError,
            "the vendor accepted the task but returned no usable task id",
        ));
    }
    Ok(id.to_string())
}

/// Polls until the task ends or `poll_timeout` passes; returns the video's URL.
async fn poll(
    spec: &MediaSpec,
    ctx: &impl MediaContext,
    api: &VendorApi<'_>,
    task_id: &str,
) -> Step<String> {
    let deadline = Instant::now() + spec.limits.poll_timeout;
    let path = format!("{TASKS}/{task_id}");
    let mut reported: Option<String> = None;
    loop {
        // A failed poll ends the attempt as Retry; the next attempt resumes the saved task.
        let task = api.get(ctx, &path).await?;
        let status = task
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        if reported.as_deref() != Some(status) {
            ctx.progress(json!({"stage": "polling", "task_id": task_id, "status": status}))
                .await?;
            reported = Some(status.to_string());
        }
        match status {
            "succeeded" => return video_url(&task),
            "failed" | "cancelled" | "expired" => return Err(task_failed(&task, status)),
            _ => {}
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(MediaOutcome::failed(
                MediaErrorCode::Timeout,
                format!(
                    "task {task_id} was still {status} after {}s",
                    spec.limits.poll_timeout.as_secs_f64()
                ),
            ));
        }
        cancellable(
            ctx,
            tokio::time::sleep(spec.limits.poll_interval.min(remaining)),
        )
        .await?;
    }
}

fn video_url(task: &Value) -> Step<String> {
    let url = task.pointer("/content/video_url").and_then(Value::as_str);
    url.map(str::to_string).ok_or_else(|| {
        MediaOutcome::failed(
            MediaErrorCode::ProviderError,
            "the task succeeded without a content.video_url",
        )
    })
}

fn task_failed(task: &Value, status: &str) -> MediaOutcome {
    let reason = task.get("error").map(error_text).unwrap_or_default();
    let message = if reason.is_empty() {
        format!("the vendor task ended {status}")
    } else {
        format!("the vendor task ended {status}: {reason}")
    };
    MediaOutcome::failed(MediaErrorCode::ProviderError, message)
}
