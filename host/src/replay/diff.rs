//! Diffing two outputs of one batch (the recorded version's and a
//! candidate's), per target: rows added, removed and changed, with a few
//! samples, so a user sees what a swap would change before activating it.
//!
//! Rows of a target with key columns (upsert, accumulate, delete) are
//! matched by key, so a different value is "changed"; rows of a target
//! without a key (append) are compared as a multiset. It must not know
//! how a sink writes rows.

use crate::output::{Output, TargetRows, Value};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// Samples kept per kind of difference and target.
const SAMPLES: usize = 3;

/// How one target's rows differ.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TargetDiff {
    pub target: String,
    pub added: usize,
    pub removed: usize,
    pub changed: usize,
    pub unchanged: usize,
    /// `+ row`, `- row`, `~ old -> new`.
    pub samples: Vec<String>,
}

impl TargetDiff {
    /// Adds `other`'s counts (and samples, up to the limit) to this one.
    pub fn absorb(&mut self, other: TargetDiff) {
        self.added += other.added;
        self.removed += other.removed;
        self.changed += other.changed;
        self.unchanged += other.unchanged;
        for s in other.samples {
            self.sample(s);
        }
    }

    pub fn differs(&self) -> bool {
        self.added + self.removed + self.changed > 0
    }

    fn sample(&mut self, s: String) {
        let kind = s.chars().next();
        if self
            .samples
            .iter()
            .filter(|x| x.chars().next() == kind)
            .count()
            < SAMPLES
        {
            self.samples.push(s);
        }
    }
}

fn render(v: Value<'_>) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => f.to_string(),
        Value::Text(t) => format!("{t:?}"),
        Value::Bytes(b) => format!("{:?}", String::from_utf8_lossy(b)),
        Value::Bool(b) => b.to_string(),
    }
}

/// Each row as (key, whole row) text; the key is the whole row when the
/// target has no key columns.
fn rows(t: &TargetRows, key: &[String]) -> Vec<(String, String)> {
    let columns: Vec<(&str, Vec<String>)> = t
        .columns
        .iter()
        .map(|c| (c.name.as_str(), c.values().map(render).collect()))
        .collect();
    (0..t.rows as usize)
        .map(|i| {
            let cell = |name: &str, values: &[String]| format!("{name}={}", values[i]);
            let whole: Vec<String> = columns.iter().map(|(n, v)| cell(n, v)).collect();
            let keyed: Vec<String> = columns
                .iter()
                .filter(|(n, _)| key.iter().any(|k| k == n))
                .map(|(n, v)| cell(n, v))
                .collect();
            let whole = whole.join(", ");
            let key = if key.is_empty() {
                whole.clone()
            } else {
                keyed.join(", ")
            };
            (key, whole)
        })
        .collect()
}

/// Per target named by either output: how `candidate` differs from
/// `recorded`. `keys` maps target names to their key columns.
pub fn diff_outputs(
    recorded: &Output,
    candidate: &Output,
    keys: &HashMap<String, Vec<String>>,
) -> Vec<TargetDiff> {
    let mut names: Vec<&str> = recorded
        .targets
        .iter()
        .chain(&candidate.targets)
        .map(|t| t.target.as_str())
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            let key = keys.get(name).cloned().unwrap_or_default();
            let of = |o: &Output| -> Vec<(String, String)> {
                o.targets
                    .iter()
                    .filter(|t| t.target == name)
                    .flat_map(|t| rows(t, &key))
                    .collect()
            };
            let (old, new) = (of(recorded), of(candidate));
            let mut diff = if key.is_empty() {
                multiset_diff(old, new)
            } else {
                keyed_diff(old, new)
            };
            diff.target = name.to_string();
            diff
        })
        .collect()
}

fn multiset_diff(old: Vec<(String, String)>, new: Vec<(String, String)>) -> TargetDiff {
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for (_, row) in old {
        counts.entry(row).or_default().0 += 1;
    }
    for (_, row) in new {
        counts.entry(row).or_default().1 += 1;
    }
    let mut diff = TargetDiff::default();
    for (row, (o, n)) in counts {
        diff.unchanged += o.min(n);
        if n > o {
            diff.added += n - o;
            diff.sample(format!("+ {row}"));
        }
        if o > n {
            diff.removed += o - n;
            diff.sample(format!("- {row}"));
        }
    }
    diff
}

fn keyed_diff(old: Vec<(String, String)>, new: Vec<(String, String)>) -> TargetDiff {
    // The last row of a key wins, as an upsert applies them.
    let old: BTreeMap<String, String> = old.into_iter().collect();
    let new: BTreeMap<String, String> = new.into_iter().collect();
    let mut diff = TargetDiff::default();
    for (key, row) in &old {
        match new.get(key) {
            None => {
                diff.removed += 1;
                diff.sample(format!("- {row}"));
            }
            Some(n) if n == row => diff.unchanged += 1,
            Some(n) => {
                diff.changed += 1;
                diff.sample(format!("~ {row} -> {n}"));
            }
        }
    }
    for (key, row) in &new {
        if !old.contains_key(key) {
            diff.added += 1;
            diff.sample(format!("+ {row}"));
        }
    }
    diff
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::testing::words_output;

    #[test]
    fn keyed_targets_diff_by_key() {
        let old = words_output("counts", &[("a", 1), ("b", 2), ("c", 3)]);
        let new = words_output("counts", &[("a", 1), ("b", 5), ("d", 4)]);
        let keys = HashMap::from([("counts".to_string(), vec!["word".to_string()])]);
        let d = &diff_outputs(&old, &new, &keys)[0];
        assert_eq!((d.added, d.removed, d.changed, d.unchanged), (1, 1, 1, 1));
        assert!(
            d.samples
                .contains(&r#"~ word="b", n=2 -> word="b", n=5"#.to_string())
        );
        assert!(d.differs());
    }

    #[test]
    fn unkeyed_targets_diff_as_multisets() {
        let old = words_output("log", &[("a", 1), ("a", 1), ("b", 2)]);
        let new = words_output("log", &[("a", 1), ("b", 2), ("b", 2)]);
        let d = &diff_outputs(&old, &new, &HashMap::new())[0];
        assert_eq!((d.added, d.removed, d.changed, d.unchanged), (1, 1, 0, 2));
    }

    #[test]
    fn identical_outputs_do_not_differ_and_samples_are_capped() {
        let words: Vec<String> = (0..10).map(|i| format!("w{i}")).collect();
        let rows: Vec<(&str, i64)> = words.iter().map(|w| (w.as_str(), 0)).collect();
        let same = words_output("t", &rows);
        assert!(!diff_outputs(&same, &same, &HashMap::new())[0].differs());
        let d = &diff_outputs(&same, &Output::default(), &HashMap::new())[0];
        assert_eq!(d.removed, 10);
        assert_eq!(d.samples.len(), SAMPLES);
    }
}
