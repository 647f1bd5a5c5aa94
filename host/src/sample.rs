//! The sample format: JSON lines, one Kafka record each, read by `sluice
//! test --input` and `sluice produce`, written by `sluice consume` and
//! `dead-letters show --sample`, so a sample, a topic and a dead letter are
//! interchangeable.
//!
//! Owns the fields and their parsing and writing. It must not decide what a
//! missing field means (a test's batch and a produce differ): that is the
//! reader's.

use serde_json::{Map, Value as Json};

/// One record of a sample, as the line gives it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SampleLine {
    pub topic: Option<String>,
    pub partition: Option<i32>,
    pub offset: Option<i64>,
    /// Milliseconds since the Unix epoch.
    pub timestamp: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    /// Name and value (or null), in order.
    pub headers: Headers,
}

/// A record's headers: name and value (or null), in order.
pub type Headers = Vec<(String, Option<Vec<u8>>)>;

const FIELDS: &[&str] = &[
    "topic",
    "partition",
    "offset",
    "timestamp",
    "key",
    "key_hex",
    "value",
    "value_hex",
    "headers",
];

/// The records of `text`, each with its line number: one JSON object per
/// line (blank lines and lines starting with `#` are skipped), with the
/// optional fields
/// - `value` / `key`: a string is taken as UTF-8 bytes, any other JSON
///   (object, array, number, boolean) as its compact JSON text, `null` or
///   absent as null; `value_hex` / `key_hex` give raw bytes instead;
/// - `topic` (a non-empty string), `partition` (0 or more), `offset` (0 or
///   more), `timestamp` (ms), `headers` (an object of string or null).
///
/// Returns the line number and message of the first bad line.
pub fn lines(text: &str) -> Result<Vec<(usize, SampleLine)>, (usize, String)> {
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        lines.push((n + 1, parse_line(trimmed).map_err(|m| (n + 1, m))?));
    }
    Ok(lines)
}

fn parse_line(line: &str) -> Result<SampleLine, String> {
    let json: Json = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let Json::Object(fields) = json else {
        return Err("a sample line must be a JSON object, like {\"value\": \"...\"}".into());
    };
    if let Some(unknown) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(format!(
            "unknown field `{unknown}` (known: {})",
            FIELDS.join(", ")
        ));
    }
    let topic = match fields.get("topic") {
        None | Some(Json::Null) => None,
        Some(Json::String(t)) if !t.is_empty() => Some(t.clone()),
        Some(other) => return Err(format!("`topic` must be a non-empty string, not {other}")),
    };
    let partition = match integer(&fields, "partition")? {
        None => None,
        Some(p) => Some(
            i32::try_from(p)
                .ok()
                .filter(|p| *p >= 0)
                .ok_or_else(|| format!("`partition` {p} is out of range"))?,
        ),
    };
    let offset = match integer(&fields, "offset")? {
        Some(o) if o < 0 => return Err(format!("`offset` {o} is negative")),
        offset => offset,
    };
    Ok(SampleLine {
        topic,
        partition,
        offset,
        timestamp: integer(&fields, "timestamp")?,
        key: bytes(&fields, "key")?,
        value: bytes(&fields, "value")?,
        headers: headers(&fields)?,
    })
}

fn integer(fields: &Map<String, Json>, name: &str) -> Result<Option<i64>, String> {
    match fields.get(name) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| format!("`{name}` must be an integer, not {v}")),
    }
}

fn bytes(fields: &Map<String, Json>, name: &str) -> Result<Option<Vec<u8>>, String> {
    let hex_name = format!("{name}_hex");
    match (fields.get(name), fields.get(&hex_name)) {
        (Some(_), Some(_)) => Err(format!("give `{name}` or `{hex_name}`, not both")),
        (_, Some(Json::String(h))) => hex::decode(h)
            .map(Some)
            .map_err(|e| format!("`{hex_name}` is not hex: {e}")),
        (_, Some(other)) => Err(format!("`{hex_name}` must be a hex string, not {other}")),
        (None | Some(Json::Null), None) => Ok(None),
        (Some(Json::String(s)), None) => Ok(Some(s.as_bytes().to_vec())),
        (Some(other), None) => Ok(Some(other.to_string().into_bytes())),
    }
}

fn headers(fields: &Map<String, Json>) -> Result<Headers, String> {
    match fields.get("headers") {
        None | Some(Json::Null) => Ok(Vec::new()),
        Some(Json::Object(h)) => h
            .iter()
            .map(|(name, v)| match v {
                Json::Null => Ok((name.clone(), None)),
                Json::String(s) => Ok((name.clone(), Some(s.as_bytes().to_vec()))),
                other => Err(format!(
                    "header `{name}` must be a string or null, not {other}"
                )),
            })
            .collect(),
        Some(other) => Err(format!("`headers` must be an object, not {other}")),
    }
}

impl SampleLine {
    /// The line, as `lines` reads it back to the same record: bytes that
    /// are UTF-8 as text, others as `_hex`. A header value that is not
    /// UTF-8 is written with its bad bytes replaced (the format has text
    /// headers only). A later value for a header name repeated replaces
    /// the earlier (a JSON object has each name once).
    pub fn to_json(&self) -> Json {
        let mut o = Map::new();
        if let Some(topic) = &self.topic {
            o.insert("topic".into(), topic.clone().into());
        }
        if let Some(partition) = self.partition {
            o.insert("partition".into(), partition.into());
        }
        if let Some(offset) = self.offset {
            o.insert("offset".into(), offset.into());
        }
        if let Some(timestamp) = self.timestamp {
            o.insert("timestamp".into(), timestamp.into());
        }
        crate::state_view::put_bytes(&mut o, "key", self.key.as_deref());
        crate::state_view::put_bytes(&mut o, "value", self.value.as_deref());
        if !self.headers.is_empty() {
            let headers: Map<String, Json> = self
                .headers
                .iter()
                .map(|(name, value)| {
                    let text = value
                        .as_deref()
                        .map(|v| Json::from(String::from_utf8_lossy(v).into_owned()));
                    (name.clone(), text.unwrap_or(Json::Null))
                })
                .collect();
            o.insert("headers".into(), headers.into());
        }
        o.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_written_reads_back_the_same() {
        let line = SampleLine {
            topic: Some("t".into()),
            partition: Some(3),
            offset: Some(7),
            timestamp: Some(1_700_000_000_000),
            key: Some(vec![0, 255]),
            value: Some(br#"{"json": "as text"}"#.to_vec()),
            headers: vec![("h".into(), Some(b"v".to_vec())), ("n".into(), None)],
        };
        let text = line.to_json().to_string();
        let read = lines(&text).unwrap();
        assert_eq!(read, vec![(1, line)]);
    }

    #[test]
    fn bad_lines_are_named() {
        for (text, expected) in [
            ("[1]", "must be a JSON object"),
            (r#"{"valeu": "x"}"#, "unknown field `valeu`"),
            (r#"{"key_hex": "zz"}"#, "not hex"),
            (r#"{"key": "a", "key_hex": "00"}"#, "not both"),
            (r#"{"partition": -1}"#, "out of range"),
            (r#"{"offset": -1}"#, "negative"),
            (r#"{"topic": ""}"#, "non-empty"),
        ] {
            let (line, message) = lines(text).unwrap_err();
            assert_eq!(line, 1);
            assert!(message.contains(expected), "{text}: {message}");
        }
    }
}
