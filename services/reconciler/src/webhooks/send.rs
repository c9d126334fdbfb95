//! One webhook request: the CloudEvent in the HTTP binding's binary mode (`ce-*` headers, the
//! data as the body), signed as Standard Webhooks (`webhook-id`, `webhook-timestamp`,
//! `webhook-signature`), sent with no redirects and a timeout, its answer read up to
//! [`MAX_ANSWER_BYTES`]. Nothing here logs the key, the signature or the URL.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, USER_AGENT};
use reqwest::{Client, Url};
use sluice_connector::credentials::{
    WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP, webhook_signature,
};
use sluice_core::time::Timestamp;
use sluice_core::webhook::{Attempt, TEST_EVENT_TYPE, WebhookEvent};

/// Most of a receiver's answer read back; the rest is left unread.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// The client every delivery is sent with: no redirects (a 3xx is an answer, not a new
/// destination the signature was not meant for), connections kept alive between attempts.
pub fn client() -> Result<Client, String> {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| format!("cannot build the webhook HTTP client: {e}"))
}

/// What a receiver answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    /// The start of the body, as text.
    pub body: String,
}

impl Answer {
    pub fn attempt(self) -> Attempt {
        Attempt::Answered {
            status: self.status,
            detail: self.body,
        }
    }
}

/// A CloudEvents attribute value as an HTTP header: printable ASCII but `"` and `%` as they
/// are, everything else percent-encoded as UTF-8 (the HTTP binding, 3.1.3.2).
fn header_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'"' && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The request's headers: the event's attributes as `ce-<name>`, its content type, and the
/// Standard Webhooks signature over `id.timestamp.body`.
fn headers(event: &WebhookEvent, key: &[u8], timestamp: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &event.attributes {
        let Ok(name) = HeaderName::from_bytes(format!("ce-{name}").as_bytes()) else {
            continue;
        };
        if let Ok(value) = HeaderValue::from_str(&header_value(value)) {
            headers.insert(name, value);
        }
    }
    let content_type = event.content_type.as_deref().unwrap_or("application/json");
    if let Ok(value) = HeaderValue::from_str(content_type) {
        headers.insert(CONTENT_TYPE, value);
    }
    let id = event.id();
    let signature = webhook_signature(&[key.to_vec()], id, timestamp, event.data.as_bytes());
    for (name, value) in [
        (WEBHOOK_ID, id.to_owned()),
        (WEBHOOK_TIMESTAMP, timestamp.to_string()),
        (WEBHOOK_SIGNATURE, signature),
    ] {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    headers.insert(
        USER_AGENT,
        HeaderValue::from_static(concat!("sluice-webhooks/", env!("CARGO_PKG_VERSION"))),
    );
    headers
}

/// Posts `event` to `url`, signed with `key`; the answer, or why none came (the URL left out
/// of the error: it may hold a token).
pub async fn post(
    client: &Client,
    url: &Url,
    key: &[u8],
    event: &WebhookEvent,
    timeout: Duration,
) -> Result<Answer, String> {
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let mut response = client
        .post(url.clone())
        .headers(headers(event, key, timestamp))
        .body(event.data.clone())
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| describe(&e))?;
    let status = response.status().as_u16();
    let mut body = Vec::new();
    while body.len() < MAX_ANSWER_BYTES {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            Ok(None) => break,
            // The status is what counts; a body cut short is still an answer.
            Err(_) => break,
        }
    }
    body.truncate(MAX_ANSWER_BYTES);
    Ok(Answer {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

/// One attempt's outcome, for the core to judge.
pub async fn attempt(
    client: &Client,
    url: &Url,
    key: &[u8],
    event: &WebhookEvent,
    timeout: Duration,
) -> Attempt {
    match post(client, url, key, event, timeout).await {
        Ok(answer) => answer.attempt(),
        Err(error) => Attempt::NoAnswer { error },
    }
}

fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "failed"
    };
    let mut text = format!("the request {kind}");
    // The source chain says why (refused, reset, DNS), without the URL `Display` would add.
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The event `sluice webhooks test` sends: type [`TEST_EVENT_TYPE`], a fresh id.
pub fn test_event(webhook: &str, now: Timestamp) -> WebhookEvent {
    let mut attributes = BTreeMap::new();
    attributes.insert("specversion".into(), "1.0".into());
    attributes.insert("id".into(), uuid::Uuid::new_v4().to_string());
    attributes.insert("source".into(), "/sluice/cli".into());
    attributes.insert("type".into(), TEST_EVENT_TYPE.into());
    attributes.insert("subject".into(), webhook.into());
    attributes.insert("time".into(), now.to_string());
    WebhookEvent {
        attributes,
        content_type: Some("application/json".into()),
        data: serde_json::json!({
            "webhook": webhook,
            "message": "a test event from `sluice webhooks test`: nothing happened",
        })
        .to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_values_are_percent_encoded_where_http_needs_it() {
        assert_eq!(header_value("run-1/d-1/pay/wire/0"), "run-1/d-1/pay/wire/0");
        assert_eq!(header_value("50% \"ü\""), "50%25 %22%C3%BC%22");
    }

    #[test]
    fn the_signature_covers_id_timestamp_and_body() {
        let event = test_event("ops", Timestamp::from_millis(0));
        let key = vec![7u8; 32];
        let headers = headers(&event, &key, 1_700_000_000);
        let expected = webhook_signature(&[key], event.id(), 1_700_000_000, event.data.as_bytes());
        assert_eq!(headers[WEBHOOK_SIGNATURE], expected.as_str());
        assert_eq!(headers[WEBHOOK_ID], event.id());
        assert_eq!(headers["ce-type"], TEST_EVENT_TYPE);
        assert_eq!(headers["ce-specversion"], "1.0");
        assert_eq!(headers[CONTENT_TYPE], "application/json");
    }
}
