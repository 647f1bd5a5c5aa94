//! Turning a batch's rows into the commands its targets declare: each
//! template rendered per row, every key given an index, and the checks the
//! commit script must make before writing (key types, counters).
//!
//! Everything that can be refused without asking Redis is refused here,
//! before the script is called: a null in a template, an empty key, an
//! increment that is no number, one key written as two types. It must not
//! talk to Redis.

use crate::section::{RedisCommand, RedisCommandConfig, RedisTargetFields};
use crate::template::{Piece, Template};
use sluice_core::config::{ConfigError, Guarantee, TargetConfig};
use sluice_core::contract::declared_columns;
use sluice_core::output::{TargetRows, Value};
use sluice_core::sink::SinkError;
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
    /// Compiles `config`'s commands (`fields`, read from its Redis part):
    /// every rule of a Redis target is checked here, once, whether for
    /// `sluice check` or for the sink that runs them.
    pub fn new(
        config: &TargetConfig,
        fields: &RedisTargetFields,
        guarantee: Guarantee,
    ) -> Result<CompiledTarget, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(format!("target `{}`: {m}", config.name));
        if fields.redis.is_empty() {
            return Err(invalid(
                "a Redis target needs at least one `[[sink.targets.redis]]` command".into(),
            ));
        }
        let commands = fields
            .redis
            .iter()
            .enumerate()
            .map(|(i, c)| {
                CompiledCommand::new(c, config, guarantee).map_err(|e| {
                    invalid(format!(
                        "redis command {} (`{}`): {e}",
                        i + 1,
                        c.command.as_str()
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(CompiledTarget {
            config: config.clone(),
            commands,
        })
    }
}

impl CompiledCommand {
    /// Parses `c`'s templates against `target`'s columns and checks the
    /// command's rules: the arguments it needs and no others, literal
    /// numbers that are numbers, `ttl_s` and `fields` sound, and under
    /// `at-least-once` an idempotent command only.
    fn new(
        c: &RedisCommandConfig,
        target: &TargetConfig,
        guarantee: Guarantee,
    ) -> Result<CompiledCommand, String> {
        let command = c.command.as_str();
        let columns = target.columns.keys();
        let key = Template::parse(&c.key, columns.clone()).map_err(|e| format!("`key`: {e}"))?;
        let needed = c.command.arguments();
        let given = [
            ("field", c.field.is_some()),
            ("value", c.value.is_some()),
            ("member", c.member.is_some()),
            ("score", c.score.is_some()),
            ("by", c.by.is_some()),
            ("ttl_s", c.ttl_s.is_some()),
            ("fields", c.fields.is_some()),
        ];
        let allowed_extra: &[&str] = match c.command {
            RedisCommand::Set => &["ttl_s"],
            RedisCommand::Xadd => &["fields"],
            _ => &[],
        };
        if let Some((name, _)) = given.iter().find(|(name, is_given)| {
            *is_given && !needed.contains(name) && !allowed_extra.contains(name)
        }) {
            return Err(format!("`{command}` takes no `{name}`"));
        }
        let mut arguments = Vec::with_capacity(needed.len());
        for name in needed {
            let template = c
                .argument(name)
                .ok_or_else(|| format!("`{command}` needs `{name}`"))?;
            let parsed = Template::parse(&template, columns.clone())
                .map_err(|e| format!("`{name}`: {e}"))?;
            if let Some(text) = parsed.literal() {
                let number_ok = match (*name, c.command) {
                    ("by", RedisCommand::Zincrby) | ("score", _) => text.parse::<f64>().is_ok(),
                    ("by", _) => text.parse::<i64>().is_ok(),
                    _ => true,
                };
                if !number_ok {
                    return Err(format!("`{name}` = {text:?} is not a number"));
                }
            }
            arguments.push(parsed);
        }
        if let Some(message) = c.ttl_s.and_then(|ttl| ttl.out_of_bounds("ttl_s")) {
            return Err(message);
        }
        if let Some(fields) = &c.fields {
            if fields.is_empty() {
                return Err("`fields` must name at least one column".into());
            }
            if let Some(f) = fields.iter().find(|f| !target.columns.contains_key(*f)) {
                return Err(format!(
                    "`fields` names `{f}`, which the target does not declare"
                ));
            }
        }
        if guarantee == Guarantee::AtLeastOnce && !c.command.is_idempotent() {
            return Err(format!(
                "`{command}` is not idempotent, and `guarantee = \"at-least-once\"` may run a \
                 batch's commands twice after a crash: use `guarantee = \"exactly-once\"` (the \
                 default) or an idempotent command (set, hset, sadd, pfadd, zadd, del)"
            ));
        }
        Ok(CompiledCommand {
            command: c.command,
            key,
            arguments,
            ttl_s: c.ttl_s.map(|ttl| ttl.get()),
            fields: c
                .fields
                .clone()
                .unwrap_or_else(|| target.columns.keys().cloned().collect()),
        })
    }
}

/// A batch's commands in the commit script's layout (see `commit.lua`).
///
/// Commands are grouped to spare the script calls: the members of
/// consecutive SADDs (PFADDs, ZADDs, HSETs) to one key become one variadic
/// call, and consecutive increments of one counter are summed. Only
/// commands with no other command to the same key between them are
/// grouped, so the result is the one the rows give in order (commands to
/// different keys commute).
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
    groups: Vec<Group>,
    /// Per key, the group a next command of the same kind may join.
    open: HashMap<usize, usize>,
}

/// One script call: a command, its key and its arguments.
struct Group {
    command: RedisCommand,
    key: usize,
    arguments: Vec<Vec<u8>>,
    /// Increments: field -> position of its sum in `sums`.
    sum_of: HashMap<Vec<u8>, usize>,
    sums: Vec<(Vec<u8>, i64)>,
}

/// Most arguments one grouped call takes (Lua's `unpack` has a limit).
const MAX_GROUP_ARGUMENTS: usize = 1000;

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
        let mut g = self.group_for(key, &op);
        match op.command {
            RedisCommand::Incrby | RedisCommand::Hincrby => {
                let by = op.arguments.last().expect("increments take `by`");
                let by: i64 = std::str::from_utf8(by)
                    .ok()
                    .and_then(|b| b.parse().ok())
                    .expect("checked by check_numbers");
                let field = match op.command {
                    RedisCommand::Hincrby => op.arguments[0].clone(),
                    _ => Vec::new(),
                };
                let summed = |group: &Group| {
                    let at = group.sum_of.get(&field).copied();
                    at.is_none_or(|at| group.sums[at].1.checked_add(by).is_some())
                };
                if !summed(&self.groups[g]) {
                    // The sum would overflow: a call of its own, in order.
                    self.open.remove(&key);
                    g = self.group_for(key, &op);
                }
                let group = &mut self.groups[g];
                let at = *group.sum_of.entry(field.clone()).or_insert_with(|| {
                    group.sums.push((field, 0));
                    group.sums.len() - 1
                });
                group.sums[at].1 += by;
            }
            RedisCommand::Set => {
                let group = &mut self.groups[g];
                group.arguments.extend(op.arguments);
                group.arguments.push(
                    op.ttl_s
                        .map(|t| t.to_string())
                        .unwrap_or_default()
                        .into_bytes(),
                );
            }
            _ => self.groups[g].arguments.extend(op.arguments),
        }
        Ok(())
    }

    /// The group `op` joins: the key's open group if it is of the same
    /// command and has room, else a new one (which becomes the key's open
    /// group).
    fn group_for(&mut self, key: usize, op: &Op) -> usize {
        let variadic = matches!(
            op.command,
            RedisCommand::Sadd
                | RedisCommand::Pfadd
                | RedisCommand::Zadd
                | RedisCommand::Hset
                | RedisCommand::Incrby
                | RedisCommand::Hincrby
        );
        if variadic && let Some(&g) = self.open.get(&key) {
            let group = &self.groups[g];
            let room = group.arguments.len() + 2 * group.sums.len() + op.arguments.len()
                <= MAX_GROUP_ARGUMENTS;
            if group.command == op.command && room {
                return g;
            }
        }
        self.groups.push(Group {
            command: op.command,
            key,
            arguments: Vec::new(),
            sum_of: HashMap::new(),
            sums: Vec::new(),
        });
        let g = self.groups.len() - 1;
        self.open.insert(key, g);
        g
    }

    /// How many calls the script makes.
    pub fn call_count(&self) -> usize {
        self.groups.len()
    }

    /// The calls, flattened: name, key index, argument count, arguments.
    pub fn into_calls(self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        for g in self.groups {
            out.push(g.command.as_str().as_bytes().to_vec());
            out.push((g.key + 4).to_string().into_bytes());
            let sums = g
                .sums
                .iter()
                .flat_map(|(field, sum)| {
                    let sum = sum.to_string().into_bytes();
                    match g.command {
                        RedisCommand::Hincrby => vec![field.clone(), sum],
                        _ => vec![sum],
                    }
                })
                .collect::<Vec<_>>();
            out.push((g.arguments.len() + sums.len()).to_string().into_bytes());
            out.extend(g.arguments);
            out.extend(sums);
        }
        out
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

/// A template with its placeholders resolved to column positions.
enum Part<'t> {
    Literal(&'t [u8]),
    Column(usize),
}

fn resolve<'t>(t: &'t Template, names: &[&str]) -> Vec<Part<'t>> {
    t.pieces
        .iter()
        .map(|p| match p {
            Piece::Literal(text) => Part::Literal(text.as_bytes()),
            Piece::Column(name) => Part::Column(
                names
                    .iter()
                    .position(|n| n == name)
                    .expect("templates name declared columns (checked at start)"),
            ),
        })
        .collect()
}

/// A command's key, arguments and (`xadd`) field columns, resolved.
type ResolvedCommand<'t> = (Vec<Part<'t>>, Vec<Vec<Part<'t>>>, Vec<usize>);

/// Every command of every row of `rows`, rendered, in row order.
pub fn ops_of(target: &CompiledTarget, rows: &TargetRows) -> Result<Vec<Op>, SinkError> {
    let declared = declared_columns(&target.config, rows)?;
    let names: Vec<&str> = declared.iter().map(|(c, _)| c.name.as_str()).collect();
    let columns: Vec<Vec<Value<'_>>> = declared.iter().map(|(c, _)| c.values().collect()).collect();
    let resolved: Vec<ResolvedCommand<'_>> = target
        .commands
        .iter()
        .map(|c| {
            let fields = c
                .fields
                .iter()
                .map(|f| names.iter().position(|n| n == f).expect("checked at start"))
                .collect();
            let arguments = c.arguments.iter().map(|t| resolve(t, &names)).collect();
            (resolve(&c.key, &names), arguments, fields)
        })
        .collect();
    let name = &target.config.name;
    let mut ops = Vec::with_capacity(rows.rows as usize * target.commands.len());
    for row in 0..rows.rows as usize {
        for (c, (key, arguments, fields)) in target.commands.iter().zip(&resolved) {
            let render = |parts: &[Part<'_>], template: &Template| {
                render(parts, &columns, row).map_err(|column| {
                    SinkError::Config(format!(
                        "target `{name}`: column `{}` is null in a row, so template {:?} \
                         cannot be built",
                        names[column], template.source
                    ))
                })
            };
            let key = render(key, &c.key)?;
            if key.is_empty() {
                return Err(SinkError::Config(format!(
                    "target `{name}`: key {:?} renders empty for a row",
                    c.key.source
                )));
            }
            let mut rendered = Vec::with_capacity(arguments.len());
            for (parts, template) in arguments.iter().zip(&c.arguments) {
                rendered.push(render(parts, template)?);
            }
            check_numbers(c, &rendered, name)?;
            if c.command == RedisCommand::Xadd {
                rendered = entry_fields(fields, &names, &columns, row);
                if rendered.is_empty() {
                    return Err(SinkError::Config(format!(
                        "target `{name}`: every field of a stream entry is null"
                    )));
                }
            }
            ops.push(Op {
                command: c.command,
                key,
                arguments: rendered,
                ttl_s: c.ttl_s,
            });
        }
    }
    Ok(ops)
}

/// `xadd`'s field/value pairs; null columns are left out of the entry.
fn entry_fields(
    fields: &[usize],
    names: &[&str],
    columns: &[Vec<Value<'_>>],
    row: usize,
) -> Vec<Vec<u8>> {
    let mut out = Vec::with_capacity(2 * fields.len());
    for &f in fields {
        let mut bytes = Vec::new();
        if write_value(columns[f][row], &mut bytes) {
            out.push(names[f].as_bytes().to_vec());
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
        if *name != "by" && *name != "score" {
            continue;
        }
        let text = std::str::from_utf8(value).unwrap_or("");
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

/// The template's bytes for `row`; `Err(column)` if a placeholder's
/// column is null there.
fn render(parts: &[Part<'_>], columns: &[Vec<Value<'_>>], row: usize) -> Result<Vec<u8>, usize> {
    let mut out = Vec::with_capacity(32);
    for part in parts {
        match *part {
            Part::Literal(text) => out.extend_from_slice(text),
            Part::Column(c) => {
                if !write_value(columns[c][row], &mut out) {
                    return Err(c);
                }
            }
        }
    }
    Ok(out)
}

/// Appends a cell as Redis stores it; false for null.
fn write_value(value: Value<'_>, out: &mut Vec<u8>) -> bool {
    use std::io::Write;
    match value {
        Value::Null => return false,
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(f) => {
            let _ = write!(out, "{f}");
        }
        Value::Text(t) => out.extend_from_slice(t.as_bytes()),
        Value::Bytes(b) => out.extend_from_slice(b),
        Value::Bool(b) => out.push(if b { b'1' } else { b'0' }),
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::section::RedisSection;
    use sluice_core::config::{KindSection, PipelineConfig};
    use sluice_core::testing::words_output;

    fn target(commands: &str) -> CompiledTarget {
        let text = format!(
            "pipeline = \"p\"\n[source]\nbrokers = \"b\"\ntopics = [\"t\"]\n[module]\npath = \"m.wasm\"\n\
             [sink]\nurl = \"redis://127.0.0.1/0\"\n[[sink.targets]]\nname = \"counts\"\n\
             columns = {{ word = \"text\", n = \"integer\" }}\n{commands}"
        );
        let config = PipelineConfig::parse(&text).unwrap();
        let target = &config.sink.targets[0];
        let fields = RedisSection::target(target).unwrap();
        CompiledTarget::new(target, &fields, config.sink.guarantee()).unwrap()
    }

    fn calls(commands: &str, words: &[(&str, i64)]) -> Vec<String> {
        let mut r = Rendered::default();
        let out = words_output("counts", words);
        r.add(&target(commands), &out.targets[0]).unwrap();
        r.into_calls()
            .iter()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    #[test]
    fn commands_to_one_key_group_and_increments_sum() {
        let got = calls(
            "[[sink.targets.redis]]\ncommand = \"sadd\"\nkey = \"k\"\nmember = \"{word}\"\n\
             [[sink.targets.redis]]\ncommand = \"hincrby\"\nkey = \"h\"\nfield = \"{word}\"\nby = \"{n}\"\n",
            &[("a", 1), ("b", 2), ("a", 3)],
        );
        assert_eq!(
            got,
            [
                "sadd", "4", "3", "a", "b", "a", "hincrby", "5", "4", "a", "4", "b", "2"
            ]
        );
    }

    #[test]
    fn another_command_to_the_same_key_keeps_the_order() {
        let got = calls(
            "[[sink.targets.redis]]\ncommand = \"sadd\"\nkey = \"s:{word}\"\nmember = \"{n}\"\n\
             [[sink.targets.redis]]\ncommand = \"del\"\nkey = \"s:{word}\"\n",
            &[("a", 1), ("a", 2)],
        );
        assert_eq!(
            got,
            [
                "sadd", "4", "1", "1", "del", "4", "0", "sadd", "4", "1", "2", "del", "4", "0"
            ]
        );
    }

    #[test]
    fn a_key_written_as_two_types_is_refused_before_the_script() {
        let mut r = Rendered::default();
        let out = words_output("counts", &[("a", 1)]);
        let t = target(
            "[[sink.targets.redis]]\ncommand = \"sadd\"\nkey = \"k\"\nmember = \"{word}\"\n\
             [[sink.targets.redis]]\ncommand = \"incrby\"\nkey = \"k\"\n",
        );
        let err = r.add(&t, &out.targets[0]).unwrap_err().to_string();
        assert!(err.contains("written as a set and as a string"), "{err}");
    }
}
