//! keel-client's credentials stay with the API: a redirect to another origin is refused
//! instead of followed with `X-Keel-Identity` or `Authorization` attached, and one within
//! the API's origin is still followed. Two local wiremock servers stand in for the API and
//! for the host a redirect names.

use std::time::Duration;

use keel_client::{Client, Credentials, Error};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const TASKS: &str = r#"{"object":"list","data":[],"has_more":false,"next_cursor":null}"#;

fn redirect_to(location: String) -> ResponseTemplate {
    ResponseTemplate::new(307).insert_header("location", location)
}

#[tokio::test]
async fn credentials_are_not_sent_across_a_cross_origin_redirect() {
    let api = MockServer::start().await;
    let elsewhere = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/tasks"))
        .respond_with(redirect_to(format!("{}/v1/tasks", elsewhere.uri())))
        .mount(&api)
        .await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_string(TASKS))
        .mount(&elsewhere)
        .await;
    let credentials = [
        Credentials::Identity("signed.identity.jwt".into()),
        Credentials::RuntimeToken("runtime-token-0123456789".into()),
    ];
    for credential in credentials {
        let client = Client::new(&api.uri(), credential, Duration::from_secs(10)).unwrap();
        let refused = client.list_tasks(None).await.unwrap_err();
        assert!(matches!(refused, Error::Transport { .. }), "{refused:?}");
    }
    assert!(
        elsewhere.received_requests().await.unwrap().is_empty(),
        "the other host was reached"
    );
}

#[tokio::test]
async fn a_redirect_within_the_apis_origin_is_followed_with_the_credential() {
    let api = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/tasks"))
        .respond_with(redirect_to(format!("{}/moved/v1/tasks", api.uri())))
        .mount(&api)
        .await;
    Mock::given(method("GET"))
        .and(path("/moved/v1/tasks"))
        .and(wiremock::matchers::header(
            "x-keel-identity",
            "signed.identity.jwt",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_string(TASKS))
        .mount(&api)
        .await;
    let identity = Credentials::Identity("signed.identity.jwt".into());
    let client = Client::new(&api.uri(), identity, Duration::from_secs(10)).unwrap();
    let tasks = client.list_tasks(None).await.unwrap();
    assert!(tasks.data.is_empty());
}
