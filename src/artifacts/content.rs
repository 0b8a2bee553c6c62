//! Content stores: where artifact bytes live. Metadata (`artifacts`) and the chunk index
//! (`artifact_chunks`, one row per append keyed by `(artifact_id, offset_bytes)`) are in
//! Postgres either way; a chunk's bytes are inline (`data`, the Postgres store) or in an
//! S3-compatible bucket (`object_key`, the S3 store). Every append runs inside the caller's
//! transaction, so a chunk becomes visible with the size and events it commits alongside.
//!
//! An artifact stays in the store its first bytes went to (`artifacts.storage`), and each
//! chunk row says where its bytes are, so reads find them even after the configuration
//! changes.

use std::fmt;

use bytes::Bytes;
use futures_util::Stream;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use sqlx::{PgConnection, PgPool};

use crate::db::{Result, StoreError};
use crate::domain::Scope;

/// Chunk rows read at a time when an artifact is streamed: at most this many chunks'
/// bytes are in memory at once.
const READ_PAGE_CHUNKS: i64 = 16;

#[derive(Clone)]
pub enum ContentStore {
    Postgres,
    S3(S3Content),
}

/// An S3-compatible bucket holding chunks as objects
/// `<prefix>/artifacts/<artifact_id>/<offset_bytes, 20 digits>`.
#[derive(Clone)]
pub struct S3Content {
    client: AmazonS3,
    bucket: String,
    prefix: String,
}

// By hand: the client's own Debug reaches its credential provider.
impl fmt::Debug for ContentStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ContentStore::Postgres => f.write_str("ContentStore::Postgres"),
            ContentStore::S3(s3) => f
                .debug_struct("ContentStore::S3")
                .field("bucket", &s3.bucket)
                .field("prefix", &s3.prefix)
                .finish_non_exhaustive(),
        }
    }
}

/// Where an S3 content store keeps its objects, as configured (KEEL_S3_*).
#[derive(Debug, Clone, Default)]
pub struct S3Settings {
    pub(crate) bucket: Option<String>,
    pub(crate) prefix: Option<String>,
    pub(crate) endpoint: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) allow_http: bool,
}

impl ContentStore {
    /// An S3 store from `settings` on top of `builder` (which supplies credentials).
    pub fn s3(settings: &S3Settings, builder: AmazonS3Builder) -> Result<ContentStore> {
        let invalid = |message: String| StoreError::Content(message);
        let Some(bucket) = settings.bucket.clone().filter(|b| !b.is_empty()) else {
            return Err(invalid(
                "the s3 content store needs a bucket: set KEEL_S3_BUCKET (--s3-bucket)".into(),
            ));
        };
        let prefix = settings
            .prefix
            .as_deref()
            .unwrap_or("")
            .trim_matches('/')
            .to_string();
        if !prefix.is_empty() {
            Path::parse(&prefix).map_err(|e| {
                invalid(format!(
                    "KEEL_S3_PREFIX {prefix:?} is not a valid key prefix: {e}"
                ))
            })?;
        }
        let mut builder = builder
            .with_bucket_name(&bucket)
            .with_allow_http(settings.allow_http);
        if let Some(endpoint) = &settings.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &settings.region {
            builder = builder.with_region(region);
        }
        let client = builder
            .build()
            .map_err(|e| invalid(format!("configuring the s3 content store: {e}")))?;
        Ok(ContentStore::S3(S3Content {
            client,
            bucket,
            prefix,
        }))
    }

    /// The `artifacts.storage` value of artifacts this store starts.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            ContentStore::Postgres => POSTGRES,
            ContentStore::S3(_) => S3,
        }
    }

    /// Appends bytes, keeping the artifact within `max_bytes`; what does not fit is dropped
    /// and the artifact is marked truncated. Runs in the caller's transaction, which holds
    /// the artifact's row lock until it ends, so appends to one artifact are serialised.
    pub async fn append(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        artifact_id: &str,
        bytes: &[u8],
        max_bytes: i64,
    ) -> Result<()> {
        let row = sqlx::query!(
            "SELECT size_bytes, storage FROM artifacts WHERE workspace_id = $1 AND id = $2
                 FOR UPDATE",
            scope.workspace(),
            artifact_id,
        )
        .fetch_optional(&mut *conn)
        .await?
        .ok_or(StoreError::NotFound("artifact"))?;
        let (size, stored_in) = (row.size_bytes, row.storage);
        let room = usize::try_from((max_bytes - size).max(0)).unwrap_or(usize::MAX);
        let kept = &bytes[..bytes.len().min(room)];
        // An empty artifact has no chunks yet, so it can move to this process's store; one
        // with bytes keeps its store, so a takeover by a differently configured worker does
        // not split it.
        let storage = if size == 0 && !kept.is_empty() {
            self.name()
        } else {
            storage_name(&stored_in)?
        };
        if !kept.is_empty() {
            match storage {
                POSTGRES => {
                    sqlx::query!(
                        "INSERT INTO artifact_chunks (artifact_id, offset_bytes, data, size_bytes)
                         VALUES ($1, $2, $3, $4)",
                        artifact_id,
                        size,
                        kept,
                        kept.len() as i64,
                    )
                    .execute(&mut *conn)
                    .await?;
                }
                _ => {
                    let s3 = self.s3_for(artifact_id)?;
                    let key = s3.key(artifact_id, size);
                    // The object goes up before its row: a committed row always finds its
                    // object. If this transaction rolls back the object is an orphan, which
                    // is harmless: no row points at it, and the retry appends at the same
                    // offset and so overwrites the same key.
                    s3.client
                        .put(&Path::from(key.as_str()), PutPayload::from(kept.to_vec()))
                        .await
                        .map_err(|e| StoreError::Content(e.to_string()))?;
                    sqlx::query!(
                        "INSERT INTO artifact_chunks (artifact_id, offset_bytes, object_key, size_bytes)
                         VALUES ($1, $2, $3, $4)",
                        artifact_id,
                        size,
                        &key,
                        kept.len() as i64,
                    )
                    .execute(&mut *conn)
                    .await?;
                }
            }
        }
        sqlx::query!(
            "UPDATE artifacts SET size_bytes = size_bytes + $2, truncated = truncated OR $3,
                                  storage = $4, updated_at = now()
             WHERE id = $1",
            artifact_id,
            kept.len() as i64,
            kept.len() < bytes.len(),
            storage,
        )
        .execute(conn)
        .await?;
        Ok(())
    }

    /// The bytes written so far (up to the size at the call), in order, from wherever each
    /// chunk was stored: a page of chunk rows at a time, each S3 chunk fetched as it is
    /// reached, so a large video is never held in memory whole and no connection is held
    /// while a slow client reads. Takes no scope: the caller names an artifact it read
    /// through the scoped [`artifacts::get`](crate::artifacts::get), and chunks have no
    /// workspace of their own.
    pub fn stream(
        &self,
        pool: PgPool,
        artifact_id: String,
    ) -> impl Stream<Item = Result<Bytes>> + Send + 'static {
        self.stream_from(pool, artifact_id, 0)
    }

    /// The bytes after the first `from`, as [`ContentStore::stream`] reads them: a reader
    /// following a growing log asks for what it has not seen, and the chunks before the
    /// one holding `from` are never read.
    pub(crate) fn stream_from(
        &self,
        pool: PgPool,
        artifact_id: String,
        from: i64,
    ) -> impl Stream<Item = Result<Bytes>> + Send + 'static {
        let store = self.clone();
        async_stream::try_stream! {
            let size = sqlx::query_scalar!(
                "SELECT size_bytes FROM artifacts WHERE id = $1",
                &artifact_id,
            )
            .fetch_optional(&pool)
            .await?
            .ok_or(StoreError::NotFound("artifact"))?;
            // The chunk holding `from` starts at or before it (one probe of the key).
            let mut next = sqlx::query_scalar!(
                r#"SELECT coalesce(max(offset_bytes), 0) AS "offset!" FROM artifact_chunks
                   WHERE artifact_id = $1 AND offset_bytes <= $2"#,
                &artifact_id,
                from,
            )
            .fetch_one(&pool)
            .await?;
            while next < size {
                let page = sqlx::query!(
                    "SELECT offset_bytes, data, object_key FROM artifact_chunks
                     WHERE artifact_id = $1 AND offset_bytes >= $2 AND offset_bytes < $3
                     ORDER BY offset_bytes LIMIT $4",
                    &artifact_id,
                    next,
                    size,
                    READ_PAGE_CHUNKS,
                )
                .fetch_all(&pool)
                .await?;
                if page.is_empty() {
                    break;
                }
                for chunk in page {
                    let (offset, data, key) = (chunk.offset_bytes, chunk.data, chunk.object_key);
                    let bytes = store.chunk(&artifact_id, data, key).await?;
                    next = offset + bytes.len() as i64;
                    let skip = (from - offset).clamp(0, bytes.len() as i64) as usize;
                    if skip < bytes.len() {
                        yield bytes.slice(skip..);
                    }
                }
            }
        }
    }

    /// One chunk's bytes: inline, or the object its row names.
    async fn chunk(
        &self,
        artifact_id: &str,
        data: Option<Vec<u8>>,
        key: Option<String>,
    ) -> Result<Bytes> {
        match (data, key) {
            (Some(data), _) => Ok(Bytes::from(data)),
            (None, Some(key)) => {
                let s3 = self.s3_for(artifact_id)?;
                let object = s3.client.get(&Path::from(key.as_str())).await;
                let bytes = match object {
                    Ok(object) => object.bytes().await,
                    Err(e) => Err(e),
                };
                bytes.map_err(|e| StoreError::Content(e.to_string()))
            }
            (None, None) => Err(StoreError::Content(format!(
                "a chunk of artifact {artifact_id} has neither data nor an object key"
            ))),
        }
    }

    fn s3_for(&self, artifact_id: &str) -> Result<&S3Content> {
        match self {
            ContentStore::S3(s3) => Ok(s3),
            ContentStore::Postgres => Err(StoreError::Content(format!(
                "artifact {artifact_id} is kept in S3, but this process has no S3 content \
                 store (set KEEL_CONTENT_STORE=s3 and KEEL_S3_*)"
            ))),
        }
    }
}

const POSTGRES: &str = "postgres";
const S3: &str = "s3";

fn storage_name(stored: &str) -> Result<&'static str> {
    match stored {
        POSTGRES => Ok(POSTGRES),
        S3 => Ok(S3),
        other => Err(StoreError::Content(format!(
            "unknown artifact storage {other:?}"
        ))),
    }
}

impl S3Content {
    /// Zero-padded offsets make a listing of an artifact's objects sort in byte order.
    fn key(&self, artifact_id: &str, offset: i64) -> String {
        let key = format!("artifacts/{artifact_id}/{offset:020}");
        if self.prefix.is_empty() {
            key
        } else {
            format!("{}/{key}", self.prefix)
        }
    }
}
