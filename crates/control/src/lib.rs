//! The control plane (`sluice-control`): the HTTP API `sluice run` serves (`server`) and the
//! client the CLI's `deploy`, `versions`, `activate`, `rollback`,
//! `status` and `logs` use (`client`), agreeing on the answers' types
//! (`api`). `listen` holds the connections (their cap and
//! timeouts), `edge` what every request passes (body limits, one JSON error
//! shape from `error`), `upload` the reading of a deploy's body.
//!
//! It must not hold version logic: the module store (the core's
//! `ModuleStore` trait, whatever backend keeps it) owns what a version is;
//! this crate only carries requests to it. It depends on neither sqlx nor
//! rdkafka.

pub mod api;
pub mod client;
mod edge;
mod error;
mod listen;
pub mod server;
mod upload;

pub use client::{ClientError, ControlClient};
pub use listen::HEADER_READ_TIMEOUT;
use sluice_core::batch;

pub use server::{ControlState, OPENAPI, ServeLimits, router, serve};
