//! The one retry policy: how long to wait before trying again something
//! that failed for a reason that may pass (a database or broker outage, an
//! instance the pool could not give, racing instances), and when to give
//! up. Every retry in sluice waits through a [`Backoff`], so the timings
//! are stated where the policy is named, once.
//!
//! It must not sleep or read anything but the clock: the core has no
//! runtime, so a caller sleeps the wait it is given (tokio or a thread).

use std::time::{Duration, Instant};

/// When a [`Backoff`] gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// After this many tries in all (the first one included).
    AfterTries(u32),
    /// Once this long has passed since the first try.
    After(Duration),
}

/// How to wait between tries: `first`, doubling each time up to `max`,
/// until the policy gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// The wait after the first failure.
    pub first: Duration,
    /// Waits double up to this (equal to `first`: a constant wait).
    pub max: Duration,
    pub give_up: GiveUp,
}

impl RetryPolicy {
    /// Starts counting tries now.
    pub fn start(self) -> Backoff {
        Backoff {
            policy: self,
            started: Instant::now(),
            failures: 0,
        }
    }
}

/// The tries of one operation under a [`RetryPolicy`].
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    started: Instant,
    failures: u32,
}

impl Backoff {
    /// A try failed: the wait before the next one, or `None` once the
    /// policy gives up.
    pub fn next_wait(&mut self) -> Option<Duration> {
        self.failures += 1;
        let give_up = match self.policy.give_up {
            GiveUp::AfterTries(tries) => self.failures >= tries,
            GiveUp::After(limit) => self.started.elapsed() >= limit,
        };
        if give_up {
            return None;
        }
        let doublings = (self.failures - 1).min(31);
        let wait = self.policy.first.saturating_mul(1 << doublings);
        Some(wait.min(self.policy.max))
    }

    /// A try failed for a reason that may pass (`retryable`) or may not:
    /// the wait before the next one, or `None` when there is no point in
    /// one (the failure is final, or the policy gives up).
    pub fn next_wait_if(&mut self, retryable: bool) -> Option<Duration> {
        if retryable { self.next_wait() } else { None }
    }

    /// How many tries have failed so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(policy: RetryPolicy) -> Vec<u64> {
        let mut backoff = policy.start();
        std::iter::from_fn(|| backoff.next_wait())
            .take(10)
            .map(|w| w.as_millis() as u64)
            .collect()
    }

    #[test]
    fn waits_double_up_to_the_max_and_stop_after_the_tries() {
        let policy = RetryPolicy {
            first: Duration::from_millis(100),
            max: Duration::from_millis(500),
            give_up: GiveUp::AfterTries(6),
        };
        assert_eq!(waits(policy), [100, 200, 400, 500, 500]);
        let once = RetryPolicy {
            give_up: GiveUp::AfterTries(1),
            ..policy
        };
        assert!(waits(once).is_empty(), "one try: no retry");
        let mut backoff = policy.start();
        assert_eq!(
            backoff.next_wait_if(false),
            None,
            "a final failure: no retry"
        );
        assert_eq!(backoff.next_wait_if(true), Some(Duration::from_millis(100)));
    }

    #[test]
    fn a_constant_wait_and_a_time_limit() {
        let policy = RetryPolicy {
            first: Duration::from_millis(7),
            max: Duration::from_millis(7),
            give_up: GiveUp::After(Duration::from_secs(3600)),
        };
        assert_eq!(waits(policy), [7; 10]);
        let spent = RetryPolicy {
            give_up: GiveUp::After(Duration::ZERO),
            ..policy
        };
        assert!(waits(spent).is_empty(), "no time left: no retry");
    }
}
