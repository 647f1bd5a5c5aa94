//! Progress of long CLI operations (`verify`, `shadow`, `dead-letters
//! redrive`): a bar on a terminal, plain lines on stderr otherwise (at
//! most one every few seconds, and one at the end), each with the records
//! per second and an estimate of the time left.
//!
//! It must not print to stdout: results go there, and stay parseable.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

/// How often a plain progress line is printed off a terminal.
const PLAIN_EVERY: Duration = Duration::from_secs(3);

/// Progress through `total` units (batches) that hold records.
pub struct Progress {
    what: &'static str,
    unit: &'static str,
    total: u64,
    done: u64,
    records: u64,
    started: Instant,
    last_line: Option<Instant>,
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    /// Progress of `what` (e.g. "verifying") through `total` `unit`s.
    pub fn new(what: &'static str, total: usize, unit: &'static str) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:40}] {pos}/{len} {msg} (ETA {eta})",
                )
                .expect("template")
                .progress_chars("=> "),
            );
            bar.set_prefix(what);
            bar
        });
        Progress {
            what,
            unit,
            total: total as u64,
            done: 0,
            records: 0,
            started: Instant::now(),
            last_line: None,
            bar,
        }
    }

    /// One more unit done, of `records` records.
    pub fn step(&mut self, records: usize) {
        self.advance(1, records);
    }

    /// `units` more done, of `records` records.
    pub fn advance(&mut self, units: usize, records: usize) {
        self.done += units as u64;
        self.records += records as u64;
        match &self.bar {
            Some(bar) => {
                bar.set_message(format!("{}, {}", self.unit, self.rate()));
                bar.set_position(self.done);
            }
            None => {
                let due = self.last_line.is_none_or(|t| t.elapsed() >= PLAIN_EVERY);
                if due && self.done < self.total {
                    self.last_line = Some(Instant::now());
                    eprintln!("{}", self.line());
                }
            }
        }
    }

    /// Prints `text` without breaking the bar.
    pub fn println(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| println!("{text}")),
            None => println!("{text}"),
        }
    }

    /// Clears the bar, or prints the last plain line.
    pub fn finish(self) {
        match self.bar {
            Some(bar) => bar.finish_and_clear(),
            None if self.total > 0 => eprintln!("{}", self.line()),
            None => {}
        }
    }

    fn rate(&self) -> String {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        format!(
            "{} records, {:.0} records/s",
            self.records,
            self.records as f64 / seconds
        )
    }

    /// `verifying: 12/40 batches, 12000 records, 3400 records/s, ETA 8 s`.
    fn line(&self) -> String {
        let elapsed = self.started.elapsed().as_secs_f64();
        let left = self.total.saturating_sub(self.done);
        let eta = match self.done {
            0 => "?".to_string(),
            done => format!("{:.0} s", elapsed / done as f64 * left as f64),
        };
        format!(
            "{}: {}/{} {}, {}, ETA {eta}",
            self.what,
            self.done,
            self.total,
            self.unit,
            self.rate()
        )
    }
}
