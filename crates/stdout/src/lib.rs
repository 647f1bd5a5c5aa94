//! `sluice-stdout`: the stdout sink, for looking at what a module does.
//! Each batch's rows go to standard output, as one JSON object per row and
//! line (`format = "json"`) or as aligned tables (`format = "table"`); its
//! dead letters go to standard error as JSON lines, marked
//! `"dead_letter"`. Checkpoints, lineage and dead letters are committed in
//! a state store (any [`Sink`]: the host gives it the SQL sink of
//! `[state]`, a local SQLite file by default), so a restart resumes
//! instead of starting over.
//!
//! # Delivery guarantee
//!
//! At-least-once, by nature: a terminal or a pipe cannot take part in a
//! commit. A batch's rows are written and flushed first, then its offsets
//! move in the state store (with the same compare-and-set as every sink,
//! so a second instance is fenced from moving them). A crash between the
//! two prints that one batch again on restart: the window is exactly one
//! batch. A lost reply from the state store is resolved by the loop from
//! the checkpoints, as for SQL sinks.
//!
//! A stateful module's keyed state commits in the state store with the
//! offsets (the same transaction or script), so state is exactly once even
//! though rows are not: a batch printed again was run again from the same
//! state.
//!
//! Its own config fields (`format`) are read in `section`.
//!
//! It must not depend on a backend: the state store comes in as a trait.

use serde_json::{Map, Value as Json};
use sluice_core::batch::{Records, TopicPartition, describe};
use sluice_core::output::{TargetRows, Value};
use sluice_core::sink::{Commit, CommitOutcome, Sink, SinkError, commit_all_but_rows};
use std::collections::HashMap;
use std::io::Write;
use std::sync::Mutex;

pub mod section;
pub use section::{StdoutFormat, StdoutSection};

/// Prints rows, checkpoints in `state`.
pub struct StdoutSink<S> {
    state: S,
    format: StdoutFormat,
    out: Mutex<Box<dyn Write + Send>>,
    errors: Mutex<Box<dyn Write + Send>>,
}

impl<S: Sink> StdoutSink<S> {
    /// Rows to the process's stdout, dead letters to its stderr.
    pub fn new(state: S, format: StdoutFormat) -> StdoutSink<S> {
        Self::with_writers(
            state,
            format,
            Box::new(std::io::stdout()),
            Box::new(std::io::stderr()),
        )
    }

    /// Rows to `out`, dead letters to `errors`.
    pub fn with_writers(
        state: S,
        format: StdoutFormat,
        out: Box<dyn Write + Send>,
        errors: Box<dyn Write + Send>,
    ) -> StdoutSink<S> {
        StdoutSink {
            state,
            format,
            out: Mutex::new(out),
            errors: Mutex::new(errors),
        }
    }

    /// Writes and flushes the batch's rows and dead letters.
    fn print(&self, c: &Commit<'_>) -> Result<(), SinkError> {
        let text = render_rows(c, self.format);
        let broken = |e| SinkError::database("writing to stdout", e);
        let mut out = self.out.lock().expect("stdout lock");
        out.write_all(text.as_bytes()).map_err(broken)?;
        out.flush().map_err(broken)?;
        drop(out);
        if !c.dead_letters.is_empty() {
            let mut errors = self.errors.lock().expect("stderr lock");
            errors
                .write_all(render_dead_letters(c).as_bytes())
                .and_then(|_| errors.flush())
                .map_err(|e| SinkError::database("writing dead letters to stderr", e))?;
        }
        Ok(())
    }
}

impl<S: Sink> Sink for StdoutSink<S> {
    async fn checkpoints(
        &self,
        pipeline: &str,
        partitions: &[TopicPartition],
    ) -> Result<HashMap<TopicPartition, i64>, SinkError> {
        self.state.checkpoints(pipeline, partitions).await
    }

    async fn commit(&self, c: &Commit<'_>) -> Result<CommitOutcome, SinkError> {
        self.print(c)?;
        commit_all_but_rows(&self.state, c).await
    }

    /// Keyed state lives in the state store, committed there with the
    /// offsets (rows are printed before, at least once).
    fn state_store(&self) -> Option<std::sync::Arc<dyn sluice_core::state::StateStore>> {
        self.state.state_store()
    }
}

/// A batch's rows as this sink prints them (also `sluice test`'s output).
pub fn render_rows(c: &Commit<'_>, format: StdoutFormat) -> String {
    match format {
        StdoutFormat::Json => json_lines(c),
        StdoutFormat::Table => table(c),
    }
}

/// Each row of `rows` as (column name, cell) pairs, in row order.
fn rows_of(rows: &TargetRows) -> Vec<Vec<(&str, Value<'_>)>> {
    let columns: Vec<(&str, Vec<Value<'_>>)> = rows
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.values().collect()))
        .collect();
    (0..rows.rows as usize)
        .map(|i| columns.iter().map(|(n, v)| (*n, v[i])).collect())
        .collect()
}

/// One line per row: `{"batch", "target", "row": {column: value}}`. A row
/// is not tied to one record by the module contract, so the batch (its
/// id and ranges are in the lineage) is what locates it.
fn json_lines(c: &Commit<'_>) -> String {
    let mut text = String::new();
    for target in &c.output.targets {
        for row in rows_of(target) {
            let cells: Map<String, Json> = row
                .into_iter()
                .map(|(n, v)| (n.to_string(), v.to_json()))
                .collect();
            let line = serde_json::json!({
                "batch": c.plan.batch_id,
                "target": target.target,
                "row": cells,
            });
            text.push_str(&line.to_string());
            text.push('\n');
        }
    }
    text
}

/// Widest a table cell is printed; longer values are cut with `…`.
const MAX_CELL: usize = 40;

/// A header per batch, then per target its rows in aligned columns.
fn table(c: &Commit<'_>) -> String {
    let mut text = format!(
        "── batch {} ({}): {} records, {} rows, {} dead letters\n",
        c.plan.batch_id,
        describe(&c.plan.ranges),
        c.records.len(),
        c.output.row_count(),
        c.dead_letters.len()
    );
    for target in &c.output.targets {
        let names: Vec<String> = target.columns.iter().map(|c| c.name.clone()).collect();
        let cells: Vec<Vec<String>> = rows_of(target)
            .into_iter()
            .map(|row| row.into_iter().map(|(_, v)| cell_text(v)).collect())
            .collect();
        let widths: Vec<usize> = (0..names.len())
            .map(|i| {
                cells
                    .iter()
                    .map(|r| r[i].chars().count())
                    .chain([names[i].chars().count()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |values: &[String]| {
            let padded: Vec<String> = values
                .iter()
                .zip(&widths)
                .map(|(v, w)| format!("{v:<w$}"))
                .collect();
            format!("  {}\n", padded.join("  ").trim_end())
        };
        text.push_str(&format!("{}:\n", target.target));
        text.push_str(&line(&names));
        for row in &cells {
            text.push_str(&line(row));
        }
    }
    text
}

fn cell_text(v: Value<'_>) -> String {
    let full = match v.to_json() {
        Json::String(s) => s,
        Json::Null => "NULL".into(),
        other => other.to_string(),
    };
    match full.chars().count() > MAX_CELL {
        true => format!("{}…", full.chars().take(MAX_CELL - 1).collect::<String>()),
        false => full,
    }
}

/// The batch's dead letters, one JSON line each, marked `dead_letter`.
pub fn render_dead_letters(c: &Commit<'_>) -> String {
    let records: Vec<_> = Records::iter(c.records).collect();
    let mut text = String::new();
    for d in c.dead_letters {
        let r = records[d.index];
        let bytes = |b: Option<&[u8]>| b.map_or(Json::Null, |b| Value::Bytes(b).to_json());
        let line = serde_json::json!({
            "dead_letter": {
                "batch": c.plan.batch_id,
                "topic": r.topic,
                "partition": r.partition,
                "offset": r.offset,
                "kind": d.kind.as_str(),
                "reason": d.reason,
                "key": bytes(r.key),
                "value": bytes(r.value),
            }
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::batch::{OffsetRange, Plan};
    use sluice_core::testing::words_output;

    fn plan() -> Plan {
        let range = OffsetRange {
            topic: "t".into(),
            partition: 0,
            from: 0,
            until: 2,
        };
        Plan::new("p", vec![range], "m", "p", 0)
    }

    #[test]
    fn rows_print_as_json_lines_and_aligned_tables() {
        let output = words_output("counts", &[("alpha", 2), ("be", 10)]);
        let (plan, records) = (plan(), Records::default());
        let c = Commit {
            plan: &plan,
            records: &records,
            output: &output,
            dead_letters: &[],
            output_digest: "d",
            state_reads: &Default::default(),
        };
        let lines = json_lines(&c);
        let first: Json = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
        assert_eq!(first["target"], "counts");
        assert_eq!(first["row"]["word"], "alpha");
        assert_eq!(first["row"]["n"], 2);
        assert_eq!(lines.lines().count(), 2);
        let t = table(&c);
        let rows: Vec<&str> = t.lines().skip(2).collect();
        assert_eq!(rows.len(), 3, "{t}");
        // Aligned: every line's second column starts at the same place.
        let at: Vec<usize> = rows.iter().map(|l| l.rfind("  ").unwrap()).collect();
        assert!(at.windows(2).all(|w| w[0] == w[1]), "{t}");
    }
}
