//! An in-memory, path-style S3 endpoint (`PUT/GET/HEAD/DELETE /{bucket}/{key}`) that
//! answers with the headers object_store reads (ETag, Last-Modified, Content-Length), so
//! the S3 content store can be tested against a real HTTP round trip. Requests must be
//! SigV4-signed with the expected access key id, which shows the credentials reached the
//! client; the signature itself is not checked.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio_util::sync::CancellationToken;

pub const ACCESS_KEY_ID: &str = "keel-test-key";
pub const SECRET_ACCESS_KEY: &str = "keel-test-secret-do-not-log";
pub const BUCKET: &str = "keel-test";

struct Object {
    bytes: Bytes,
    etag: String,
    last_modified: String,
}

#[derive(Clone, Default)]
struct Objects(Arc<Mutex<BTreeMap<(String, String), Object>>>);

pub struct FakeS3 {
    pub endpoint: String,
    objects: Objects,
    shutdown: CancellationToken,
}

impl FakeS3 {
    pub async fn start() -> FakeS3 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let objects = Objects::default();
        let shutdown = CancellationToken::new();
        let app = Router::new()
            .route(
                "/{bucket}/{*key}",
                get(get_object)
                    .head(head_object)
                    .put(put_object)
                    .delete(delete_object),
            )
            .with_state(objects.clone());
        tokio::spawn(
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.clone().cancelled_owned())
                .into_future(),
        );
        FakeS3 {
            endpoint,
            objects,
            shutdown,
        }
    }

    /// The keys held in `bucket`, in key order.
    pub fn keys(&self, bucket: &str) -> Vec<String> {
        let objects = self.objects.0.lock().unwrap();
        objects
            .keys()
            .filter(|(b, _)| b == bucket)
            .map(|(_, k)| k.clone())
            .collect()
    }

    pub fn object(&self, bucket: &str, key: &str) -> Option<Vec<u8>> {
        let objects = self.objects.0.lock().unwrap();
        objects
            .get(&(bucket.to_string(), key.to_string()))
            .map(|o| o.bytes.to_vec())
    }

    /// The environment a `keel` process needs to use this endpoint as its content store.
    pub fn env(&self, prefix: &str) -> Vec<(&'static str, String)> {
        vec![
            ("KEEL_CONTENT_STORE", "s3".into()),
            ("KEEL_S3_BUCKET", BUCKET.into()),
            ("KEEL_S3_PREFIX", prefix.into()),
            ("KEEL_S3_ENDPOINT", self.endpoint.clone()),
            ("KEEL_S3_REGION", "us-east-1".into()),
            ("KEEL_S3_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.into()),
        ]
    }
}

impl Drop for FakeS3 {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn signed(headers: &HeaderMap) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.starts_with("AWS4-HMAC-SHA256 ")
                && v.contains(&format!("Credential={ACCESS_KEY_ID}/"))
        })
}

fn object_headers(object: &Object) -> [(header::HeaderName, String); 3] {
    [
        (header::ETAG, object.etag.clone()),
        (header::LAST_MODIFIED, object.last_modified.clone()),
        (header::CONTENT_LENGTH, object.bytes.len().to_string()),
    ]
}

async fn put_object(
    State(objects): State<Objects>,
    Path((bucket, key)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !signed(&headers) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let mut objects = objects.0.lock().unwrap();
    let object = Object {
        etag: format!("\"{}-{}\"", objects.len(), body.len()),
        last_modified: chrono::Utc::now()
            .format("%a, %d %b %Y %H:%M:%S GMT")
            .to_string(),
        bytes: body,
    };
    let etag = object.etag.clone();
    objects.insert((bucket, key), object);
    (StatusCode::OK, [(header::ETAG, etag)]).into_response()
}

async fn get_object(
    State(objects): State<Objects>,
    Path((bucket, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !signed(&headers) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let objects = objects.0.lock().unwrap();
    match objects.get(&(bucket, key)) {
        Some(object) => (object_headers(object), object.bytes.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn head_object(
    State(objects): State<Objects>,
    Path((bucket, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !signed(&headers) {
        return StatusCode::FORBIDDEN.into_response();
    }
    let objects = objects.0.lock().unwrap();
    match objects.get(&(bucket, key)) {
        Some(object) => object_headers(object).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn delete_object(
    State(objects): State<Objects>,
    Path((bucket, key)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    if !signed(&headers) {
        return StatusCode::FORBIDDEN.into_response();
    }
    objects.0.lock().unwrap().remove(&(bucket, key));
    StatusCode::NO_CONTENT.into_response()
}
