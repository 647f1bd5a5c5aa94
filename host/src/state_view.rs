//! How keyed state is shown to a user, by `sluice test` (what a sample's
//! batch wrote) and `sluice state` (what a sink holds): one key per line,
//! as text or one JSON object. Bytes that are UTF-8 are shown as text,
//! others as hex, as a sample line gives them ([`put_bytes`], which the
//! dead letters' JSON uses too).
//!
//! It must not read state: its callers hand it what they read.

use serde_json::{Value as Json, json};
use sluice_core::batch::TopicPartition;
use sluice_core::state::StateValue;

/// One key of a partition's state: its value, or its deletion.
pub struct StateLine<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub key: &'a [u8],
    /// `None`: deleted (what a batch wrote) or absent (a lookup).
    pub value: Option<&'a StateValue>,
}

impl<'a> StateLine<'a> {
    /// The line of `key` in `tp`.
    pub fn of(tp: &'a TopicPartition, key: &'a [u8], value: Option<&'a StateValue>) -> Self {
        StateLine {
            topic: &tp.topic,
            partition: tp.partition,
            key,
            value,
        }
    }

    /// `{topic, partition, key | key_hex, value | value_hex (null when
    /// deleted or absent), expires_at_ms}`.
    pub fn json(&self) -> Json {
        let mut fields = serde_json::Map::new();
        fields.insert("topic".into(), json!(self.topic));
        fields.insert("partition".into(), json!(self.partition));
        put_bytes(&mut fields, "key", Some(self.key));
        put_bytes(&mut fields, "value", self.value.map(|v| v.value.as_slice()));
        let expires_at_ms = self.value.and_then(|v| v.expires_at_ms);
        fields.insert("expires_at_ms".into(), json!(expires_at_ms));
        Json::Object(fields)
    }

    /// `TOPIC:PARTITION "key" = "value" (expires at MS)`; `absent` names
    /// what a missing value means to the caller (`deleted`, `absent`).
    pub fn line(&self, absent: &str) -> String {
        let value = match self.value {
            None => absent.to_string(),
            Some(v) => match v.expires_at_ms {
                Some(at) => format!("= {} (expires at {at})", shown(&v.value)),
                None => format!("= {}", shown(&v.value)),
            },
        };
        format!(
            "{}:{} {} {value}",
            self.topic,
            self.partition,
            shown(self.key)
        )
    }
}

/// Text in quotes (escaped) if UTF-8, else `0x` and hex.
fn shown(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("0x{}", hex::encode(bytes)),
    }
}

/// Puts `bytes` into `object` as `name` (text) if UTF-8, else as
/// `name_hex` (hex); `None` as `name: null`.
pub fn put_bytes(object: &mut serde_json::Map<String, Json>, name: &str, bytes: Option<&[u8]>) {
    let value = match bytes {
        None => Json::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(text) => text.into(),
            Err(_) => {
                object.insert(format!("{name}_hex"), hex::encode(b).into());
                return;
            }
        },
    };
    object.insert(name.to_string(), value);
}
