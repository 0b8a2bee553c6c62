//! One result written as an artifact: the record the metadata lists ([`Output`], with
//! where the bytes came from), its file name and content type, and the refusal of a result
//! over the size limit. Inline results and downloads both write these.

use super::{MediaArtifactKind, MediaErrorCode, MediaOutcome};

/// One artifact written, as the metadata artifact describes it.
pub(super) struct Output {
    pub name: String,
    pub kind: MediaArtifactKind,
    pub content_type: String,
    pub bytes: u64,
    pub source: SourceKind,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum SourceKind {
    B64Json,
    DataUrl,
    Url,
}

impl SourceKind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            SourceKind::B64Json => "b64_json",
            SourceKind::DataUrl => "data_url",
            SourceKind::Url => "url",
        }
    }
}

pub(super) fn too_large(max_bytes: u64) -> MediaOutcome {
    MediaOutcome::failed(
        MediaErrorCode::DownloadTooLarge,
        format!("the media is larger than the {max_bytes}-byte limit"),
    )
}

/// The content type from a file's leading bytes, for results that come without one.
pub(super) fn sniff(bytes: &[u8]) -> &'static str {
    match bytes {
        [0x89, b'P', b'N', b'G', ..] => "image/png",
        [0xFF, 0xD8, 0xFF, ..] => "image/jpeg",
        [b'G', b'I', b'F', b'8', ..] => "image/gif",
        [
            b'R',
            b'I',
            b'F',
            b'F',
            _,
            _,
            _,
            _,
            b'W',
            b'E',
            b'B',
            b'P',
            ..,
        ] => "image/webp",
        [_, _, _, _, b'f', b't', b'y', b'p', b'q', b't', ..] => "video/quicktime",
        [_, _, _, _, b'f', b't', b'y', b'p', ..] => "video/mp4",
        [0x1A, 0x45, 0xDF, 0xA3, ..] => "video/webm",
        _ => "application/octet-stream",
    }
}

pub(super) fn file_name(stem: &str, content_type: &str) -> String {
    let extension = match content_type {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "video/mp4" => "mp4",
        "video/quicktime" => "mov",
        "video/webm" => "webm",
        _ => "bin",
    };
    format!("{stem}.{extension}")
}
