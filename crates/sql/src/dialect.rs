//! The differences between SQL dialects that shared code needs to build
//! statement text: identifier quoting, placeholders, type names, "insert
//! unless present" and schemas.
//!
//! It must not run anything and must not hold a backend's bulk statements
//! (those live with the backend).

use crate::config::ColumnType;
use crate::sink::SinkError;

/// How a dialect skips an insert whose key is already present.
#[derive(Debug, Clone, Copy)]
pub enum InsertIgnore {
    /// `INSERT ... ON CONFLICT DO NOTHING` (SQLite, Postgres).
    OnConflictDoNothing,
    /// `INSERT IGNORE ...` (MySQL/MariaDB).
    InsertIgnore,
}

/// Type names for sluice's own tables and for created target tables.
#[derive(Debug, Clone, Copy)]
pub struct Types {
    pub bigint: &'static str,
    pub double: &'static str,
    pub text: &'static str,
    /// Text that is part of a key (MySQL cannot index unbounded TEXT).
    pub key_text: &'static str,
    pub blob: &'static str,
    pub key_blob: &'static str,
    pub boolean: &'static str,
}

/// One SQL dialect.
#[derive(Debug)]
pub struct Dialect {
    /// Name in messages.
    pub name: &'static str,
    quote: char,
    /// `$1, $2` (Postgres) instead of `?, ?`.
    numbered_params: bool,
    /// Longest identifier the server keeps without truncating it.
    max_ident_bytes: usize,
    pub types: Types,
    pub insert_ignore: InsertIgnore,
    /// Statement creating a schema (followed by the quoted name), if the
    /// dialect has schemas.
    schema_ddl: Option<&'static str>,
}

pub static SQLITE: Dialect = Dialect {
    name: "SQLite",
    quote: '"',
    numbered_params: false,
    max_ident_bytes: 128,
    types: Types {
        bigint: "INTEGER",
        double: "REAL",
        text: "TEXT",
        key_text: "TEXT",
        blob: "BLOB",
        key_blob: "BLOB",
        boolean: "INTEGER",
    },
    insert_ignore: InsertIgnore::OnConflictDoNothing,
    schema_ddl: None,
};

pub static POSTGRES: Dialect = Dialect {
    name: "Postgres",
    quote: '"',
    numbered_params: true,
    // NAMEDATALEN - 1: longer names are silently truncated by the server.
    max_ident_bytes: 63,
    types: Types {
        bigint: "BIGINT",
        double: "DOUBLE PRECISION",
        text: "TEXT",
        key_text: "TEXT",
        blob: "BYTEA",
        key_blob: "BYTEA",
        boolean: "BOOLEAN",
    },
    insert_ignore: InsertIgnore::OnConflictDoNothing,
    schema_ddl: Some("CREATE SCHEMA IF NOT EXISTS"),
};

pub static MYSQL: Dialect = Dialect {
    name: "MySQL",
    quote: '`',
    numbered_params: false,
    max_ident_bytes: 64,
    types: Types {
        bigint: "BIGINT",
        double: "DOUBLE",
        text: "LONGTEXT",
        key_text: "VARCHAR(255)",
        blob: "LONGBLOB",
        key_blob: "VARBINARY(255)",
        boolean: "BOOLEAN",
    },
    insert_ignore: InsertIgnore::InsertIgnore,
    schema_ddl: Some("CREATE DATABASE IF NOT EXISTS"),
};

impl Dialect {
    /// Quotes an identifier from configuration, after refusing what no
    /// table or column name needs and what the server would truncate.
    pub fn ident(&self, name: &str) -> Result<String, SinkError> {
        if name.is_empty()
            || name.len() > self.max_ident_bytes
            || name.chars().any(|c| c.is_control())
            || name.ends_with(' ')
        {
            return Err(SinkError::Config(format!(
                "invalid identifier {name:?} for {}: must be 1-{} bytes without control \
                 characters or trailing spaces",
                self.name, self.max_ident_bytes
            )));
        }
        let q = self.quote;
        let doubled = name.replace(q, &format!("{q}{q}"));
        Ok(format!("{q}{doubled}{q}"))
    }

    /// `"schema"."table"`, or `"table"` without a schema.
    pub fn qualified(&self, schema: Option<&str>, table: &str) -> Result<String, SinkError> {
        match schema {
            Some(s) => Ok(format!("{}.{}", self.ident(s)?, self.ident(table)?)),
            None => self.ident(table),
        }
    }

    /// The statement that creates `schema` if missing.
    pub fn create_schema(&self, schema: &str) -> Result<String, SinkError> {
        match self.schema_ddl {
            Some(ddl) => Ok(format!("{ddl} {}", self.ident(schema)?)),
            None => Err(SinkError::Config(format!(
                "{} has no schemas: leave `sink.schema` unset and use `sink.table_prefix`",
                self.name
            ))),
        }
    }

    /// Placeholders `first..first+n` (1-based), comma separated.
    pub fn params(&self, first: usize, n: usize) -> String {
        (first..first + n)
            .map(|i| self.param(i))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Placeholder number `i` (1-based).
    pub fn param(&self, i: usize) -> String {
        if self.numbered_params {
            format!("${i}")
        } else {
            "?".to_string()
        }
    }

    /// The column type of a created target table.
    pub fn column_type(&self, ty: ColumnType, in_key: bool) -> &'static str {
        let t = &self.types;
        match (ty, in_key) {
            (ColumnType::Integer, _) => t.bigint,
            (ColumnType::Real, _) => t.double,
            (ColumnType::Text, false) => t.text,
            (ColumnType::Text, true) => t.key_text,
            (ColumnType::Blob, false) => t.blob,
            (ColumnType::Blob, true) => t.key_blob,
            (ColumnType::Boolean, _) => t.boolean,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_are_doubled_per_dialect() {
        assert_eq!(SQLITE.ident("a\"b").unwrap(), "\"a\"\"b\"");
        assert_eq!(MYSQL.ident("a`b; DROP").unwrap(), "`a``b; DROP`");
        assert_eq!(POSTGRES.params(3, 2), "$3, $4");
        assert_eq!(MYSQL.params(3, 2), "?, ?");
    }

    #[test]
    fn names_the_server_would_truncate_are_refused() {
        let long = "x".repeat(64);
        assert!(POSTGRES.ident(&long).is_err());
        assert!(MYSQL.ident(&long).is_ok());
        assert!(MYSQL.ident("bad\nname").is_err());
        assert!(MYSQL.ident("trailing ").is_err());
        assert!(SQLITE.create_schema("s").is_err());
    }
}
