//! The artifact list that `keel runs artifacts`, `keel tasks artifacts` and `keel media
//! artifacts` print, each from its own route.

use keel_client::{ArtifactRecord, Call, Error};

use crate::cli::output;
use crate::cli::output::{Format, PageArgs, or_dash};

/// A list of artifacts: a run's, a task's or a media job's.
pub(super) async fn list(
    format: Format,
    page: &PageArgs,
    call: Call<'_, keel_client::ListEnvelope<ArtifactRecord>>,
) -> Result<(), Error> {
    let headers = ["ID", "NAME", "KIND", "TYPE", "BYTES", "STATUS", "RUN"];
    output::list(format, page, call, &headers, |a: &ArtifactRecord| {
        vec![
            a.id.clone(),
            a.name.clone(),
            a.kind.to_string(),
            a.content_type.clone(),
            a.size_bytes.to_string(),
            a.status.to_string(),
            or_dash(a.run_id.as_ref()),
        ]
    })
    .await
}
