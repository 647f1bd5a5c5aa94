//! A configured target as every SQL backend sees it: the quoted table and
//! columns, the key, the table's DDL, and the module's rows checked against
//! the declared columns and converted to typed columns.
//!
//! It must not build a backend's write statements (upsert syntax, bulk
//! paths): those differ per dialect and live with the backend.

use super::dialect::Dialect;
use crate::config::{ColumnType, TargetConfig};
use crate::output::{TargetRows, Value};
use crate::section::{SqlTargetFields, WriteMode};
use crate::sink::SinkError;
use sluice_core::contract::declared_columns;

/// A target with its identifiers validated and quoted once.
#[derive(Debug)]
pub struct Target {
    pub config: TargetConfig,
    /// How its rows are applied.
    pub mode: WriteMode,
    /// The table, quoted and schema-qualified.
    pub table: String,
    /// The unquoted table name and schema (for catalog lookups).
    pub table_name: String,
    pub schema: Option<String>,
    /// Column names in declaration order (sorted by name).
    pub columns: Vec<String>,
    /// The same, quoted.
    pub quoted: Vec<String>,
    pub types: Vec<ColumnType>,
    /// Indices of the key columns in `columns`, in key order.
    pub keys: Vec<usize>,
}

/// One column of a batch's rows, typed by the declared column type.
#[derive(Debug)]
pub enum TypedColumn<'a> {
    Integer(Vec<Option<i64>>),
    Real(Vec<Option<f64>>),
    Text(Vec<Option<&'a str>>),
    Blob(Vec<Option<&'a [u8]>>),
    Boolean(Vec<Option<bool>>),
}

/// One cell of a [`TypedColumn`].
#[derive(Debug, Clone, Copy)]
pub enum Cell<'a> {
    Integer(Option<i64>),
    Real(Option<f64>),
    Text(Option<&'a str>),
    Blob(Option<&'a [u8]>),
    Boolean(Option<bool>),
}

impl<'a> TypedColumn<'a> {
    pub fn cell(&self, row: usize) -> Cell<'a> {
        match self {
            TypedColumn::Integer(v) => Cell::Integer(v[row]),
            TypedColumn::Real(v) => Cell::Real(v[row]),
            TypedColumn::Text(v) => Cell::Text(v[row]),
            TypedColumn::Blob(v) => Cell::Blob(v[row]),
            TypedColumn::Boolean(v) => Cell::Boolean(v[row]),
        }
    }

    /// Bytes the cell takes on the wire, roughly (for packet sizing).
    pub fn wire_size(&self, row: usize) -> usize {
        match self.cell(row) {
            Cell::Text(Some(s)) => s.len() + 9,
            Cell::Blob(Some(b)) => b.len() + 9,
            _ => 9,
        }
    }

    fn convert(ty: ColumnType, it: impl Iterator<Item = Value<'a>>) -> TypedColumn<'a> {
        match ty {
            ColumnType::Integer => TypedColumn::Integer(
                it.map(|v| match v {
                    Value::Int(x) => Some(x),
                    Value::Bool(b) => Some(b as i64),
                    _ => None,
                })
                .collect(),
            ),
            ColumnType::Real => TypedColumn::Real(
                it.map(|v| match v {
                    Value::Float(x) => Some(x),
                    Value::Int(x) => Some(x as f64),
                    _ => None,
                })
                .collect(),
            ),
            ColumnType::Text => TypedColumn::Text(
                it.map(|v| match v {
                    Value::Text(s) => Some(s),
                    _ => None,
                })
                .collect(),
            ),
            ColumnType::Blob => TypedColumn::Blob(
                it.map(|v| match v {
                    Value::Bytes(b) => Some(b),
                    Value::Text(s) => Some(s.as_bytes()),
                    _ => None,
                })
                .collect(),
            ),
            ColumnType::Boolean => TypedColumn::Boolean(
                it.map(|v| match v {
                    Value::Bool(b) => Some(b),
                    Value::Int(x) => Some(x != 0),
                    _ => None,
                })
                .collect(),
            ),
        }
    }
}

impl Target {
    pub fn new(
        config: &TargetConfig,
        fields: SqlTargetFields,
        dialect: &Dialect,
        schema: Option<&str>,
    ) -> Result<Target, SinkError> {
        let columns: Vec<String> = config.columns.keys().cloned().collect();
        let quoted = columns
            .iter()
            .map(|c| dialect.ident(c))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = fields
            .key
            .iter()
            .map(|k| columns.iter().position(|c| c == k).expect("validated"))
            .collect();
        Ok(Target {
            table: dialect.qualified(schema, fields.table(config))?,
            table_name: fields.table(config).to_string(),
            mode: fields.mode,
            schema: schema.map(str::to_string),
            types: config.columns.values().copied().collect(),
            config: config.clone(),
            columns,
            quoted,
            keys,
        })
    }

    /// Quoted key columns.
    pub fn quoted_keys(&self) -> Vec<&str> {
        self.keys.iter().map(|&k| self.quoted[k].as_str()).collect()
    }

    /// Quoted non-key columns.
    pub fn quoted_non_keys(&self) -> Vec<&str> {
        (0..self.columns.len())
            .filter(|i| !self.keys.contains(i))
            .map(|i| self.quoted[i].as_str())
            .collect()
    }

    /// `a = value(a), b = value(b)` over the quoted non-key columns (the SET
    /// list of an upsert).
    pub fn assignments(&self, value: impl Fn(&str) -> String) -> String {
        self.quoted_non_keys()
            .iter()
            .map(|c| format!("{c} = {}", value(c)))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `CREATE TABLE IF NOT EXISTS` with the declared columns and key.
    pub fn create_ddl(&self, dialect: &Dialect) -> String {
        let mut cols: Vec<String> = (0..self.columns.len())
            .map(|i| {
                let ty = dialect.column_type(self.types[i], self.keys.contains(&i));
                format!("{} {ty}", self.quoted[i])
            })
            .collect();
        if !self.keys.is_empty() {
            cols.push(format!("PRIMARY KEY ({})", self.quoted_keys().join(", ")));
        }
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({})",
            self.table,
            cols.join(", ")
        )
    }

    /// Checks the table's catalog columns hold every declared column.
    pub fn check_table(&self, existing: &[String]) -> Result<(), SinkError> {
        if existing.is_empty() {
            return Err(SinkError::Config(format!(
                "table {} for target `{}` does not exist (set `create = true` or create it)",
                self.table, self.config.name
            )));
        }
        if let Some(missing) = self.columns.iter().find(|c| !existing.contains(c)) {
            return Err(SinkError::Config(format!(
                "table {} has no column `{missing}` (target `{}`)",
                self.table, self.config.name
            )));
        }
        Ok(())
    }

    /// The output's columns in this target's column order, typed by the
    /// declared types, after checking they match in name and type.
    pub fn columns_of<'a>(&self, rows: &'a TargetRows) -> Result<Vec<TypedColumn<'a>>, SinkError> {
        Ok(declared_columns(&self.config, rows)?
            .into_iter()
            .map(|(column, ty)| TypedColumn::convert(ty, column.values()))
            .collect())
    }
}
