//! What every layer's errors share: the cause a backend's own error is kept
//! as (`Cause`, so a sink's error enum needs no sqlx or rdkafka type), and
//! `Chain`, which writes an error with its causes on one line for logs and
//! API answers (the CLI prints the same chain through anyhow).
//!
//! It must not hold any layer's variants: each layer has its own enum.

use std::fmt;

/// A backend's own error, kept as the `#[source]` of a sluice error.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `": context"`, or nothing for an empty context (for `#[error]` formats).
pub fn prefixed(context: &str) -> String {
    match context.is_empty() {
        true => String::new(),
        false => format!(": {context}"),
    }
}

/// An error and its causes, `outer: inner: innermost`.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            write!(f, ": {e}")?;
            cause = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::SinkError;

    #[test]
    fn a_cause_is_said_once_in_the_chain() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let e = SinkError::unavailable("postgres://u@db/x", io);
        assert_eq!(e.to_string(), "sink unavailable: postgres://u@db/x");
        assert_eq!(
            Chain(&e).to_string(),
            "sink unavailable: postgres://u@db/x: connection refused"
        );
        let bare = SinkError::unavailable("", std::io::Error::other("reset by peer"));
        assert_eq!(Chain(&bare).to_string(), "sink unavailable: reset by peer");
    }
}
