//! The control plane's HTTP API (axum), served by `sluice run`: deploy
//! (upload + validate + optionally activate), versions, activate, rollback,
//! status, health probes (`/healthz`, `/readyz`), module logs, Prometheus
//! metrics, its OpenAPI description, and
//! the status page (`/`, `page/`: a static page that reads the API).
//!
//! Every write needs `Authorization: Bearer <token>`; with no token
//! configured, writes are refused. A rejected upload stores nothing. It must
//! not touch batches: a version reaches the pipelines through the module
//! store, which every instance reads between batches.

use super::edge::{drain, edge};
use super::error::ApiError;
use super::upload::read_upload;
use crate::api::{Deployed, LogLine, LogsPage, Versions};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::Value;
use sluice_core::store::{Activation, ModuleStore};
use sluice_pipeline::StatusBoard;
use sluice_runtime::{Runtime, validate};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tower_http::timeout::TimeoutLayer;

/// The OpenAPI 3 description of this API, served at `/v1/openapi.json`.
pub const OPENAPI: &str = include_str!("openapi.json");

/// The status page and its script (no build step: checked in as they are).
const PAGE_HTML: &str = include_str!("page/index.html");
const PAGE_JS: &str = include_str!("page/page.js");

/// The page loads its own script and talks to this host only; nothing
/// inline runs, and it cannot be framed.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; \
     style-src 'unsafe-inline'; img-src 'self'; frame-ancestors 'none'; base-uri 'none'";

/// What the handlers share.
pub struct ControlState {
    pub pipeline: String,
    pub store: Arc<dyn ModuleStore>,
    pub runtime: Arc<Runtime>,
    pub cache_dir: Option<PathBuf>,
    /// The write token; `None` refuses every write.
    pub token: Option<String>,
    pub max_module_bytes: usize,
    pub status: StatusBoard,
    /// Deploys and activations validated at once (see
    /// [`MAX_PARALLEL_VALIDATIONS`]); the others wait their turn.
    pub validations: tokio::sync::Semaphore,
    /// How long the batch loop may go without coming round before
    /// `/healthz` calls it wedged, in ms.
    pub liveness_ms: i64,
    /// When the host started (ms since the epoch): `/healthz` counts from
    /// here until the loop's first round.
    pub started_ms: i64,
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
        .route("/", get(page))
        .route("/ui/page.js", get(page_script))
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/status", get(status))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/v1/versions", get(versions))
        .route("/metrics", get(metrics))
        .route("/v1/logs", get(logs))
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
pub(super) fn deploy_body_max(max_module_bytes: usize) -> usize {
    max_module_bytes + JSON_BODY_MAX_BYTES + 64 * 1024
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

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such endpoint: {}", uri.path()),
    )
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

/// `GET /v1/logs?after=SEQ&batch=ID&limit=N`: the module log lines this
/// host kept (the newest 10,000), after line `after`, of one batch if
/// asked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    /// Lines after this one (0: from the oldest kept).
    #[serde(default)]
    after: u64,
    /// Only this batch's lines.
    #[serde(default)]
    batch: Option<String>,
    /// At most this many lines (default and maximum [`MAX_LOG_PAGE`]).
    #[serde(default)]
    limit: Option<usize>,
}

/// The most log lines one answer carries.
pub const MAX_LOG_PAGE: usize = 1000;

/// Module log lines are for token holders only: a module may log what its
/// records hold, and those may be anyone's data.
async fn logs(
    State(state): State<Arc<ControlState>>,
    headers: HeaderMap,
    Query(query): Query<LogsQuery>,
) -> Result<Response, ApiError> {
    if !authorized(&state, &headers) {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "module logs may carry record data: send the control token \
             (Authorization: Bearer <token>)",
        ));
    }
    let limit = query.limit.unwrap_or(MAX_LOG_PAGE).clamp(1, MAX_LOG_PAGE);
    let page = state
        .runtime
        .logs_after(query.after, query.batch.as_deref(), limit);
    let lines = page
        .lines
        .into_iter()
        .map(|l| LogLine {
            seq: l.seq,
            batch_id: l.batch_id,
            level: l.level.as_str().to_string(),
            message: l.message,
            at_ms: l.at_ms,
        })
        .collect();
    let answer = LogsPage {
        lines,
        last_seq: page.last_seq,
        missed: page.missed,
    };
    Ok(Json(answer).into_response())
}

/// The pipeline's metrics in the Prometheus text format.
async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, PAGE_CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE_HTML,
    )
}

async fn page_script() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        PAGE_JS,
    )
}

async fn metrics(State(state): State<Arc<ControlState>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.status.metrics().encode(),
    )
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

/// Liveness: the batch loop came round (or tried the sink) within
/// `liveness_ms`. A loop retrying a sink that is down is alive; one stuck
/// in a call that never returns is not.
async fn healthz(State(state): State<Arc<ControlState>>) -> Response {
    let beat = state.status.health().beat_ms;
    let since = if beat > 0 { beat } else { state.started_ms };
    let ago = sluice_core::batch::now_ms() - since;
    let bound = state.liveness_ms;
    match ago <= bound {
        true => probe(
            StatusCode::OK,
            serde_json::json!({
                "status": "alive", "loop_ms_ago": ago, "bound_ms": bound
            }),
        ),
        false => probe(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({
                "status": "wedged", "loop_ms_ago": ago, "bound_ms": bound,
                "reason": format!("the batch loop has not come round for {ago} ms (bound {bound} ms)")
            }),
        ),
    }
}

/// Readiness: a module version loaded, ownership settled (partitions
/// assigned, or none to have), the sink answering, the pipeline not
/// stalled. Every reason it is not is listed.
async fn readyz(State(state): State<Arc<ControlState>>) -> Response {
    let health = state.status.health();
    let running = state.status.snapshot();
    let mut reasons = Vec::new();
    if running.module_digest.is_empty() {
        reasons.push("no module version loaded yet".to_string());
    }
    if !health.settled {
        reasons.push("the consumer group has not assigned partitions yet".to_string());
    }
    if let Some(problem) = health.sink_problem {
        reasons.push(format!("the sink's last try failed: {problem}"));
    }
    if let Some(stall) = running.stalled {
        reasons.push(format!("stalled: {}", stall.reason));
    }
    match reasons.is_empty() {
        true => probe(
            StatusCode::OK,
            serde_json::json!({
                "status": "ready", "partitions": running.partitions.len()
            }),
        ),
        false => probe(
            StatusCode::SERVICE_UNAVAILABLE,
            serde_json::json!({
                "status": "not ready", "reasons": reasons
            }),
        ),
    }
}

/// A probe's answer: never cached.
fn probe(code: StatusCode, body: Value) -> Response {
    (code, [(header::CACHE_CONTROL, "no-store")], Json(body)).into_response()
}

async fn versions(
    State(state): State<Arc<ControlState>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let summary = state.store.summary(&state.pipeline).await?;
    let history = state.store.history(&state.pipeline).await?;
    let answer = serde_json::to_value(Versions {
        versions: summary,
        history,
    })
    .expect("versions serialize");
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
                .activate(
                    &state.pipeline,
                    &module_digest,
                    &upload.params,
                    Activation::Activate,
                )
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
        .activate(
            &state.pipeline,
            &request.module_digest,
            &params,
            Activation::Activate,
        )
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
