//! Parts of the `sluice` command line too large for `main.rs`: progress
//! output for long operations and the `dead-letters` commands. Like
//! `main.rs`, they print and parse; they must not hold pipeline logic.

pub mod dead_letters;
pub mod progress;
