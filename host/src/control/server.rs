//! The control plane's HTTP API (axum), served by `sluice run`: deploy
//! (upload + validate + optionally activate), versions, activate, rollback,
//! status, and its OpenAPI description.
//!
//! Every write needs `Authorization: Bearer <token>`; with no token
//! configured, writes are refused. A rejected upload stores nothing. It must
//! not touch batches: a version reaches the pipelines through the module
//! store, which every instance reads between batches.

use crate::modules::{ModuleStore, Rejected, StoreError, validate};
use crate::pipeline::StatusBoard;
use crate::runtime::Runtime;
use axum::body::{Body, Bytes};
use axum::extract::multipart::{Field, MultipartError};
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tower_http::timeout::TimeoutLayer;

/// The OpenAPI 3 description of this API, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// What the handlers share.
pub struct ControlState {
    pub pipeline: String,
    pub store: Arc<ModuleStore>,
    pub runtime: Arc<Runtime>,
    pub cache_dir: Option<PathBuf>,
    /// The write token; `None` refuses every write.
    pub token: Option<String>,
    pub max_module_bytes: usize,
    pub status: StatusBoard,
    /// Deploys and activations validated at once (see
    /// [`MAX_PARALLEL_VALIDATIONS`]); the others wait their turn.
    pub validations: tokio::sync::Semaphore,
}

/// Validations (compile + `init` in an instance) that run at once. Each
/// takes an instance slot from the pool that batches use (64 slots) and
/// cores from the serving host, so a burst of deploys queues here instead
/// of starving batches or failing for want of a slot.
pub const MAX_PARALLEL_VALIDATIONS: usize = 2;

/// How long the control API may take to answer one request, body upload
/// and validation included, and how many connections it keeps open.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    pub request_timeout: Duration,
    pub max_connections: usize,
}

/// Serves the API on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ControlState>,
    limits: ServeLimits,
    shutdown: CancellationToken,
) {
    let app = router(state, limits.request_timeout);
    super::listen::serve(listener, app, limits.max_connections, shutdown).await;
}

/// Largest body of a JSON request (activate): params included.
pub const JSON_BODY_MAX_BYTES: usize = 1024 * 1024;

/// A refused request's unread body is read and dropped up to this much (and
/// for at most `DRAIN_FOR`) before the answer, so the client, still
/// sending, reads the refusal instead of a connection reset. Past it the
/// connection is closed.
const DRAIN_MAX_BYTES: usize = 64 * 1024 * 1024;
const DRAIN_FOR: Duration = Duration::from_secs(5);

/// The routes; writes behind the bearer-token check; every error answered
/// as JSON.
pub fn router(state: Arc<ControlState>, request_timeout: Duration) -> Router {
    let deploy_body_max = deploy_body_max(state.max_module_bytes);
    let writes = Router::new()
        .route(
            "/v1/modules",
            post(deploy).layer(DefaultBodyLimit::max(deploy_body_max)),
        )
        .route("/v1/activate", post(activate))
        .route("/v1/rollback", post(rollback))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            require_token,
        ));
    Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/status", get(status))
        .route("/v1/versions", get(versions))
        .merge(writes)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(JSON_BODY_MAX_BYTES))
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            request_timeout,
        ))
        .layer(middleware::from_fn_with_state(Arc::clone(&state), edge))
        .with_state(state)
}

/// A deploy's body: the module, its params and multipart framing (the
/// handler says which part is too large).
fn deploy_body_max(max_module_bytes: usize) -> usize {
    max_module_bytes + JSON_BODY_MAX_BYTES + 64 * 1024
}

/// An error answer: a status and a message a user can act on.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            Json(ErrorBody {
                error: &self.message,
            }),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let status = match &e {
            StoreError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            StoreError::UnknownModule(_) => StatusCode::NOT_FOUND,
            StoreError::NothingToRollBack(_) => StatusCode::CONFLICT,
            StoreError::Database(_) | StoreError::Config(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::new(status, e.to_string())
    }
}

impl From<Rejected> for ApiError {
    fn from(e: Rejected) -> Self {
        let status = match &e {
            Rejected::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Rejected::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        ApiError::new(status, e.to_string())
    }
}

/// Refuses a write without the configured bearer token (401), before its
/// body is looked at (it is drained, not parsed).
async fn require_token(
    State(state): State<Arc<ControlState>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if state.token.is_none() {
        drain(request.into_body()).await;
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "writes are disabled: no control token is configured (set SLUICE_CONTROL_TOKEN or \
             control.token on the host)",
        ));
    }
    if !authorized(&state, request.headers()) {
        drain(request.into_body()).await;
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token (Authorization: Bearer <token>)",
        ));
    }
    Ok(next.run(request).await)
}

/// True if `headers` carry the configured token.
fn authorized(state: &ControlState, headers: &HeaderMap) -> bool {
    let Some(expected) = state.token.as_deref() else {
        return false;
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compare digests so the time taken says nothing about the token.
    given.is_some_and(|g| {
        crate::batch::sha256_hex(g.as_bytes()) == crate::batch::sha256_hex(expected.as_bytes())
    })
}

/// Reads and drops what is left of a refused request's body (bounded by
/// `DRAIN_MAX_BYTES` and `DRAIN_FOR`), so the client reads the refusal.
async fn drain(body: Body) {
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
async fn edge(State(state): State<Arc<ControlState>>, request: Request, next: Next) -> Response {
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

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {}", uri.path()),
    )
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

async fn status(
    State(state): State<Arc<ControlState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let active = state.store.active(&state.pipeline).await?;
    let running = state.status.snapshot();
    let answer = serde_json::json!({ "active": active, "running": running });
    Ok(Json(readable(&state, &headers, answer)).into_response())
}

async fn versions(
    State(state): State<Arc<ControlState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let summary = state.store.summary(&state.pipeline).await?;
    let history = state.store.history(&state.pipeline).await?;
    let answer = serde_json::json!({ "versions": summary, "history": history });
    Ok(Json(readable(&state, &headers, answer)).into_response())
}

/// Params may hold secrets: a reader without the token sees their digest
/// only (`params` is left out of every version).
fn readable(state: &ControlState, headers: &HeaderMap, mut answer: Value) -> Value {
    if !authorized(state, headers) {
        hide_params(&mut answer);
    }
    answer
}

fn hide_params(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            if fields.contains_key("params_digest") {
                fields.remove("params");
            }
            fields.values_mut().for_each(hide_params);
        }
        Value::Array(items) => items.iter_mut().for_each(hide_params),
        _ => {}
    }
}

/// `POST /v1/modules?activate=true`; the body is the component
/// (`application/wasm`), or `multipart/form-data` with a `module` part (the
/// component) and a `params` part (JSON for `init`; default `{}`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployQuery {
    /// Make the uploaded module the active version.
    #[serde(default)]
    activate: bool,
    /// Refused: params travel in the body (a query string is logged by
    /// proxies and is limited in length).
    #[serde(default)]
    params: Option<String>,
}

/// What a deploy stored (and activated).
#[derive(Debug, Serialize)]
struct Deployed {
    module_digest: String,
    size: usize,
    validate_ms: u64,
    activated: Option<crate::modules::Version>,
}

/// A deploy's upload: the component and the params for `init`.
struct Upload {
    component: Bytes,
    params: String,
}

async fn deploy(
    State(state): State<Arc<ControlState>>,
    Query(query): Query<DeployQuery>,
    request: Request,
) -> Result<Response, ApiError> {
    if query.params.is_some() {
        drain(request.into_body()).await;
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "params are not accepted in the query string (they may hold secrets): send a \
             multipart/form-data body with a `module` part and a `params` part",
        ));
    }
    let upload = read_upload(&state, request).await?;
    let validate_ms = check(&state, upload.component.clone(), upload.params.clone()).await?;
    let module_digest = state.store.put(&upload.component).await?;
    let activated = match query.activate {
        true => Some(
            state
                .store
                .activate(&state.pipeline, &module_digest, &upload.params, "activate")
                .await?,
        ),
        false => None,
    };
    let size = upload.component.len();
    tracing::info!(module = %module_digest, size, validate_ms, "module deployed");
    let deployed = Deployed {
        module_digest,
        size,
        validate_ms,
        activated,
    };
    Ok((StatusCode::CREATED, Json(deployed)).into_response())
}

/// Reads a deploy's body in either form, refusing a module over
/// `max_module_bytes` or params over `JSON_BODY_MAX_BYTES` by name.
async fn read_upload(state: &ControlState, request: Request) -> Result<Upload, ApiError> {
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

/// Validates on a blocking thread (compiling is CPU-bound); returns the ms.
async fn check(
    state: &Arc<ControlState>,
    component: Bytes,
    params: String,
) -> Result<u64, ApiError> {
    let _turn =
        state.validations.acquire().await.map_err(|_| {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the host is shutting down")
        })?;
    let state = Arc::clone(state);
    tokio::task::spawn_blocking(move || {
        let started = Instant::now();
        validate(
            &state.runtime,
            &component,
            &params,
            state.max_module_bytes,
            state.cache_dir.as_deref(),
        )?;
        Ok(started.elapsed().as_millis() as u64)
    })
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("validation: {e}"),
        )
    })?
}

/// `POST /v1/activate`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ActivateRequest {
    /// sha256 of a stored module.
    module_digest: String,
    /// Params for `init`; default `{}`.
    #[serde(default)]
    params: Option<serde_json::Value>,
}

async fn activate(
    State(state): State<Arc<ControlState>>,
    Json(request): Json<ActivateRequest>,
) -> Result<Response, ApiError> {
    let digest = &request.module_digest;
    if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "module_digest must be a sha256 in hex (64 characters)",
        ));
    }
    let component = state.store.get(&request.module_digest).await?;
    let params = match request.params {
        Some(p) => p.to_string(),
        None => "{}".to_string(),
    };
    check(&state, component.into(), params.clone()).await?;
    let version = state
        .store
        .activate(&state.pipeline, &request.module_digest, &params, "activate")
        .await?;
    Ok(Json(version).into_response())
}

async fn rollback(State(state): State<Arc<ControlState>>) -> Result<Response, ApiError> {
    Ok(Json(state.store.rollback(&state.pipeline).await?).into_response())
}

#[cfg(test)]
mod tests {
    use super::hide_params;
    use serde_json::json;

    #[test]
    fn params_are_removed_from_every_version_but_nothing_else() {
        let mut answer = json!({
            "active": { "version": 2, "params": "{\"secret\":1}", "params_digest": "ab" },
            "versions": [{ "params": "{}", "params_digest": "cd", "active": true }],
            "running": { "params_digest": "ab", "records": 5 },
            "other": { "params": "not a version" },
        });
        hide_params(&mut answer);
        assert!(!answer.to_string().contains("secret"));
        assert!(answer["active"].get("params").is_none());
        assert!(answer["versions"][0].get("params").is_none());
        assert_eq!(answer["active"]["params_digest"], "ab");
        assert_eq!(answer["running"]["records"], 5);
        assert_eq!(answer["other"]["params"], "not a version");
    }
}
