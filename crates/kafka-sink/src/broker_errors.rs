//! Why the brokers cannot be reached, as librdkafka said it: the last
//! error it reported to a sink's client (an error-level log line or an
//! error event: a TLS handshake refused, a name that does not resolve), so
//! a failed broker call's error carries its cause instead of a bare
//! "BrokerTransportFailure".
//!
//! librdkafka reports those on the client's queue, served when the client
//! is polled: the log line and the failed call race. So the failure waits
//! a little for the reason ([`BrokerErrors::unavailable`]). It must not
//! change what a client does: it logs what it records as the default
//! context would.

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use sluice_core::sink::SinkError;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a failed call waits for librdkafka to say why.
const REASON_WAIT: Duration = Duration::from_secs(2);

/// The last error librdkafka reported to one client.
#[derive(Debug, Default)]
pub struct BrokerErrors {
    last: Mutex<Option<String>>,
}

impl BrokerErrors {
    /// A context's `log`: kept if at error level or worse, and logged.
    pub fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => {
                self.keep(message);
                tracing::error!(target: "librdkafka", "librdkafka: {facility} {message}");
            }
            RDKafkaLogLevel::Warning => {
                tracing::warn!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
                tracing::info!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
            RDKafkaLogLevel::Debug => {
                tracing::debug!(target: "librdkafka", "librdkafka: {facility} {message}")
            }
        }
    }

    /// A context's `error`: kept and logged.
    pub fn error(&self, error: KafkaError, reason: &str) {
        self.keep(reason);
        tracing::error!("librdkafka: {error}: {reason}");
    }

    fn keep(&self, message: &str) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(message.to_string());
    }

    fn last(&self) -> Option<String> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A broker call to `brokers` failed with `cause`: unavailable, with
    /// the reason librdkafka gives within [`REASON_WAIT`] (`serve` polls
    /// the client's queue, where it reports it, for a moment).
    pub fn unavailable(&self, brokers: &str, cause: KafkaError, serve: impl Fn()) -> SinkError {
        let since = Instant::now();
        while self.last().is_none() && since.elapsed() < REASON_WAIT {
            serve();
        }
        let what = match self.last() {
            Some(reason) => format!("Kafka brokers {brokers} (librdkafka: {reason})"),
            None => format!("Kafka brokers {brokers}"),
        };
        SinkError::unavailable(what, cause)
    }
}

/// As a consumer's whole context (the sink's group-offsets reader).
impl rdkafka::ClientContext for BrokerErrors {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        BrokerErrors::log(self, level, facility, message)
    }

    fn error(&self, error: KafkaError, reason: &str) {
        BrokerErrors::error(self, error, reason)
    }
}

impl rdkafka::consumer::ConsumerContext for BrokerErrors {}
