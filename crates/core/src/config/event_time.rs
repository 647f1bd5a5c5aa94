//! `[event_time]`: how a pipeline judges event time (its watermarks).
//!
//! It must not compute watermarks: a run does (`event_time`), from its
//! records and this.

use super::{Bounded, ConfigError};
use serde::Deserialize;

/// Event time: watermarks per input partition, for modules that use timers
/// and windows (the `time` import). A module that does not use it is not
/// affected by it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventTimeConfig {
    /// How far, in milliseconds, a partition's watermark stays behind the
    /// highest event time of its records so far (0 to one year; default 0):
    /// a record up to this much older than the newest one still finds its
    /// window open. Recorded with every batch: `verify` and `shadow` replay
    /// with the value a batch ran with.
    #[serde(default = "no_lateness")]
    pub allowed_lateness_ms: Bounded<0, 31_536_000_000>,
}

fn no_lateness() -> Bounded<0, 31_536_000_000> {
    Bounded::at(0)
}

impl Default for EventTimeConfig {
    fn default() -> Self {
        EventTimeConfig {
            allowed_lateness_ms: no_lateness(),
        }
    }
}

impl EventTimeConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.allowed_lateness_ms
            .check("event_time.allowed_lateness_ms")
    }
}
