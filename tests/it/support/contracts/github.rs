//! GitHub's contract: the operations of its
//! published REST description that Keel calls (npm `@octokit/openapi`, dereferenced into
//! tests/fixtures/contracts/github-rest.json by `scripts/github-contract`). A request a
//! GitHub stand-in received conforms when it is one of those operations, its query names
//! only the operation's parameters with values their schemas take, and its body is valid
//! against the operation's request body schema (or empty when it has none).

use serde_json::Value;
use wiremock::Request;

const GITHUB_REST: &str = include_str!("../../../fixtures/contracts/github-rest.json");

/// Panics, naming the request and why, unless every one conforms to GitHub's description.
pub fn assert_github_conforms(requests: &[Request]) {
    let described: Value = serde_json::from_str(GITHUB_REST).unwrap();
    let operations = described["operations"].as_array().unwrap();
    for request in requests {
        let what = format!("{} {}", request.method, request.url);
        if let Err(why) = conforms(operations, request) {
            panic!("{what} is not as GitHub's REST description has it: {why}");
        }
    }
}

fn conforms(operations: &[Value], request: &Request) -> Result<(), String> {
    let path = request.url.path();
    let operation = operations
        .iter()
        .find(|op| {
            op["method"] == request.method.as_str() && matches(op["path"].as_str().unwrap(), path)
        })
        .ok_or("no operation of the description (or one Keel is not known to call)")?;
    let parameters = operation["parameters"].as_array().unwrap();
    for (name, value) in request.url.query_pairs() {
        let parameter = parameters
            .iter()
            .find(|p| p["in"] == "query" && p["name"] == name.as_ref())
            .ok_or_else(|| format!("query parameter {name} is not the operation's"))?;
        valid(&parameter["schema"], &typed(&parameter["schema"], &value))
            .map_err(|why| format!("query {name}={value}: {why}"))?;
    }
    match &operation["request_body"] {
        Value::Null if request.body.is_empty() => Ok(()),
        Value::Null => Err("a body, where the operation takes none".into()),
        schema => {
            let body: Value = serde_json::from_slice(&request.body)
                .map_err(|e| format!("the body is not JSON: {e}"))?;
            valid(schema, &body).map_err(|why| format!("body {body}: {why}"))
        }
    }
}

/// Whether a concrete path is of a template (`{name}` matches one non-empty segment).
fn matches(template: &str, path: &str) -> bool {
    let (template, path): (Vec<&str>, Vec<&str>) =
        (template.split('/').collect(), path.split('/').collect());
    template.len() == path.len()
        && template
            .iter()
            .zip(&path)
            .all(|(t, p)| (t.starts_with('{') && t.ends_with('}') && !p.is_empty()) || t == p)
}

/// A query value as its schema's type: a number where it takes an integer.
fn typed(schema: &Value, value: &str) -> Value {
    match schema["type"].as_str() {
        Some("integer") => value
            .parse::<i64>()
            .map_or_else(|_| value.into(), Value::from),
        _ => Value::String(value.to_string()),
    }
}

fn valid(schema: &Value, instance: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| e.to_string())?;
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| e.to_string())
        .collect();
    match errors.is_empty() {
        true => Ok(()),
        false => Err(errors.join("; ")),
    }
}

#[test]
fn a_request_outside_the_description_does_not_conform() {
    let described: Value = serde_json::from_str(GITHUB_REST).unwrap();
    let operations = described["operations"].as_array().unwrap();
    let request = |method: &str, url: &str, body: &str| Request {
        url: url.parse().unwrap(),
        method: method.parse().unwrap(),
        headers: Default::default(),
        body: body.as_bytes().to_vec(),
    };
    let pull = r#"{"title":"t","head":"keel/fix","base":"main","body":"b"}"#;
    let good = request("POST", "http://gh.test/repos/a/b/pulls", pull);
    assert_eq!(conforms(operations, &good), Ok(()));
    let review = request(
        "POST",
        "http://gh.test/repos/a/b/pulls/8/reviews",
        r#"{"event":"MERGE"}"#,
    );
    assert!(conforms(operations, &review).is_err());
    let title = request("POST", "http://gh.test/repos/a/b/pulls", r#"{"title":7}"#);
    assert!(conforms(operations, &title).is_err());
    let merge = request("PUT", "http://gh.test/repos/a/b/pulls/8/merge", "");
    assert!(conforms(operations, &merge).is_err());
    let query = request(
        "GET",
        "http://gh.test/repos/a/b/issues?state=everything",
        "",
    );
    assert!(conforms(operations, &query).is_err());
    let listed = request(
        "GET",
        "http://gh.test/repos/a/b/pulls?state=all&per_page=100&page=2",
        "",
    );
    assert_eq!(conforms(operations, &listed), Ok(()));
}
