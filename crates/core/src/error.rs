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
        let mut said = self.0.to_string();
        write!(f, "{said}")?;
        let mut cause = self.0.source();
        while let Some(e) = cause {
            // Some drivers' messages already end with their cause's.
            let message = e.to_string();
            if !said.ends_with(&message) {
                write!(f, ": {message}")?;
            }
            said = message;
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
        let repeated = SinkError::unavailable("", Repeats(std::io::Error::other("bad cert")));
        assert_eq!(
            Chain(&repeated).to_string(),
            "sink unavailable: io: bad cert"
        );
    }

    /// An error that says its cause in its own message, as sqlx's do.
    #[derive(Debug)]
    struct Repeats(std::io::Error);

    impl fmt::Display for Repeats {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "io: {}", self.0)
        }
    }

    impl std::error::Error for Repeats {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
}
