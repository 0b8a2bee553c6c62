//! One request to the API, built by an operation of [`Client`]: awaited it yields
//! the typed answer, [`Call::raw`] the answer's bytes unchanged, and on a list
//! [`Call::items`] every item of every page.

use std::borrow::Cow;
use std::future::{Future, IntoFuture};
use std::marker::PhantomData;
use std::pin::Pin;

use bytes::Bytes;
use futures_util::Stream;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

use crate::Client;
use crate::error::{ApiError, Error};
use crate::types::ListEnvelope;

/// A request whose answer is a `T`.
#[must_use = "a call does nothing until awaited"]
pub struct Call<'c, T> {
    client: &'c Client,
    method: Method,
    path: String,
    query: Vec<(Cow<'static, str>, String)>,
    body: Option<serde_json::Value>,
    headers: Vec<(Cow<'static, str>, String)>,
    /// The query parameter a list's `next_cursor` goes back in.
    cursor_param: &'static str,
    answer: PhantomData<fn() -> T>,
}

impl<'c, T> Call<'c, T> {
    pub(crate) fn new(client: &'c Client, method: Method, path: String) -> Self {
        Call {
            client,
            method,
            path,
            query: Vec::new(),
            body: None,
            headers: Vec::new(),
            cursor_param: "cursor",
            answer: PhantomData,
        }
    }

    /// A request whose route, parameters and body the caller knows at run time, not
    /// this crate: for bridges that pass the API's JSON through (`keel rpc`).
    pub(crate) fn route(
        client: &'c Client,
        method: Method,
        path: String,
        query: Vec<(String, String)>,
        headers: Vec<(String, String)>,
        body: Option<serde_json::Value>,
    ) -> Self {
        let owned = |pairs: Vec<(String, String)>| {
            pairs
                .into_iter()
                .map(|(name, value)| (Cow::Owned(name), value))
                .collect()
        };
        Call {
            query: owned(query),
            headers: owned(headers),
            body,
            ..Call::new(client, method, path)
        }
    }

    /// Adds a query parameter (none when `value` is None).
    pub fn query(mut self, name: &'static str, value: Option<impl ToString>) -> Self {
        if let Some(value) = value {
            self.query.push((name.into(), value.to_string()));
        }
        self
    }

    /// The request body, without its unset fields: the drafts' optional fields are null
    /// when unset, and the document's variants (a shell task's draft has no `prompt`) want
    /// them absent. Only a patch gives null a meaning of its own: see
    /// [`Call::json_keeping`].
    pub(crate) fn json(self, body: &impl serde::Serialize) -> Self {
        self.json_keeping(body, &[])
    }

    /// [`Call::json`], but a null in one of the `nullable` fields is sent: a patch's way
    /// of removing a value (a field the patch leaves alone is not serialized at all).
    pub(crate) fn json_keeping(mut self, body: &impl serde::Serialize, nullable: &[&str]) -> Self {
        let mut body = serde_json::to_value(body).expect("request bodies serialize");
        if let serde_json::Value::Object(fields) = &mut body {
            fields.retain(|name, value| !value.is_null() || nullable.contains(&name.as_str()));
        }
        self.body = Some(body);
        self
    }

    /// Adds a request header (for example `Idempotency-Key`).
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub(crate) fn cursor_param(mut self, name: &'static str) -> Self {
        self.cursor_param = name;
        self
    }

    pub(crate) fn url(&self) -> String {
        self.client.url(&self.path)
    }

    /// The request, without the per-request timeout (streams set none).
    pub(crate) fn request(&self) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .http
            .request(self.method.clone(), self.url())
            .query(&self.query);
        for (name, value) in &self.headers {
            request = request.header(name.as_ref(), value);
        }
        if let Some(body) = &self.body {
            request = request.json(body);
        }
        request
    }

    /// Sends the request; an error status becomes [`Error::Api`] with its envelope.
    pub(crate) async fn response(&self, timeout: bool) -> Result<reqwest::Response, Error> {
        let mut request = self.request();
        if timeout {
            request = request.timeout(self.client.timeout);
        }
        let response = request.send().await.map_err(|e| self.transport(e))?;
        checked(response, &self.url()).await
    }

    fn transport(&self, source: reqwest::Error) -> Error {
        Error::Transport {
            url: self.url(),
            source,
        }
    }

    /// The answer's body exactly as the server sent it.
    pub async fn raw(self) -> Result<Bytes, Error> {
        Ok(self.raw_with_status().await?.1)
    }

    /// [`Call::raw`] with the answer's status: for a caller that tells one success from
    /// another (200 from 206, or 201 from 200), as a test of the API does.
    pub async fn raw_with_status(self) -> Result<(StatusCode, Bytes), Error> {
        let response = self.response(true).await?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| self.transport(e))?;
        Ok((status, body))
    }

    /// The answer's body as a stream of chunks, without the request timeout: an
    /// artifact's content can be large, or still growing.
    pub async fn bytes_stream(
        self,
    ) -> Result<impl Stream<Item = Result<Bytes, Error>> + use<T>, Error> {
        use futures_util::TryStreamExt;
        let url = self.url();
        let response = self.response(false).await?;
        Ok(response
            .bytes_stream()
            .map_err(move |source| Error::Transport {
                url: url.clone(),
                source,
            }))
    }
}

impl Call<'_, ()> {
    /// The content's bytes after the first `offset` (the API's `offset` parameter): a
    /// reader that keeps its offset follows a growing artifact without reading anything
    /// twice, and the server skips what was read without sending it.
    pub async fn tail(self, offset: u64) -> Result<Bytes, Error> {
        self.query("offset", (offset > 0).then_some(offset))
            .raw()
            .await
    }
}

impl<T: DeserializeOwned> Call<'_, T> {
    /// Sends the request and reads the typed answer.
    pub async fn send(self) -> Result<T, Error> {
        Ok(self.fetch().await?.0)
    }

    /// The typed answer and the body it was read from, as the server sent it.
    pub async fn fetch(self) -> Result<(T, Bytes), Error> {
        let url = self.url();
        let body = self.raw().await?;
        Ok((decode(&url, &body)?, body))
    }

    /// The typed answer with the status it came with: every success is `Ok`, and this
    /// tells them apart (201 Created from 200 OK, 202 Accepted, 204 No Content).
    pub async fn send_with_status(self) -> Result<(StatusCode, T), Error> {
        let url = self.url();
        let (status, body) = self.raw_with_status().await?;
        Ok((status, decode(&url, &body)?))
    }
}

impl<'c, T: DeserializeOwned + 'c> IntoFuture for Call<'c, T> {
    type Output = Result<T, Error>;
    type IntoFuture = Pin<Box<dyn Future<Output = Self::Output> + Send + 'c>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.send())
    }
}

impl<'c, T: DeserializeOwned + 'c> Call<'c, ListEnvelope<T>> {
    /// Every item of the list, page after page, following `next_cursor` until the last.
    pub fn items(self) -> impl Stream<Item = Result<T, Error>> + 'c {
        use futures_util::stream::{self, TryStreamExt};
        let pages = stream::try_unfold(Some(self), |call| async move {
            let Some(call) = call else {
                return Ok(None);
            };
            let template = call.clone();
            let page: ListEnvelope<T> = call.send().await?;
            let next = page
                .next_cursor
                .clone()
                .filter(|_| page.has_more)
                .map(|cursor| {
                    let param = template.cursor_param;
                    let mut next = template;
                    next.query.retain(|(name, _)| name != param);
                    next.query.push((param.into(), cursor));
                    next
                });
            Ok(Some((page.data, next)))
        });
        pages
            .map_ok(|items| stream::iter(items.into_iter().map(Ok)))
            .try_flatten()
    }
}

impl<T> Clone for Call<'_, T> {
    fn clone(&self) -> Self {
        Call {
            client: self.client,
            method: self.method.clone(),
            path: self.path.clone(),
            query: self.query.clone(),
            body: self.body.clone(),
            headers: self.headers.clone(),
            cursor_param: self.cursor_param,
            answer: PhantomData,
        }
    }
}

/// The response when its status is a success; else its envelope as [`Error::Api`].
pub(crate) async fn checked(
    response: reqwest::Response,
    url: &str,
) -> Result<reqwest::Response, Error> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let request_id = response
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = response.bytes().await.map_err(|source| Error::Transport {
        url: url.to_string(),
        source,
    })?;
    Err(Error::Api(Box::new(ApiError::from_body(
        status.as_u16(),
        request_id,
        &body,
    ))))
}

/// A typed answer; an empty body (204) reads as JSON `null`, which `()` accepts.
fn decode<T: DeserializeOwned>(url: &str, body: &[u8]) -> Result<T, Error> {
    let body = if body.is_empty() {
        b"null".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| Error::Decode {
        url: url.to_string(),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use crate::{Client, Credentials, TaskDraft};

    #[test]
    fn unset_draft_fields_are_not_sent() {
        let client = Client::new(
            "http://127.0.0.1:1",
            Credentials::None,
            crate::DEFAULT_TIMEOUT,
        );
        let draft = TaskDraft {
            execution_kind: Some("shell".into()),
            shell_command: Some("echo hi".into()),
            ..TaskDraft::default()
        };
        let call = client.unwrap().create_task(&draft).body;
        let expected = serde_json::json!({ "execution_kind": "shell", "shell_command": "echo hi" });
        assert_eq!(call, Some(expected));
    }

    #[test]
    fn a_provider_patch_sends_the_null_that_removes_the_reference_only() {
        let client = Client::new(
            "http://127.0.0.1:1",
            Credentials::None,
            crate::DEFAULT_TIMEOUT,
        )
        .unwrap();
        let patch = crate::ProviderPatch {
            model: Some("m2".into()),
            api_key_ref: Some(None),
            ..crate::ProviderPatch::default()
        };
        let body = client.patch_provider("p", &patch).body;
        let expected = serde_json::json!({ "model": "m2", "api_key_ref": null });
        assert_eq!(body, Some(expected));
        let untouched = crate::ProviderPatch::default();
        let body = client.patch_provider("p", &untouched).body;
        assert_eq!(body, Some(serde_json::json!({})));
    }
}
