//! What a guest said before it trapped: its runtime's last words (a Rust
//! panic hook, a Python traceback, a Go `panic:`, the JS SDK's `uncaught`
//! line) scraped from its log and put into the trap's message, where users
//! look first.
//!
//! It must not classify a failure (the runtime does): it only adds the
//! guest's own reason to a trap's text.

use crate::bindings;
use sluice_core::transform::RunError;

/// A guest's runtime says why it is about to trap in its log (a Rust
/// panic hook, a Python traceback, the JS SDK's `uncaught` line): put
/// that into the trap's message, where users look first.
pub(crate) fn with_panic_message(e: RunError, logs: &[bindings::ModuleLog]) -> RunError {
    match (e, trap_reason(logs)) {
        (RunError::Trap(trap), Some(reason)) => RunError::Trap(format!("{reason}\n{trap}")),
        (e, _) => e,
    }
}

/// The newest line that says why a guest gave up: a JS SDK `uncaught`
/// line, a Python exception line or a Go `panic:` / `fatal error:` line
/// first (their runtimes then log a panic or a stack of their own, which
/// says nothing), else a Rust panic.
fn trap_reason(logs: &[bindings::ModuleLog]) -> Option<String> {
    let said = logs.iter().rev().map(first_line).find(|line| {
        line.starts_with("uncaught ")
            || is_go_panic(line)
            || line.starts_with("fatal error: ")
            || is_python_exception(line)
    });
    let panicked = || {
        logs.iter()
            .rev()
            .find(|l| l.message.contains("panic"))
            .map(|l| l.message.as_str())
    };
    said.or_else(panicked).map(str::to_string)
}

/// Go's `panic: MESSAGE` (its stack follows on lines of their own); not the
/// Rust SDK's hook line, `panic: panicked at FILE:LINE:COL:` whose message
/// is on the next line of the same log line.
fn is_go_panic(line: &str) -> bool {
    line.starts_with("panic: ") && !line.starts_with("panic: panicked at ")
}

/// The first line of a log message.
fn first_line(log: &bindings::ModuleLog) -> &str {
    log.message.lines().next().unwrap_or_default()
}

/// `ValueError: ...`, `json.decoder.JSONDecodeError: ...`, `SystemExit`.
fn is_python_exception(line: &str) -> bool {
    let name = line.split(':').next().unwrap_or_default();
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        && ["Error", "Exception", "Exit", "Interrupt"]
            .iter()
            .any(|suffix| name.ends_with(suffix))
}

#[cfg(test)]
mod tests {
    use super::trap_reason;
    use crate::bindings::{LogLevel, ModuleLog};

    fn logs(lines: &[&str]) -> Vec<ModuleLog> {
        lines
            .iter()
            .map(|l| ModuleLog {
                level: LogLevel::Warn,
                message: l.to_string(),
            })
            .collect()
    }

    #[test]
    fn the_trap_names_what_the_guest_said_before_it() {
        let python = logs(&[
            "Traceback (most recent call last):",
            "  File \"/0/app.py\", line 77, in process",
            "ValueError: bad record",
            "thread '<unnamed>' (1) panicked at runtime/src/lib.rs:1293:29:",
            "Python function threw an unexpected exception",
        ]);
        assert_eq!(
            trap_reason(&python).as_deref(),
            Some("ValueError: bad record")
        );
        let js = logs(&[
            "uncaught Error: nope\nprocess@app.js:1:1",
            "Redirecting call to abort()",
        ]);
        assert_eq!(trap_reason(&js).as_deref(), Some("uncaught Error: nope"));
        let go = logs(&[
            "panic: hostile plugin panics on purpose",
            "",
            "goroutine 1 [running]:",
            "main.hostile.Process(...)",
            "\truntime/panic.go:115 +0x3",
        ]);
        assert_eq!(
            trap_reason(&go).as_deref(),
            Some("panic: hostile plugin panics on purpose")
        );
        let rust = logs(&["panicked at src/lib.rs:3:5:\nindex out of bounds"]);
        assert!(trap_reason(&rust).unwrap().ends_with("index out of bounds"));
        // The Rust SDK's panic hook: the message is on the second line.
        let sdk = logs(&["panic: panicked at src/lib.rs:3:5:\npoison record at 37"]);
        assert!(trap_reason(&sdk).unwrap().ends_with("poison record at 37"));
        assert_eq!(trap_reason(&logs(&["hello", "Error count: 3 of 4"])), None);
    }
}
