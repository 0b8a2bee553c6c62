//! The OpenAPI 3.1 document, built from the handlers' `#[utoipa::path]` annotations and
//! the types they take and return, served at `GET /v1/openapi.json`, with a reference page
//! at `/docs` that renders it in the browser with no third-party scripts.

use std::sync::OnceLock;

use axum::Json;
use axum::http::Method;
use axum::response::Html;
use keel_api_types::schema::NO_NUL;
use keel_api_types::{ErrorBody, ErrorEnvelope};
use utoipa::OpenApi as _;
use utoipa::openapi::link::LinkBuilder;
use utoipa::openapi::path::{Operation, Parameter};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{AdditionalProperties, ArrayItems, Schema, SchemaType, Type};
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{Content, OpenApi, OpenApiBuilder, Ref, RefOr};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::AppState;

/// Statuses any operation may answer with the error envelope.
const ERROR_STATUSES: [(&str, &str); 13] = [
    (
        "400",
        "The request is malformed (syntax, query string, headers).",
    ),
    (
        "401",
        "No valid credentials: the runtime token, or in remote mode the proxy's identity.",
    ),
    (
        "403",
        "The Host is not allowed, or the route is local-only and this request is not local.",
    ),
    ("404", "The resource or route does not exist."),
    ("405", "The method is not allowed on this path."),
    (
        "408",
        "The body did not arrive whole in time (KEEL_BODY_READ_TIMEOUT_SECS).",
    ),
    ("409", "The resource's state does not allow this now."),
    (
        "413",
        "The body is larger than 2 MiB, or the operation takes no body and one was sent.",
    ),
    ("415", "The body is not JSON."),
    (
        "429",
        "The caller's rate limit is spent, or a stream would be one more than an identity \
         may hold open; Retry-After says for how many seconds to wait.",
    ),
    (
        "422",
        "A field's value is not valid; the message names the field.",
    ),
    (
        "500",
        "Keel failed; details are in its log under the request id.",
    ),
    ("503", "Keel cannot reach its database."),
];

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Keel",
        description = "A durable runtime for long-running work on PostgreSQL: tasks, runs, approvals, media jobs and their events.",
        license(name = "Apache-2.0")
    ),
    tags(
        (name = "tasks", description = "Durable execution intent"),
        (name = "runs", description = "Attempts of a task, with steps and output"),
        (name = "approvals", description = "Human gates on runs"),
        (name = "schedules", description = "Once and cron triggers that start runs"),
        (name = "events", description = "Append-only event logs and live streams"),
        (name = "providers", description = "Provider presets and secret references"),
        (name = "media", description = "Image and video generation jobs"),
        (name = "external-work", description = "Tracker items polled and imported as tasks, driven by WORKFLOW.md"),
        (name = "usage", description = "Model calls of agent loop runs: tokens and cost"),
        (name = "system", description = "Health, diagnostics and the API contract")
    ),
    components(schemas(ErrorEnvelope, ErrorBody, keel_api_types::ProjectedEvent, keel_api_types::RunState))
)]
struct ApiDoc;

pub(crate) fn base() -> OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

/// The ways to authenticate a `/v1` request (any one of them): the runtime token in local
/// mode, and the trusted proxy's identity in remote mode.
fn security_schemes() -> [(&'static str, SecurityScheme); 4] {
    let header = |name: &str, description: &str| {
        let mut value = ApiKeyValue::new(name);
        value.description = Some(description.to_string());
        SecurityScheme::ApiKey(ApiKey::Header(value))
    };
    [
        (
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The runtime token (KEEL_RUNTIME_TOKEN)."))
                    .build(),
            ),
        ),
        (
            "runtime_token",
            header(
                "X-Keel-Runtime-Token",
                "The runtime token (KEEL_RUNTIME_TOKEN).",
            ),
        ),
        (
            "identity",
            header(
                "X-Keel-Identity",
                "Remote mode: a JWT signed by the trusted proxy (sub, org, aud, exp, iat).",
            ),
        ),
        (
            "remote_secret",
            header(
                "X-Keel-Remote-Secret",
                "Remote mode, header form: the proxy's shared secret, with X-Keel-Actor-Id, \
                 X-Keel-Org-Id, X-Keel-Runtime-Id and optionally X-Keel-Project-Id.",
            ),
        ),
    ]
}

/// Adds the security schemes, and the shared error responses to every operation.
pub(crate) fn finish(mut doc: OpenApi) -> OpenApi {
    forbid_nul_in_requests(&mut doc);
    let schemes = security_schemes();
    let requirements: Vec<SecurityRequirement> = schemes
        .iter()
        .map(|(name, _)| SecurityRequirement::new(*name, Vec::<String>::new()))
        .collect();
    let error = ResponseBuilder::new()
        .description("The error envelope")
        .content(
            "application/json",
            Content::new(Some(Ref::from_schema_name("ErrorEnvelope"))),
        )
        .build();
    let components = doc.components.get_or_insert_with(Default::default);
    components
        .responses
        .insert("Error".to_string(), RefOr::T(error));
    for (name, scheme) in schemes {
        components.add_security_scheme(name, scheme);
    }
    for (path, item) in doc.paths.paths.iter_mut() {
        let secured = path.starts_with("/v1/");
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            add_error_responses(operation);
            add_links(operation);
            if secured {
                operation.security = Some(requirements.clone());
            }
        }
    }
    OpenApiBuilder::from(doc).build()
}

/// The documented operations that take a request body (optional or not): their method and
/// path template.
pub(crate) fn operations_with_body(doc: &OpenApi) -> Vec<(Method, String)> {
    operations(doc)
        .filter(|(_, _, operation)| operation.request_body.is_some())
        .map(|(method, path, _)| (method, path.clone()))
        .collect()
}

/// Each operation of `doc`: its method, its path template and itself.
pub(crate) fn operations(
    doc: &OpenApi,
) -> impl Iterator<Item = (Method, &String, &utoipa::openapi::path::Operation)> {
    doc.paths.paths.iter().flat_map(|(path, item)| {
        [
            (Method::GET, &item.get),
            (Method::PUT, &item.put),
            (Method::POST, &item.post),
            (Method::DELETE, &item.delete),
            (Method::PATCH, &item.patch),
        ]
        .into_iter()
        .filter_map(move |(method, operation)| Some((method, path, operation.as_ref()?)))
    })
}

/// PostgreSQL cannot store a NUL character, so every string a request carries refuses
/// it: each string schema of a parameter or a request body (and of the components they
/// name) without a pattern, a format or an enum of its own gets one that says so (the
/// hand-written patterns exclude NUL themselves). Responses are left alone: an error
/// message may quote the input it refuses.
fn forbid_nul_in_requests(doc: &mut OpenApi) {
    let mut named = Vec::new();
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            for parameter in operation.parameters.iter_mut().flatten() {
                if let RefOr::T(Parameter {
                    schema: Some(schema),
                    ..
                }) = parameter
                {
                    forbid_nul(schema, &mut named);
                }
            }
            if let Some(RefOr::T(body)) = &mut operation.request_body {
                for content in body.content.values_mut() {
                    if let RefOr::T(Content {
                        schema: Some(schema),
                        ..
                    }) = content
                    {
                        forbid_nul(schema, &mut named);
                    }
                }
            }
        }
    }
    let Some(components) = doc.components.as_mut() else {
        return;
    };
    let mut done = std::collections::BTreeSet::new();
    while let Some(name) = named.pop() {
        if let (true, Some(schema)) = (done.insert(name.clone()), components.schemas.get_mut(&name))
        {
            forbid_nul(schema, &mut named);
        }
    }
}

/// Gives `schema`'s free-text strings the NUL-free pattern; collects the components it
/// names into `named`.
fn forbid_nul(schema: &mut RefOr<Schema>, named: &mut Vec<String>) {
    let schema = match schema {
        RefOr::Ref(reference) => {
            let name = reference
                .ref_location
                .rsplit('/')
                .next()
                .unwrap_or_default();
            named.push(name.to_string());
            return;
        }
        RefOr::T(schema) => schema,
    };
    let mut each = |schemas: &mut Vec<RefOr<Schema>>| {
        schemas.iter_mut().for_each(|s| forbid_nul(s, named));
    };
    match schema {
        Schema::Object(object) => {
            let free_text =
                object.pattern.is_none() && object.format.is_none() && object.enum_values.is_none();
            if free_text && is_string(&object.schema_type) {
                object.pattern = Some(NO_NUL.to_string());
            }
            object
                .properties
                .values_mut()
                .for_each(|s| forbid_nul(s, named));
            if let Some(AdditionalProperties::RefOr(values)) =
                object.additional_properties.as_deref_mut()
            {
                forbid_nul(values, named);
            }
        }
        Schema::Array(array) => {
            if let ArrayItems::RefOrSchema(items) = &mut array.items {
                forbid_nul(items, named);
            }
        }
        Schema::OneOf(one_of) => each(&mut one_of.items),
        Schema::AllOf(all_of) => each(&mut all_of.items),
        Schema::AnyOf(any_of) => each(&mut any_of.items),
        _ => {}
    }
}

fn is_string(schema_type: &SchemaType) -> bool {
    match schema_type {
        SchemaType::Type(kind) => *kind == Type::String,
        SchemaType::Array(kinds) => kinds.contains(&Type::String),
        SchemaType::AnyValue => false,
    }
}

/// Where a created task or run leads: OpenAPI links let clients (and stateful fuzzers)
/// follow create task → start it → read, cancel and inspect its run.
/// Parameters a link fills from the response: (parameter name, runtime expression).
type LinkParameters = &'static [(&'static str, &'static str)];

const LINKS: [(&str, &str, LinkParameters); 28] = [
    (
        "create_task",
        "get_task",
        &[("task_id", "$response.body#/data/id")],
    ),
    (
        "create_task",
        "start_task",
        &[("task_id", "$response.body#/data/id")],
    ),
    (
        "create_task",
        "list_runs",
        &[("task_id", "$response.body#/data/id")],
    ),
    (
        "create_task",
        "put_schedule",
        &[("task_id", "$response.body#/data/id")],
    ),
    (
        "create_task",
        "delete_task",
        &[("task_id", "$response.body#/data/id")],
    ),
    ("start_task", "get_run", RUN),
    ("start_task", "cancel_run", RUN),
    ("start_task", "list_steps", RUN),
    ("start_task", "list_artifacts", RUN),
    ("start_task", "list_run_events", RUN),
    ("start_task", "retry_run", RUN),
    (
        "start_task",
        "list_task_approvals",
        &[("task_id", "$response.body#/data/task_id")],
    ),
    ("cancel_run", "resume_run", RUN),
    ("put_schedule", "get_schedule", SCHEDULE),
    ("put_schedule", "list_occurrences", SCHEDULE),
    ("put_schedule", "delete_schedule", SCHEDULE),
    ("list_task_approvals", "get_approval", FIRST_APPROVAL),
    ("list_task_approvals", "resolve_approval", FIRST_APPROVAL),
    ("list_artifacts", "get_artifact", FIRST_ARTIFACT),
    ("list_artifacts", "artifact_content", FIRST_ARTIFACT),
    ("create_provider", "get_provider", PROVIDER),
    ("create_provider", "patch_provider", PROVIDER),
    ("create_provider", "check_provider", PROVIDER),
    ("create_provider", "delete_provider", PROVIDER),
    ("create_media_job", "get_media_job", MEDIA_JOB),
    ("create_media_job", "run_media_job", MEDIA_JOB),
    ("create_media_job", "cancel_media_job", MEDIA_JOB),
    ("create_media_job", "list_media_artifacts", MEDIA_JOB),
];
const PROVIDER: LinkParameters = &[("id", "$response.body#/data/id")];
const SCHEDULE: LinkParameters = &[("task_id", "$response.body#/data/task_id")];
/// From a page: the first item's identifiers.
const FIRST_APPROVAL: LinkParameters = &[
    ("task_id", "$response.body#/data/0/task_id"),
    ("approval_id", "$response.body#/data/0/id"),
];
const FIRST_ARTIFACT: LinkParameters = &[
    ("task_id", "$response.body#/data/0/task_id"),
    ("run_id", "$response.body#/data/0/run_id"),
    ("artifact_id", "$response.body#/data/0/id"),
];
const MEDIA_JOB: LinkParameters = &[("media_job_id", "$response.body#/data/id")];
const RUN: LinkParameters = &[
    ("task_id", "$response.body#/data/task_id"),
    ("run_id", "$response.body#/data/id"),
];

fn add_links(operation: &mut Operation) {
    let Some(source) = operation.operation_id.clone() else {
        return;
    };
    let Some(RefOr::T(created)) = operation
        .responses
        .responses
        .get_mut(success_status(&source))
    else {
        return;
    };
    for (_, target, parameters) in LINKS.iter().filter(|(from, _, _)| *from == source) {
        let link = parameters.iter().fold(
            LinkBuilder::new().operation_id(*target),
            |link, (name, value)| link.parameter(*name, *value),
        );
        created
            .links
            .insert(target.to_string(), RefOr::T(link.build()));
    }
}

fn success_status(operation_id: &str) -> &'static str {
    match operation_id {
        "create_task" | "start_task" | "create_provider" | "create_media_job" => "201",
        _ => "200",
    }
}

fn add_error_responses(operation: &mut Operation) {
    for (status, description) in ERROR_STATUSES {
        operation
            .responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| {
                let mut reference = Ref::from_response_name("Error");
                reference.description = description.to_string();
                RefOr::Ref(reference)
            });
    }
}

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(openapi_json))
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(get, path = "/openapi.json", tag = "system",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object)))]
async fn openapi_json() -> Json<&'static OpenApi> {
    Json(document())
}

/// The document, generated once per process.
fn document() -> &'static OpenApi {
    static DOC: OnceLock<OpenApi> = OnceLock::new();
    DOC.get_or_init(crate::api::openapi)
}

/// The reference page around the document: its one script and one style inline.
const REFERENCE_PAGE: &str = include_str!("reference.html");

/// A reference page for people, rendered in the browser from the document it carries (the
/// one `/v1/openapi.json` serves to callers with credentials): it runs its own inline
/// script and nothing else, loads nothing, is never sniffed as another type, and no other
/// page frames it.
pub(crate) async fn reference_page() -> impl axum::response::IntoResponse {
    use axum::http::header;
    let (page, policy) = reference();
    let headers = [
        (header::CONTENT_SECURITY_POLICY, policy.as_str()),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "same-origin"),
    ];
    (headers, Html(page.as_str()))
}

/// The page with the document in it, and its policy: its inline script and style by their
/// hashes, nothing else.
fn reference() -> &'static (String, String) {
    static PAGE: OnceLock<(String, String)> = OnceLock::new();
    PAGE.get_or_init(|| {
        let document = serde_json::to_string(document())
            .expect("the OpenAPI document serializes")
            // `</script>` in a description would end the data block early.
            .replace("</", "<\\/");
        let page = REFERENCE_PAGE.replace("{{DOCUMENT}}", &document);
        let script = inline_hash(&page, "<script>", "</script>");
        let style = inline_hash(&page, "<style>", "</style>");
        let policy = format!(
            "default-src 'none'; script-src '{script}'; style-src '{style}'; \
             img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        );
        (page, policy)
    })
}

/// `sha256-<base64>` of the text between `open` and `close` in `page`.
fn inline_hash(page: &str, open: &str, close: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    let start = page.find(open).map_or(0, |at| at + open.len());
    let end = page[start..]
        .find(close)
        .map_or(page.len(), |at| start + at);
    let digest = sha2::Sha256::digest(&page.as_bytes()[start..end]);
    format!(
        "sha256-{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}
