//! Turning a batch's rows into the commands its targets declare: each
//! template rendered per row, every key given an index, and the checks the
//! commit script must make before writing (key types, counters).
//!
//! Everything that can be refused without asking Redis is refused here,
//! before the script is called: a null in a template, an empty key, an
//! increment that is no number, one key written as two types. It must not
//! talk to Redis.

use sluice_core::config::{RedisCommand, RedisCommandConfig, TargetConfig};
use sluice_core::contract::declared_columns;
use sluice_core::output::{TargetRows, Value};
use sluice_core::sink::SinkError;
use sluice_core::template::{Piece, Template};
use std::collections::{HashMap, HashSet};

/// A target's commands, parsed once at start.
pub struct CompiledTarget {
    pub config: TargetConfig,
    commands: Vec<CompiledCommand>,
}

struct CompiledCommand {
    command: RedisCommand,
    key: Template,
    /// The templates of [`RedisCommand::arguments`], in that order.
    arguments: Vec<Template>,
    ttl_s: Option<u64>,
    /// `xadd`: the entry's fields.
    fields: Vec<String>,
}

impl CompiledTarget {
    pub fn new(config: &TargetConfig) -> Result<CompiledTarget, SinkError> {
        let columns = config.columns.keys();
        let parse = |t: &str| {
            Template::parse(t, columns.clone())
                .map_err(|e| SinkError::Config(format!("target `{}`: {e}", config.name)))
        };
        let commands = config
            .redis
            .iter()
            .map(|c: &RedisCommandConfig| {
                let arguments = c
                    .command
                    .arguments()
                    .iter()
                    .map(|name| parse(&c.argument(name).unwrap_or_default()))
                    .collect::<Result<_, _>>()?;
                Ok(CompiledCommand {
                    command: c.command,
                    key: parse(&c.key)?,
                    arguments,
                    ttl_s: c.ttl_s,
                    fields: c
                        .fields
                        .clone()
                        .unwrap_or_else(|| config.columns.keys().cloned().collect()),
                })
            })
            .collect::<Result<_, SinkError>>()?;
        Ok(CompiledTarget {
            config: config.clone(),
            commands,
        })
    }
}

/// A batch's commands in the commit script's layout (see `commit.lua`).
#[derive(Default)]
pub struct Rendered {
    /// The keys written, by index (KEYS[4..] of the script).
    pub keys: Vec<Vec<u8>>,
    index: HashMap<Vec<u8>, usize>,
    /// The type each key must have or be absent as (`""`: any).
    key_types: Vec<&'static str>,
    /// (key, field) counters incremented; field empty for INCRBY.
    counters: HashSet<(usize, Vec<u8>)>,
    /// (key, field) set to a value that is no integer.
    non_integers: HashSet<(usize, Vec<u8>)>,
    hyperloglogs: HashSet<usize>,
    /// The ops, flattened: name, key index, arguments.
    pub ops: Vec<Vec<u8>>,
    pub op_count: usize,
}

/// One command of one row, rendered.
pub struct Op {
    pub command: RedisCommand,
    pub key: Vec<u8>,
    pub arguments: Vec<Vec<u8>>,
    pub ttl_s: Option<u64>,
}

impl Rendered {
    /// Renders every row of `rows` through `target`'s commands.
    pub fn add(&mut self, target: &CompiledTarget, rows: &TargetRows) -> Result<(), SinkError> {
        for op in ops_of(target, rows)? {
            self.push(op)?;
        }
        Ok(())
    }

    fn push(&mut self, op: Op) -> Result<(), SinkError> {
        let key = self.key(&op.key, op.command)?;
        let field = match op.command {
            RedisCommand::Hset | RedisCommand::Hincrby => op.arguments[0].clone(),
            _ => Vec::new(),
        };
        match op.command {
            RedisCommand::Incrby | RedisCommand::Hincrby => {
                self.counters.insert((key, field));
            }
            RedisCommand::Set | RedisCommand::Hset => {
                let value = op.arguments.last().expect("set and hset take a value");
                if std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_none()
                {
                    self.non_integers.insert((key, field));
                }
            }
            RedisCommand::Pfadd => {
                self.hyperloglogs.insert(key);
            }
            _ => {}
        }
        self.ops.push(op.command.as_str().as_bytes().to_vec());
        self.ops.push((key + 4).to_string().into_bytes());
        if op.command == RedisCommand::Xadd {
            self.ops.push(op.arguments.len().to_string().into_bytes());
        }
        self.ops.extend(op.arguments);
        if op.command == RedisCommand::Set {
            self.ops.push(
                op.ttl_s
                    .map(|t| t.to_string())
                    .unwrap_or_default()
                    .into_bytes(),
            );
        }
        self.op_count += 1;
        Ok(())
    }

    /// The index of `key`, checking it is written as one type only.
    fn key(&mut self, key: &[u8], command: RedisCommand) -> Result<usize, SinkError> {
        let wanted = command.key_type().unwrap_or("");
        if let Some(&i) = self.index.get(key) {
            let known = self.key_types[i];
            if known.is_empty() {
                self.key_types[i] = wanted;
            } else if !wanted.is_empty() && known != wanted {
                return Err(SinkError::Config(format!(
                    "key {:?} is written as a {known} and as a {wanted} in one batch: give \
                     the commands different keys",
                    String::from_utf8_lossy(key)
                )));
            }
            return Ok(i);
        }
        let i = self.keys.len();
        self.keys.push(key.to_vec());
        self.index.insert(key.to_vec(), i);
        self.key_types.push(wanted);
        Ok(i)
    }

    /// The script's pre-write checks, flattened: key index, type, field,
    /// check (`int`, `hll` or empty). Refuses a counter the same batch
    /// sets to something that is no integer: the script would fail
    /// halfway.
    pub fn checks(&self) -> Result<Vec<Vec<u8>>, SinkError> {
        if let Some((key, field)) = self.counters.intersection(&self.non_integers).next() {
            return Err(SinkError::Config(format!(
                "key {:?}{} is both incremented and set to a value that is no integer in one \
                 batch",
                String::from_utf8_lossy(&self.keys[*key]),
                match field.is_empty() {
                    true => String::new(),
                    false => format!(" field {:?}", String::from_utf8_lossy(field)),
                }
            )));
        }
        let mut out = Vec::new();
        let mut check = |key: usize, field: &[u8], what: &str| {
            out.push((key + 4).to_string().into_bytes());
            out.push(self.key_types[key].as_bytes().to_vec());
            out.push(field.to_vec());
            out.push(what.as_bytes().to_vec());
        };
        let mut counted: Vec<&(usize, Vec<u8>)> = self.counters.iter().collect();
        counted.sort();
        for (key, field) in counted {
            check(*key, field, "int");
        }
        let mut logs: Vec<usize> = self.hyperloglogs.iter().copied().collect();
        logs.sort();
        for key in logs {
            check(key, b"", "hll");
        }
        for key in 0..self.keys.len() {
            if !self.key_types[key].is_empty() {
                check(key, b"", "");
            }
        }
        Ok(out)
    }
}

/// Every command of every row of `rows`, rendered, in row order.
pub fn ops_of(target: &CompiledTarget, rows: &TargetRows) -> Result<Vec<Op>, SinkError> {
    let declared = declared_columns(&target.config, rows)?;
    let columns: HashMap<&str, Vec<Value<'_>>> = declared
        .iter()
        .map(|(c, _)| (c.name.as_str(), c.values().collect()))
        .collect();
    let mut ops = Vec::with_capacity(rows.rows as usize * target.commands.len());
    for row in 0..rows.rows as usize {
        for c in &target.commands {
            let render = |t: &Template| render(t, &columns, row, &target.config.name);
            let key = render(&c.key)?;
            if key.is_empty() {
                return Err(SinkError::Config(format!(
                    "target `{}`: key {:?} renders empty for a row",
                    target.config.name, c.key.source
                )));
            }
            let mut arguments = c
                .arguments
                .iter()
                .map(render)
                .collect::<Result<Vec<_>, _>>()?;
            check_numbers(c, &arguments, &target.config.name)?;
            if c.command == RedisCommand::Xadd {
                arguments = entry_fields(&c.fields, &columns, row);
                if arguments.is_empty() {
                    return Err(SinkError::Config(format!(
                        "target `{}`: every field of a stream entry is null",
                        target.config.name
                    )));
                }
            }
            ops.push(Op {
                command: c.command,
                key,
                arguments,
                ttl_s: c.ttl_s,
            });
        }
    }
    Ok(ops)
}

/// `xadd`'s field/value pairs; null columns are left out of the entry.
fn entry_fields(
    fields: &[String],
    columns: &HashMap<&str, Vec<Value<'_>>>,
    row: usize,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for f in fields {
        if let Some(bytes) = value_bytes(columns[f.as_str()][row]) {
            out.push(f.as_bytes().to_vec());
            out.push(bytes);
        }
    }
    out
}

/// Increments and scores must be numbers Redis takes.
fn check_numbers(
    c: &CompiledCommand,
    arguments: &[Vec<u8>],
    target: &str,
) -> Result<(), SinkError> {
    for (name, value) in c.command.arguments().iter().zip(arguments) {
        let text = String::from_utf8_lossy(value);
        let ok = match (*name, c.command) {
            ("by", RedisCommand::Zincrby) | ("score", _) => {
                text.parse::<f64>().is_ok_and(|f| !f.is_nan())
            }
            ("by", _) => text.parse::<i64>().is_ok(),
            _ => true,
        };
        if !ok {
            return Err(SinkError::Config(format!(
                "target `{target}`: `{}` {name} {text:?} is not a number",
                c.command.as_str()
            )));
        }
    }
    Ok(())
}

fn render(
    template: &Template,
    columns: &HashMap<&str, Vec<Value<'_>>>,
    row: usize,
    target: &str,
) -> Result<Vec<u8>, SinkError> {
    let mut out = Vec::new();
    for piece in &template.pieces {
        match piece {
            Piece::Literal(text) => out.extend_from_slice(text.as_bytes()),
            Piece::Column(name) => {
                let value = columns[name.as_str()][row];
                let bytes = value_bytes(value).ok_or_else(|| {
                    SinkError::Config(format!(
                        "target `{target}`: column `{name}` is null in a row, so template {:?} \
                         cannot be built",
                        template.source
                    ))
                })?;
                out.extend_from_slice(&bytes);
            }
        }
    }
    Ok(out)
}

/// A cell as Redis stores it; `None` for null.
fn value_bytes(value: Value<'_>) -> Option<Vec<u8>> {
    match value {
        Value::Null => None,
        Value::Int(i) => Some(i.to_string().into_bytes()),
        Value::Float(f) => Some(f.to_string().into_bytes()),
        Value::Text(t) => Some(t.as_bytes().to_vec()),
        Value::Bytes(b) => Some(b.to_vec()),
        Value::Bool(b) => Some(if b { b"1".to_vec() } else { b"0".to_vec() }),
    }
}
