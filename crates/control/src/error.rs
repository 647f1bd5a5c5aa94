//! The control API's one error shape: a status and `{"error": "..."}`,
//! and which status each refusal of the layers below gets.
//!
//! It must not decide what is refused: handlers and the module store do.

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluice_core::error::Chain;
use sluice_core::store::StoreError;
use sluice_runtime::Rejected;

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
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
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
            StoreError::Unavailable { .. } | StoreError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            StoreError::UnknownModule(_) => StatusCode::NOT_FOUND,
            StoreError::NothingToRollBack(_) => StatusCode::CONFLICT,
            StoreError::Database { .. } | StoreError::Config(_) | StoreError::Settings(_) => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        ApiError::new(status, Chain(&e).to_string())
    }
}

impl From<Rejected> for ApiError {
    fn from(e: Rejected) -> Self {
        let status = match &e {
            Rejected::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            // The host could not compile (no worker process, say): not the
            // module's fault, and may pass later.
            Rejected::Busy(_) | Rejected::Module(sluice_runtime::ModuleError::Engine(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            _ => StatusCode::UNPROCESSABLE_ENTITY,
        };
        ApiError::new(status, e.to_string())
    }
}
