//! The output contract every sink kind checks a module's rows against: a
//! target's rows carry exactly the columns its `[[sink.targets]]` entry
//! declares, each of a type that fits the declared one.
//!
//! Written once here so a SQL table, a Redis key or a Kafka record refuse
//! the same rows with the same message. It must not convert or write
//! values: each sink does that its own way.

use crate::config::{ColumnType, TargetConfig};
use crate::output::{Column, ColumnData, Output, TargetRows};

/// Why a module's rows do not fit their target. Fatal for the batch: the
/// module or the config must change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    #[error(
        "module wrote to target `{target}`, which the sink does not declare (declared: {declared:?})"
    )]
    UnknownTarget {
        target: String,
        declared: Vec<String>,
    },
    #[error(
        "module wrote column `{column}` to target `{target}`, which declares only {declared:?}"
    )]
    Undeclared {
        target: String,
        column: String,
        declared: Vec<String>,
    },
    #[error("module wrote no column `{column}` for target `{target}`")]
    Missing { target: String, column: String },
    #[error("target `{target}` column `{column}` is {declared:?} but the module wrote {written}")]
    WrongType {
        target: String,
        column: String,
        declared: ColumnType,
        written: &'static str,
    },
}

/// The targets a sink declares, which every run's output must fit before
/// the batch goes on to commit, so a record whose rows break them is
/// isolated like any poison record. A sink that takes any rows (stdout)
/// checks nothing.
#[derive(Debug, Clone, Default)]
pub struct OutputContract {
    /// `None`: any target and columns.
    targets: Option<std::sync::Arc<[TargetConfig]>>,
}

impl OutputContract {
    /// Rows must fit `targets`.
    pub fn of(targets: &[TargetConfig]) -> OutputContract {
        OutputContract {
            targets: Some(targets.into()),
        }
    }

    /// Any rows fit.
    pub fn any() -> OutputContract {
        OutputContract::default()
    }

    /// Checks every target of `output` is declared and its rows fit it.
    pub fn check(&self, output: &Output) -> Result<(), ContractError> {
        let Some(targets) = &self.targets else {
            return Ok(());
        };
        for rows in &output.targets {
            let target = targets
                .iter()
                .find(|t| t.name == rows.target)
                .ok_or_else(|| ContractError::UnknownTarget {
                    target: rows.target.clone(),
                    declared: targets.iter().map(|t| t.name.clone()).collect(),
                })?;
            declared_columns(target, rows)?;
        }
        Ok(())
    }
}

/// The module's columns for `target`, in the target's declared (name)
/// order, each with its declared type, after checking names and types.
pub fn declared_columns<'a>(
    target: &TargetConfig,
    rows: &'a TargetRows,
) -> Result<Vec<(&'a Column, ColumnType)>, ContractError> {
    if let Some(extra) = rows
        .columns
        .iter()
        .find(|c| !target.columns.contains_key(&c.name))
    {
        return Err(ContractError::Undeclared {
            target: target.name.clone(),
            column: extra.name.clone(),
            declared: target.columns.keys().cloned().collect(),
        });
    }
    target
        .columns
        .iter()
        .map(|(name, &ty)| {
            let column = rows
                .columns
                .iter()
                .find(|c| &c.name == name)
                .ok_or_else(|| ContractError::Missing {
                    target: target.name.clone(),
                    column: name.clone(),
                })?;
            if !fits(ty, &column.data) {
                return Err(ContractError::WrongType {
                    target: target.name.clone(),
                    column: name.clone(),
                    declared: ty,
                    written: column.data.kind(),
                });
            }
            Ok((column, ty))
        })
        .collect()
}

/// Whether values of `data` can be stored as `ty` without loss of meaning.
fn fits(ty: ColumnType, data: &ColumnData) -> bool {
    matches!(
        (ty, data),
        (
            ColumnType::Integer,
            ColumnData::Int64(_) | ColumnData::Bool(_)
        ) | (
            ColumnType::Real,
            ColumnData::Float64(_) | ColumnData::Int64(_)
        ) | (ColumnType::Text, ColumnData::Text { .. })
            | (
                ColumnType::Blob,
                ColumnData::Bytes { .. } | ColumnData::Text { .. }
            )
            | (
                ColumnType::Boolean,
                ColumnData::Bool(_) | ColumnData::Int64(_)
            )
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PipelineConfig;
    use crate::testing::words_output;

    fn target(columns: &str) -> TargetConfig {
        let toml = format!(
            "pipeline = \"p\"\n[source]\nbrokers = \"b\"\ntopics = [\"t\"]\n[module]\npath = \"m.wasm\"\n\
             [sink]\nurl = \"sqlite://x.db\"\n[[sink.targets]]\nname = \"counts\"\ncolumns = {{ {columns} }}\n"
        );
        PipelineConfig::parse(&toml).unwrap().sink.targets.remove(0)
    }

    #[test]
    fn rows_fit_in_declared_order_or_are_refused_by_name() {
        let out = words_output("counts", &[("a", 1)]);
        let rows = &out.targets[0];
        let ok = declared_columns(&target("n = \"real\", word = \"text\""), rows).unwrap();
        let names: Vec<_> = ok.iter().map(|(c, t)| (c.name.as_str(), *t)).collect();
        assert_eq!(names, [("n", ColumnType::Real), ("word", ColumnType::Text)]);
        let err = declared_columns(&target("word = \"text\""), rows).unwrap_err();
        assert!(matches!(&err, ContractError::Undeclared { column, .. } if column == "n"));
        let err = declared_columns(
            &target("n = \"integer\", word = \"text\", z = \"text\""),
            rows,
        )
        .unwrap_err();
        assert!(matches!(&err, ContractError::Missing { column, .. } if column == "z"));
        let err = declared_columns(&target("n = \"text\", word = \"text\""), rows).unwrap_err();
        assert_eq!(
            err.to_string(),
            "target `counts` column `n` is Text but the module wrote int64"
        );
    }
}
