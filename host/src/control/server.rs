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
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

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
}

/// Serves the API on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ControlState>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// The routes; writes behind the bearer-token check.
pub fn router(state: Arc<ControlState>) -> Router {
    let writes = Router::new()
        .route("/v1/modules", post(deploy))
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
        // The deploy handler enforces its own, clearer, size limit.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
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
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        ApiError::new(status, e.to_string())
    }
}

/// Refuses a write without the configured bearer token (401), before its
/// body is read.
async fn require_token(
    State(state): State<Arc<ControlState>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let Some(expected) = state.token.as_deref() else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "writes are disabled: no control token is configured (set SLUICE_CONTROL_TOKEN or \
             control.token on the host)",
        ));
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compare digests so the time taken says nothing about the token.
    let matches = given.is_some_and(|g| {
        crate::batch::sha256_hex(g.as_bytes()) == crate::batch::sha256_hex(expected.as_bytes())
    });
    if !matches {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token (Authorization: Bearer <token>)",
        ));
    }
    Ok(next.run(request).await)
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

async fn status(State(state): State<Arc<ControlState>>) -> Result<Response, ApiError> {
    let active = state.store.active(&state.pipeline).await?;
    let running = state.status.snapshot();
    Ok(Json(serde_json::json!({ "active": active, "running": running })).into_response())
}

async fn versions(State(state): State<Arc<ControlState>>) -> Result<Response, ApiError> {
    let summary = state.store.summary(&state.pipeline).await?;
    let history = state.store.history(&state.pipeline).await?;
    Ok(Json(serde_json::json!({ "versions": summary, "history": history })).into_response())
}

/// `POST /v1/modules?activate=true&params=<json>`, body: the component.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployQuery {
    /// Make the uploaded module the active version.
    #[serde(default)]
    activate: bool,
    /// Params for `init`, JSON; default `{}`.
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

async fn deploy(
    State(state): State<Arc<ControlState>>,
    Query(query): Query<DeployQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let limit = state.max_module_bytes;
    let component = axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("module is over the limit of {limit} bytes (control.max_module_bytes)"),
        )
    })?;
    let params = query.params.unwrap_or_else(|| "{}".to_string());
    let validate_ms = check(&state, component.clone(), params.clone()).await?;
    let module_digest = state.store.put(&component).await?;
    let activated = match query.activate {
        true => Some(
            state
                .store
                .activate(&state.pipeline, &module_digest, &params, "activate")
                .await?,
        ),
        false => None,
    };
    tracing::info!(module = %module_digest, size = component.len(), validate_ms, "module deployed");
    let deployed = Deployed {
        module_digest,
        size: component.len(),
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
