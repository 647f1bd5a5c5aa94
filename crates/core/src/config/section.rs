//! A sink kind's own fields: the trait a backend crate implements to read
//! and check its part of `[sink]` and of each target, from the tables the
//! common part left ([`SinkConfig::settings`], [`TargetConfig::settings`]).
//! One reader serves every kind, so an unknown field is refused the same
//! way everywhere and one that belongs to another kind can be named so.
//!
//! It must not know any kind: the host, which knows them all, registers
//! them (`host/src/backends.rs`).

use super::sink::{SinkConfig, TargetConfig};
use super::{ConfigError, PipelineConfig};
use serde::de::{self, DeserializeOwned, Visitor};
use std::fmt;

/// A sink kind's own fields, declared and checked by the crate that owns
/// the kind.
pub trait KindSection {
    /// Who the fields are for, as an error names them ("SQL sinks").
    const FOR: &'static str;
    /// The kind's fields of `[sink]`.
    type Sink: DeserializeOwned;
    /// The kind's fields of each `[[sink.targets]]`.
    type Target: DeserializeOwned;
    /// Everything the kind checks of `config` without connecting: its
    /// fields read, and its rules over them and the common part.
    fn check(config: &PipelineConfig) -> Result<(), ConfigError>;

    /// The kind's fields of `[sink]`, read.
    fn sink(sink: &SinkConfig) -> Result<Self::Sink, ConfigError> {
        read::<Self::Sink>(&sink.settings, &Place::Sink, Self::FOR)
    }

    /// The kind's fields of `target`, read.
    fn target(target: &TargetConfig) -> Result<Self::Target, ConfigError> {
        let place = Place::Target(target.name.clone());
        read::<Self::Target>(&target.settings, &place, Self::FOR)
    }

    /// The names of the kind's fields at `place`.
    fn fields(place: &Place) -> &'static [&'static str] {
        match place {
            Place::Sink => fields_of::<Self::Sink>(),
            Place::Target(_) => fields_of::<Self::Target>(),
        }
    }
}

/// Where a kind's own fields sit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// `[sink]` itself.
    Sink,
    /// One `[[sink.targets]]`, by its name.
    Target(String),
}

impl Place {
    /// `field` at this place, as an error names it.
    pub fn name(&self, field: &str) -> String {
        match self {
            Place::Sink => format!("`sink.{field}`"),
            Place::Target(target) => format!("target `{target}`: `{field}`"),
        }
    }
}

/// Reads `T` from `table`, the fields of `place` the common part left. A
/// field `T` does not have is a [`ConfigError::Foreign`]; a value that
/// does not fit is [`ConfigError::Invalid`], naming the place.
pub fn read<T: DeserializeOwned>(
    table: &toml::Table,
    place: &Place,
    kind: &'static str,
) -> Result<T, ConfigError> {
    let known = fields_of::<T>();
    if let Some(field) = table.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ConfigError::Foreign {
            place: place.clone(),
            field: field.clone(),
            kind,
            owner: None,
        });
    }
    toml::Value::Table(table.clone())
        .try_into::<T>()
        .map_err(|e| {
            let at = match place {
                Place::Sink => "`sink`".to_string(),
                Place::Target(target) => format!("target `{target}`"),
            };
            ConfigError::Invalid(format!("{at}: {}", e.message().trim_end()))
        })
}

/// The field names `T`'s derived `Deserialize` asks for (empty if `T` is
/// not a struct): read by asking it to deserialize from a probe that
/// answers nothing but records the names.
pub fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    match T::deserialize(FieldProbe) {
        Err(Probed::Fields(fields)) => fields,
        _ => &[],
    }
}

struct FieldProbe;

#[derive(Debug)]
enum Probed {
    Fields(&'static [&'static str]),
    NotAStruct,
}

impl fmt::Display for Probed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field probe")
    }
}

impl std::error::Error for Probed {}

impl de::Error for Probed {
    fn custom<M: fmt::Display>(_: M) -> Self {
        Probed::NotAStruct
    }
}

impl<'de> de::Deserializer<'de> for FieldProbe {
    type Error = Probed;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Probed> {
        Err(Probed::NotAStruct)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Probed> {
        Err(Probed::Fields(fields))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Own {
        #[serde(default)]
        size: Option<u64>,
        #[serde(default)]
        colour: Option<String>,
    }

    fn table(text: &str) -> toml::Table {
        text.parse().unwrap()
    }

    #[test]
    fn the_probe_finds_a_structs_fields_and_nothing_else() {
        assert_eq!(fields_of::<Own>(), ["size", "colour"]);
        assert!(fields_of::<u64>().is_empty());
    }

    #[test]
    fn a_section_reads_its_fields_and_names_what_it_refuses() {
        type Case<'a> = (&'a str, Place, Result<Option<u64>, &'a str>);
        let cases: [Case; 5] = [
            ("", Place::Sink, Ok(None)),
            ("size = 3", Place::Sink, Ok(Some(3))),
            (
                "shape = 1",
                Place::Sink,
                Err("unknown field `shape` in `[sink]`: not a field of test sinks"),
            ),
            (
                "shape = 1",
                Place::Target("out".into()),
                Err("unknown field `shape` in target `out`: not a field of test sinks"),
            ),
            ("size = \"big\"", Place::Sink, Err("`sink`: invalid type")),
        ];
        for (text, place, expected) in cases {
            let got = read::<Own>(&table(text), &place, "test sinks");
            match (got, expected) {
                (Ok(own), Ok(size)) => assert_eq!((own.size, own.colour), (size, None), "{text}"),
                (Err(e), Err(says)) => {
                    let said = e.to_string();
                    assert!(said.contains(says), "{text}: {said}");
                }
                (got, expected) => panic!("{text}: {got:?}, expected {expected:?}"),
            }
        }
    }

    #[test]
    fn a_field_of_another_kind_is_named_with_its_owner() {
        let e = ConfigError::Foreign {
            place: Place::Target("out".into()),
            field: "kafka".into(),
            kind: "SQL sinks",
            owner: Some("Kafka sinks"),
        };
        assert_eq!(
            e.to_string(),
            "invalid config: target `out`: `kafka` is for Kafka sinks, not SQL sinks"
        );
    }
}
