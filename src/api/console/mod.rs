//! The operator console: a page of hand-written JavaScript modules served from assets
//! embedded in the binary, which renders everything from the public `/v1` API in the
//! browser. It can see and do nothing an API client cannot: every request it makes goes
//! through the same authentication and route policy. See docs/console.md.

mod assets;
mod session;

use std::sync::LazyLock;

use axum::Router;
use axum::extract::{Path, Request};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use sha2::{Digest, Sha256};

use crate::api::{ApiError, AppState};

/// The console's policy: scripts, styles and everything else from this origin only (no
/// inline script, no eval), images also as `data:` (none of the console's own, but a
/// browser may render an `<img>` placeholder so), and no framing by other pages.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// The console's routes, mounted beside the API by [`crate::api::app`].
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/console") }))
        .route("/console", get(index))
        .route("/console/assets/{*path}", get(asset))
        .route(
            "/console/session",
            get(session::show)
                .post(session::sign_in)
                .delete(session::sign_out),
        )
        .route("/console/sign-in-codes", post(session::new_code))
        .layer(axum::middleware::map_response(strict_headers))
}

/// Headers on every console response, errors included.
async fn strict_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// An embedded file with its type and entity tag.
struct Asset {
    path: &'static str,
    bytes: &'static [u8],
    content_type: &'static str,
    etag: HeaderValue,
}

/// The asset table with each file's entity tag, hashed once.
static ASSETS: LazyLock<Vec<Asset>> = LazyLock::new(|| {
    assets::FILES
        .iter()
        .map(|(path, bytes)| {
            let digest = hex::encode(Sha256::digest(bytes));
            Asset {
                path,
                bytes,
                content_type: content_type(path),
                etag: HeaderValue::from_str(&format!("\"{}\"", &digest[..32]))
                    .expect("hex is a header value"),
            }
        })
        .collect()
});

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "application/octet-stream",
    }
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers).unwrap_or_else(IntoResponse::into_response)
}

async fn asset(Path(path): Path<String>, request: Request) -> Response {
    serve(&path, request.headers()).unwrap_or_else(IntoResponse::into_response)
}

/// The asset at `path`: revalidated on every use (`no-cache`), so a new build's files are
/// picked up at once, and answered 304 while the browser's copy is current.
fn serve(path: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    let asset = ASSETS
        .iter()
        .find(|asset| asset.path == path)
        .ok_or_else(|| ApiError::NotFound(format!("console asset '{path}'")))?;
    let cached = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|tag| tag.trim() == asset.etag);
    let status = if cached {
        StatusCode::NOT_MODIFIED
    } else {
        StatusCode::OK
    };
    let body = if cached { &[][..] } else { asset.bytes };
    let headers = [
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        ),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        (header::ETAG, asset.etag.clone()),
    ];
    Ok((status, headers, body).into_response())
}

#[cfg(test)]
mod tests {
    use super::assets::FILES;

    /// A file under assets/ that the table does not list would be missing from the binary.
    #[test]
    fn the_table_lists_every_asset_file() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api/console/assets");
        let mut on_disk = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    let relative = path.strip_prefix(&root).unwrap();
                    on_disk.push(relative.to_string_lossy().into_owned());
                }
            }
        }
        let mut listed: Vec<String> = FILES.iter().map(|(p, _)| p.to_string()).collect();
        on_disk.sort();
        listed.sort();
        assert_eq!(listed, on_disk);
    }
}
