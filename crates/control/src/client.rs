//! The control plane's client, used by the CLI: one method per API call,
//! answers parsed into the server's own types (`api`); the status document,
//! which the CLI prints whole, as it came.
//!
//! It must not interpret versions: it carries requests and turns refusals
//! into errors that quote the server's message.

use crate::api::{Deployed, LogsPage, Versions};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_core::store::Version;
use std::time::Duration;

/// Why a control call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the control API at {url} (is `sluice run` serving [control] there?)")]
    Unreachable {
        url: String,
        #[source]
        cause: reqwest::Error,
    },
    #[error("{status}: {message}")]
    Refused { status: StatusCode, message: String },
    #[error("unexpected answer from {url}: {message}")]
    BadAnswer { url: String, message: String },
}

/// Connections are reused for less than the server keeps them open
/// (`HEADER_READ_TIMEOUT`), so a request never goes out on a connection the
/// server is closing.
const POOL_IDLE: Duration = Duration::from_secs(5);

/// A client of one host's control API.
pub struct ControlClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ControlClient {
    /// `base` like `http://127.0.0.1:7878`; `token` for writes.
    pub fn new(base: &str, token: Option<String>) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .pool_idle_timeout(POOL_IDLE)
            .build()
            .expect("HTTP client");
        ControlClient {
            base: base.trim_end_matches('/').to_string(),
            token,
            http,
        }
    }

    /// Uploads `component`; validates, stores and (if asked) activates it.
    pub async fn deploy(
        &self,
        component: Vec<u8>,
        params: &str,
        activate: bool,
    ) -> Result<Deployed, ClientError> {
        let activate = if activate { "true" } else { "false" };
        // Params travel in the body, never in the URL: they may hold secrets.
        let module = reqwest::multipart::Part::bytes(component)
            .file_name("module.wasm")
            .mime_str("application/wasm")
            .expect("a valid MIME type");
        let form = reqwest::multipart::Form::new()
            .part("module", module)
            .text("params", params.to_string());
        let request = self
            .http
            .post(self.url("/v1/modules"))
            .query(&[("activate", activate)])
            .multipart(form);
        self.send(request).await
    }

    pub async fn versions(&self) -> Result<Versions, ClientError> {
        self.send(self.http.get(self.url("/v1/versions"))).await
    }

    pub async fn status(&self) -> Result<Value, ClientError> {
        self.send(self.http.get(self.url("/v1/status"))).await
    }

    /// Module log lines after line `after` (of batch `batch` if given).
    pub async fn logs(&self, after: u64, batch: Option<&str>) -> Result<LogsPage, ClientError> {
        let mut query = vec![("after", after.to_string())];
        if let Some(batch) = batch {
            query.push(("batch", batch.to_string()));
        }
        self.send(self.http.get(self.url("/v1/logs")).query(&query))
            .await
    }

    /// Activates a stored module with `params` (JSON text).
    pub async fn activate(
        &self,
        module_digest: &str,
        params: &str,
    ) -> Result<Version, ClientError> {
        let params: Value = serde_json::from_str(params).map_err(|e| ClientError::Refused {
            status: StatusCode::BAD_REQUEST,
            message: format!("params are not valid JSON: {e}"),
        })?;
        let body = serde_json::json!({ "module_digest": module_digest, "params": params });
        self.send(self.http.post(self.url("/v1/activate")).json(&body))
            .await
    }

    pub async fn rollback(&self) -> Result<Version, ClientError> {
        self.send(self.http.post(self.url("/v1/rollback"))).await
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends `request` and reads its answer as `T`.
    async fn send<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request
            .send()
            .await
            .map_err(|cause| ClientError::Unreachable {
                url: self.base.clone(),
                cause,
            })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| ClientError::BadAnswer {
            url: self.base.clone(),
            message: e.to_string(),
        })?;
        let body: Option<Value> = serde_json::from_str(&text).ok();
        if !status.is_success() {
            let message = body
                .as_ref()
                .and_then(|b| b.get("error"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or(text);
            return Err(ClientError::Refused { status, message });
        }
        let body = body.ok_or_else(|| ClientError::BadAnswer {
            url: self.base.clone(),
            message: format!("not JSON: {text}"),
        })?;
        serde_json::from_value(body).map_err(|e| ClientError::BadAnswer {
            url: self.base.clone(),
            message: format!("not the answer expected: {e}"),
        })
    }
}
