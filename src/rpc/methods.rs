//! The method table. Each bridged method names one API operation by its OpenAPI
//! `operationId`; its route and its params schema are read from the OpenAPI document the
//! API serves, so the RPC surface cannot drift from the API. The session's own methods
//! (`harness.methods`, `daemon.status`, `events.subscribe`, `events.unsubscribe`) are
//! described here too.

use std::collections::BTreeMap;

use reqwest::Method;
use serde_json::{Map, Value, json};

use crate::rpc::protocol::{RpcError, code};

/// RPC method → API operation. Adding a row is an additive change; renaming or removing
/// one breaks hosts.
const OPERATIONS: &[(&str, &str)] = &[
    ("tasks.create", "create_task"),
    ("tasks.list", "list_tasks"),
    ("tasks.get", "get_task"),
    ("tasks.delete", "delete_task"),
    ("tasks.start", "start_task"),
    ("runs.list", "list_runs"),
    ("runs.get", "get_run"),
    ("runs.cancel", "cancel_run"),
    ("runs.retry", "retry_run"),
    ("runs.resume", "resume_run"),
    ("runs.continue", "continue_run"),
    ("runs.events", "list_run_events"),
    ("runs.steps", "list_steps"),
    ("runs.artifacts", "list_artifacts"),
    ("runs.artifact", "get_artifact"),
    ("runs.artifactContent", "artifact_content"),
    ("runs.transcript", "get_transcript"),
    ("runs.context", "get_run_context"),
    ("approvals.list", "list_approvals"),
    ("approvals.listForTask", "list_task_approvals"),
    ("approvals.get", "get_approval"),
    ("approvals.resolve", "resolve_approval"),
    ("schedules.list", "list_schedules"),
    ("schedules.get", "get_schedule"),
    ("schedules.set", "put_schedule"),
    ("schedules.delete", "delete_schedule"),
    ("schedules.occurrences", "list_occurrences"),
    ("media.create", "create_media_job"),
    ("media.list", "list_media_jobs"),
    ("media.get", "get_media_job"),
    ("media.cancel", "cancel_media_job"),
    ("media.run", "run_media_job"),
    ("media.artifacts", "list_media_artifacts"),
    ("media.artifactContent", "media_artifact_content"),
    ("providers.list", "list_providers"),
    ("providers.get", "get_provider"),
    ("providers.check", "check_provider"),
    ("events.list", "list_feed"),
    ("system.stats", "system_stats"),
    ("system.whoami", "whoami"),
    ("usage.summary", "usage_summary"),
    ("usage.events", "usage_events"),
    ("runs.listAll", "list_workspace_runs"),
    ("runs.step", "get_step"),
    ("runs.retryFromModelCall", "retry_from_model_call"),
    ("runs.patches", "list_patches"),
    ("runs.patch", "get_patch"),
    ("runs.revertPatch", "revert_patch"),
    ("runs.applyPatch", "apply_patch"),
    ("runs.startClient", "start_client_run"),
    ("runs.append", "append_run_events"),
    ("runs.discardPatch", "discard_patch"),
    ("tasks.artifacts", "list_task_artifacts"),
    ("providers.create", "create_provider"),
    ("providers.update", "patch_provider"),
    ("providers.delete", "delete_provider"),
    ("providers.templates", "list_templates"),
    ("secrets.status", "secret_status"),
    ("externalWork.render", "render"),
    ("externalWork.sources.list", "list_sources"),
    ("externalWork.sources.create", "create_source"),
    ("externalWork.sources.get", "get_source"),
    ("externalWork.sources.delete", "delete_source"),
    ("externalWork.sources.status", "source_status"),
    ("externalWork.sources.poll", "poll_source"),
    ("externalWork.sources.reconcile", "reconcile_source"),
    ("externalWork.sources.background", "set_background"),
    ("externalWork.items.list", "list_items"),
    ("externalWork.items.get", "get_item"),
    ("externalWork.items.listAll", "list_work_items"),
    ("externalWork.import", "import"),
    ("externalWork.actions.propose", "propose_action"),
    ("externalWork.actions.list", "list_item_actions"),
    ("externalWork.actions.get", "get_action"),
    ("externalWork.actions.listAll", "list_actions"),
    ("externalWork.actions.execute", "execute_action"),
    ("externalWork.actions.cancel", "cancel_action"),
    ("externalWork.ci.triage", "triage_item"),
    ("externalWork.ci.scan", "get_triage_scan"),
    ("externalWork.ci.list", "list_triage"),
    ("externalWork.ci.get", "get_triage"),
    ("externalWork.ci.run", "start_fix_run"),
    ("transitions.list", "state_transitions"),
    ("runtime.leases", "runtime_leases"),
    ("system.throughput", "system_throughput"),
    ("system.shutdown", "shutdown"),
    ("workspace.get", "own_limits"),
    ("workspaces.limits", "get_limits"),
    ("workspaces.setLimits", "put_limits"),
    ("workspaces.policy", "get_policy"),
    ("workspaces.setPolicy", "put_policy"),
    ("workspaces.resetPolicy", "delete_policy"),
];

/// The API's operations no method bridges, each with why. The parity test fails on an
/// operation in neither list.
const NOT_BRIDGED: &[(&str, &str)] = &[
    (
        "healthz",
        "a process probe of the API's host, not of the workspace: daemon.status",
    ),
    (
        "readyz",
        "a process probe of the API's host, not of the workspace: daemon.status",
    ),
    (
        "openapi_json",
        "harness.methods describes every method with its params schema",
    ),
    (
        "stream_feed",
        "a server-sent event stream: events.subscribe pushes the feed",
    ),
    (
        "stream_run_events",
        "a server-sent event stream: events.subscribe pushes a run's",
    ),
];

/// Header parameters a host never sets through params: the streams own `Last-Event-ID`.
const HIDDEN_HEADERS: &[&str] = &["Last-Event-ID"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Location {
    Path,
    Query,
    Header,
}

/// One parameter of an operation, under the name a host uses in `params`.
#[derive(Debug, Clone)]
struct Param {
    /// The key in `params`: the API's name, or for a header its snake_case form
    /// (`Idempotency-Key` → `idempotency_key`).
    key: String,
    wire: String,
    location: Location,
    required: bool,
    schema: Value,
}

/// A bridged method: the API operation it sends.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    method: Method,
    path: String,
    description: String,
    params: Vec<Param>,
    /// The request body's schema, and whether the body is required.
    body: Option<(Value, bool)>,
    /// Whether its answer is bytes, not JSON (its 200 has no `application/json`).
    bytes: bool,
}

/// The HTTP request a method's params ask for.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Outbound {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) query: Vec<(String, String)>,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Option<Value>,
    /// Whether the API answers bytes (an artifact's content), not JSON.
    pub(crate) bytes: bool,
}

impl Outbound {
    /// A GET without params.
    pub fn get(path: &str) -> Outbound {
        Outbound {
            method: Method::GET,
            path: path.to_string(),
            query: Vec::new(),
            headers: Vec::new(),
            body: None,
            bytes: false,
        }
    }
}

/// Every method a session answers.
#[derive(Debug)]
pub(crate) struct Table {
    routes: BTreeMap<&'static str, Route>,
    /// The document's component schemas, which the params schemas `$ref`.
    components: Value,
}

impl Table {
    /// The table over `document` (the API's OpenAPI document as JSON).
    ///
    /// # Panics
    /// When the document lacks an operation the table names: the two are built together,
    /// and a test builds the table from the real document.
    pub(crate) fn new(document: &Value) -> Table {
        let operations = operations_by_id(document);
        let routes = OPERATIONS
            .iter()
            .map(|&(name, operation_id)| {
                let (method, path, operation) = operations
                    .get(operation_id)
                    .unwrap_or_else(|| panic!("the API has no operation {operation_id}"));
                (name, Route::new(method, path, operation))
            })
            .collect();
        let components = json!({ "schemas": document["components"]["schemas"] });
        Table { routes, components }
    }

    pub(crate) fn route(&self, name: &str) -> Option<&Route> {
        self.routes.get(name)
    }

    /// `harness.methods`: every method with its params schema. Schemas `$ref`
    /// `#/components/schemas/…` of this same answer.
    pub(crate) fn describe(&self) -> Value {
        let mut methods: Vec<Value> = own_methods();
        methods.extend(self.routes.iter().map(|(name, route)| {
            json!({
                "name": name,
                "description": route.description,
                "http": format!("{} {}", route.method, route.path),
                "params": route.params_schema(),
            })
        }));
        let not_bridged: Vec<Value> = NOT_BRIDGED
            .iter()
            .map(|(operation, reason)| json!({ "operation": operation, "reason": reason }))
            .collect();
        json!({ "methods": methods, "components": self.components, "not_bridged": not_bridged })
    }
}

/// operationId → (method, path, operation object).
fn operations_by_id(document: &Value) -> BTreeMap<String, (Method, String, Value)> {
    let mut found = BTreeMap::new();
    let Some(paths) = document["paths"].as_object() else {
        return found;
    };
    for (path, item) in paths {
        for (method, operation) in item.as_object().into_iter().flatten() {
            let (Ok(method), Some(id)) = (
                Method::from_bytes(method.to_ascii_uppercase().as_bytes()),
                operation["operationId"].as_str(),
            ) else {
                continue;
            };
            found.insert(id.to_string(), (method, path.clone(), operation.clone()));
        }
    }
    found
}

impl Route {
    fn new(method: &Method, path: &str, operation: &Value) -> Route {
        let params = operation["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Param::new)
            .collect();
        let body = operation.get("requestBody").map(|body| {
            let schema = body["content"]["application/json"]["schema"].clone();
            (schema, body["required"].as_bool().unwrap_or(false))
        });
        let description = [&operation["summary"], &operation["description"]]
            .into_iter()
            .find_map(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let bytes = operation["responses"]["200"]["content"]
            .as_object()
            .is_some_and(|content| !content.contains_key("application/json"));
        Route {
            method: method.clone(),
            path: path.to_string(),
            description,
            params,
            body,
            bytes,
        }
    }

    fn params_schema(&self) -> Value {
        let mut properties = Map::new();
        let mut required = Vec::new();
        for param in &self.params {
            properties.insert(param.key.clone(), param.schema.clone());
            if param.required {
                required.push(json!(param.key));
            }
        }
        if let Some((schema, body_required)) = &self.body {
            properties.insert("body".into(), schema.clone());
            if *body_required {
                required.push(json!("body"));
            }
        }
        json!({
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": false,
        })
    }

    /// The request `params` ask for; what the API itself checks (the body's fields, an
    /// id's format) it answers itself.
    pub(crate) fn outbound(&self, mut params: Map<String, Value>) -> Result<Outbound, RpcError> {
        let mut outbound = Outbound {
            method: self.method.clone(),
            path: self.path.clone(),
            query: Vec::new(),
            headers: Vec::new(),
            body: None,
            bytes: self.bytes,
        };
        for param in &self.params {
            let Some(value) = params.remove(&param.key).filter(|v| !v.is_null()) else {
                if param.required {
                    return Err(invalid(format!("`{}` is required", param.key)));
                }
                continue;
            };
            let value = scalar(&param.key, value)?;
            match param.location {
                Location::Path => {
                    let placeholder = format!("{{{}}}", param.wire);
                    outbound.path = outbound
                        .path
                        .replace(&placeholder, &keel_client::segment(&value));
                }
                Location::Query => outbound.query.push((param.wire.clone(), value)),
                Location::Header => outbound.headers.push((param.wire.clone(), value)),
            }
        }
        match (&self.body, params.remove("body")) {
            (Some(_), Some(body)) if !body.is_null() => outbound.body = Some(body),
            (Some((_, true)), _) => return Err(invalid("`body` is required".to_string())),
            (None, Some(_)) => return Err(invalid("this method takes no `body`".to_string())),
            _ => {}
        }
        if let Some(unknown) = params.keys().next() {
            return Err(invalid(format!(
                "unknown param `{unknown}`; harness.methods lists this method's params"
            )));
        }
        Ok(outbound)
    }
}

impl Param {
    fn new(parameter: &Value) -> Option<Param> {
        let wire = parameter["name"].as_str()?.to_string();
        let location = match parameter["in"].as_str()? {
            "path" => Location::Path,
            "query" => Location::Query,
            "header" if !HIDDEN_HEADERS.contains(&wire.as_str()) => Location::Header,
            _ => return None,
        };
        let key = match location {
            Location::Header => wire.to_ascii_lowercase().replace('-', "_"),
            _ => wire.clone(),
        };
        let mut schema = parameter["schema"].clone();
        if let (Some(description), Some(object)) =
            (parameter["description"].as_str(), schema.as_object_mut())
        {
            object.insert("description".into(), json!(description));
        }
        Some(Param {
            key,
            wire,
            required: location == Location::Path || parameter["required"] == json!(true),
            location,
            schema,
        })
    }
}

fn invalid(message: String) -> RpcError {
    RpcError::new(code::INVALID_PARAMS, message)
}

/// A path, query or header value: a string, number or boolean.
fn scalar(key: &str, value: Value) -> Result<String, RpcError> {
    match value {
        Value::String(value) => Ok(value),
        Value::Number(value) => Ok(value.to_string()),
        Value::Bool(value) => Ok(value.to_string()),
        _ => Err(invalid(format!("`{key}` is a string, number or boolean"))),
    }
}

/// The methods a session answers itself.
fn own_methods() -> Vec<Value> {
    let object = |properties: Value, required: Value| {
        json!({"type": "object", "properties": properties, "required": required,
               "additionalProperties": false})
    };
    let id = json!({"type": "string"});
    vec![
        json!({"name": "harness.methods", "description": "Every method with its params schema.",
               "params": object(json!({}), json!([]))}),
        json!({"name": "daemon.status",
               "description": "This RPC server: its pid, when it started, and whether the Keel API answers.",
               "params": object(json!({}), json!([]))}),
        json!({"name": "events.subscribe",
               "description": "Pushes events as the API persists them, as {v, subscription, event} lines: \
                               one run's events (task_id and run_id), or the feed (optionally one media job's). \
                               Answers {subscription}. A run's subscription ends with the run \
                               (a subscription.ended notice).",
               "params": object(json!({
                   "task_id": id, "run_id": id, "media_job_id": id,
                   "after": {"type": "string", "description": "Resume after this event id (the feed) or sequence (a run)."}
               }), json!([]))}),
        json!({"name": "events.unsubscribe", "description": "Stops a subscription of this session.",
               "params": object(json!({"subscription": id}), json!(["subscription"]))}),
    ]
}

/// A method the session answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Own {
    Methods,
    Status,
    Subscribe,
    Unsubscribe,
}

impl Own {
    pub(crate) fn named(name: &str) -> Option<Own> {
        match name {
            "harness.methods" => Some(Own::Methods),
            "daemon.status" => Some(Own::Status),
            "events.subscribe" => Some(Own::Subscribe),
            "events.unsubscribe" => Some(Own::Unsubscribe),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Table {
        let document = serde_json::to_value(crate::api::openapi()).expect("the document");
        Table::new(&document)
    }

    #[test]
    fn every_method_names_an_operation_of_the_api() {
        let described = table().describe();
        let names: Vec<&str> = described["methods"]
            .as_array()
            .expect("methods")
            .iter()
            .filter_map(|m| m["name"].as_str())
            .collect();
        assert_eq!(names.len(), OPERATIONS.len() + 4);
        let create = described["methods"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "tasks.create")
            .expect("tasks.create");
        assert_eq!(create["http"], "POST /v1/tasks");
        assert!(create["params"]["properties"]["body"].is_object());
        assert!(described["components"]["schemas"].is_object());
    }

    /// Every operation of the API is a method, or is in [`NOT_BRIDGED`] with its reason.
    #[test]
    fn every_operation_of_the_api_is_bridged_or_excluded_with_a_reason() {
        let document = serde_json::to_value(crate::api::openapi()).expect("the document");
        let bridged: Vec<&str> = OPERATIONS.iter().map(|(_, op)| *op).collect();
        let excluded: Vec<&str> = NOT_BRIDGED.iter().map(|(op, _)| *op).collect();
        let missing: Vec<String> = operations_by_id(&document)
            .into_keys()
            .filter(|op| !bridged.contains(&op.as_str()) && !excluded.contains(&op.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "operations no RPC method bridges: {missing:?}"
        );
        for op in excluded {
            assert!(!bridged.contains(&op), "{op} is both bridged and excluded");
        }
    }

    #[test]
    fn params_become_the_request() {
        let table = table();
        let start = table.route("tasks.start").expect("tasks.start");
        let params = json!({"task_id": "task/../x", "idempotency_key": "k1", "body": {}});
        let outbound = start
            .outbound(params.as_object().unwrap().clone())
            .expect("a request");
        assert_eq!(outbound.method, Method::POST);
        assert_eq!(outbound.path, "/v1/tasks/task%2F..%2Fx/start");
        assert_eq!(
            outbound.headers,
            vec![("Idempotency-Key".into(), "k1".into())]
        );
        assert_eq!(outbound.body, Some(json!({})));

        let list = table.route("tasks.list").expect("tasks.list");
        let params = json!({"limit": 5, "status": "queued"});
        let outbound = list
            .outbound(params.as_object().unwrap().clone())
            .expect("a request");
        assert!(outbound.query.contains(&("limit".into(), "5".into())));

        let refused = |route: &Route, params: Value| {
            route
                .outbound(params.as_object().unwrap().clone())
                .expect_err("refused")
                .code
        };
        assert_eq!(refused(start, json!({})), "invalid_params");
        assert_eq!(refused(list, json!({"nope": 1})), "invalid_params");
        assert_eq!(refused(list, json!({"body": {}})), "invalid_params");
        assert_eq!(refused(list, json!({"limit": {"a": 1}})), "invalid_params");
    }
}
