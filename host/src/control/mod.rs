//! The control plane: the HTTP API `sluice run` serves (`server`) and the
//! client the CLI's `deploy`, `versions`, `activate`, `rollback` and
//! `status` use (`client`). `listen` holds the connections (their cap and
//! timeouts), `edge` what every request passes (body limits, one JSON error
//! shape from `error`), `upload` the reading of a deploy's body.
//!
//! It must not hold version logic: the module store (`modules`) owns what a
//! version is; this module only carries requests to it.

pub mod client;
mod edge;
mod error;
mod listen;
pub mod server;
mod upload;

pub use client::{ClientError, ControlClient};
pub use listen::HEADER_READ_TIMEOUT;
pub use server::{ControlState, OPENAPI, ServeLimits, router, serve};
