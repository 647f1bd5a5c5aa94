//! The edge of every control API request, before and after its handler:
//! a declared body over the endpoint's limit refused unread, every error
//! turned into the one JSON shape, and a connection whose request body may
//! be partly unread closed after the answer; plus draining a refused body
//! so the client reads the refusal.
//!
//! It must not know endpoints beyond their body limits.

use super::error::ApiError;
use super::server::{ControlState, JSON_BODY_MAX_BYTES, deploy_body_max};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use std::sync::Arc;
use std::time::Duration;

/// A refused request's unread body is read and dropped up to this much (and
/// for at most `DRAIN_FOR`) before the answer, so the client, still
/// sending, reads the refusal instead of a connection reset. Past it the
/// connection is closed.
const DRAIN_MAX_BYTES: usize = 64 * 1024 * 1024;
pub(super) const DRAIN_FOR: Duration = Duration::from_secs(5);

/// Reads and drops what is left of a refused request's body (bounded by
/// `DRAIN_MAX_BYTES` and `DRAIN_FOR`), so the client reads the refusal.
pub(super) async fn drain(body: Body) {
    let mut body = body;
    let mut left = DRAIN_MAX_BYTES;
    let reading = async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, Bytes::len);
            if n >= left {
                return;
            }
            left -= n;
        }
    };
    let _ = tokio::time::timeout(DRAIN_FOR, reading).await;
}

/// The edge of every request: refuses a declared body over the endpoint's
/// limit before the handler runs (drained, so the client reads the
/// answer), makes every error an `{"error": "..."}` JSON answer (axum's own
/// rejections, the request timeout and unknown routes answer in plain text
/// or not at all), and asks the client to close the connection after an
/// error to a request that carried a body: that body may be partly unread,
/// and the connection cannot serve another request.
pub(super) async fn edge(
    State(state): State<Arc<ControlState>>,
    request: Request,
    next: Next,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let had_body = request.headers().contains_key(header::TRANSFER_ENCODING)
        || declared.is_some_and(|n| n > 0);
    let limit = match request.uri().path() {
        "/v1/modules" => deploy_body_max(state.max_module_bytes),
        _ => JSON_BODY_MAX_BYTES,
    };
    let response = match declared {
        Some(n) if n > limit as u64 => {
            drain(request.into_body()).await;
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is {n} bytes, over this endpoint's limit of {limit} bytes"),
            )
            .into_response()
        }
        _ => next.run(request).await,
    };
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let mut response = as_json(response).await;
    if had_body {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// An error answer as `{"error": ...}` JSON, its text kept as the message.
async fn as_json(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        return response;
    }
    let status = response.status();
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let message = match text.is_empty() {
        true => status.canonical_reason().unwrap_or("error").to_lowercase(),
        false => text,
    };
    let mut rewritten = ApiError::new(status, message).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            rewritten.headers_mut().insert(name, value.clone());
        }
    }
    rewritten
}
