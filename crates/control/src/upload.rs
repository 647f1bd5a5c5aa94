//! Reading a deploy's body: the component alone (`application/wasm`), or a
//! `multipart/form-data` form with a `module` part and a `params` part, each
//! bounded, with a refusal that names the part that is too large.
//!
//! It must not validate the module or its params: `sluice_runtime::validate` does.

use super::edge::{DRAIN_FOR, drain};
use super::error::ApiError;
use super::server::{ControlState, JSON_BODY_MAX_BYTES};
use axum::body::{Body, Bytes};
use axum::extract::multipart::{Field, MultipartError};
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{StatusCode, header};
use http_body_util::BodyExt;

/// A deploy's upload: the component and the params for `init`.
pub(super) struct Upload {
    pub component: Bytes,
    pub params: String,
}

/// Reads a deploy's body in either form, refusing a module over
/// `max_module_bytes` or params over `JSON_BODY_MAX_BYTES` by name.
pub(super) async fn read_upload(
    state: &ControlState,
    request: Request,
) -> Result<Upload, ApiError> {
    let limit = state.max_module_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("module is over the limit of {limit} bytes (control.max_module_bytes)"),
        )
    };
    let is_multipart = request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"multipart/form-data"));
    if !is_multipart {
        let component = read_limited(request.into_body(), limit)
            .await?
            .ok_or_else(too_large)?;
        return Ok(Upload {
            component,
            params: "{}".to_string(),
        });
    }
    let mut form = Multipart::from_request(request, &())
        .await
        .map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let (mut component, mut params) = (None, None);
    while let Some(field) = form.next_field().await.map_err(multipart_error)? {
        match field.name() {
            Some("module") => match read_part(field, limit).await? {
                Some(bytes) => component = Some(bytes),
                None => {
                    drain_form(&mut form).await;
                    return Err(too_large());
                }
            },
            Some("params") => {
                let bytes = read_part(field, JSON_BODY_MAX_BYTES)
                    .await?
                    .ok_or_else(|| {
                        ApiError::new(
                            StatusCode::PAYLOAD_TOO_LARGE,
                            format!("params are over the limit of {JSON_BODY_MAX_BYTES} bytes"),
                        )
                    })?;
                let text = String::from_utf8(bytes.to_vec()).map_err(|_| {
                    ApiError::new(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        "params are not UTF-8 text",
                    )
                })?;
                params = Some(text);
            }
            other => {
                return Err(ApiError::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "unknown form part {:?}: a deploy takes `module` and `params`",
                        other.unwrap_or("")
                    ),
                ));
            }
        }
    }
    let component = component.ok_or_else(|| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "the form has no `module` part (the component)",
        )
    })?;
    Ok(Upload {
        component,
        params: params.unwrap_or_else(|| "{}".to_string()),
    })
}

/// The whole body, or `None` if it is over `limit` bytes (the rest is
/// drained so the client reads the refusal).
async fn read_limited(mut body: Body, limit: usize) -> Result<Option<Bytes>, ApiError> {
    let mut bytes = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, format!("reading the body: {e}"))
        })?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        if bytes.len() + data.len() > limit {
            drain(body).await;
            return Ok(None);
        }
        bytes.extend_from_slice(data);
    }
    Ok(Some(bytes.into()))
}

/// Reads and drops the rest of a refused form (bounded by the route's body
/// limit and `DRAIN_FOR`), so the client reads the refusal.
async fn drain_form(form: &mut Multipart) {
    let draining = async {
        while let Ok(Some(mut field)) = form.next_field().await {
            while let Ok(Some(_)) = field.chunk().await {}
        }
    };
    let _ = tokio::time::timeout(DRAIN_FOR, draining).await;
}

/// One form part, or `None` if it is over `limit` bytes.
async fn read_part(mut field: Field<'_>, limit: usize) -> Result<Option<Bytes>, ApiError> {
    let mut bytes = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
        if bytes.len() + chunk.len() > limit {
            return Ok(None);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Some(bytes.into()))
}

fn multipart_error(e: MultipartError) -> ApiError {
    ApiError::new(e.status(), format!("reading the form: {}", e.body_text()))
}
