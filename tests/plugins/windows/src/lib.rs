//! A windowed transform for the host's event-time tests: per record key,
//! the sum and count of the records' `amount` in windows of event time,
//! one row per window, `windows` (partition, key, start_ms, end_ms, total,
//! records, emit), written once when the watermark passes the window's end
//! (`emit` = `final`), and with `"early": true` also on each batch that
//! changes an open window (`early`); with `"retain_ms": R`, on each batch
//! whose late records change a window closed less than R ago (`update`).
//! A test recomputes every final row, every window's last value and every
//! late record from the input alone.
//!
//! Records: a key, and a JSON value `{"amount": N}` (optionally `"ts"`:
//! the event time, with `"time_field": "ts"`; else the Kafka timestamp).
//! A value that is not such JSON is rejected.
//!
//! Params: `"windows"`: `"tumbling"` (with `"size_ms"`), `"hopping"`
//! (`"size_ms"`, `"hop_ms"`) or `"session"` (`"gap_ms"`); `"early"`;
//! `"retain_ms"`; `"time_field"`. With `"legacy_layout": true` (tumbling
//! only) it stands in for a module built with an SDK before contract
//! 0.1.3: it opens windows in that layout (the aggregate under
//! `sluice/w/` + end + key, a timer without a value) and closes none, so a
//! test can hand such windows over to the current SDK.

use sluice_plugin::window::{Accumulator, Aggregate, Emit, Taken, Windowed, Windows};
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Record, Transform};

/// Sum and count, 16 bytes: two big-endian i64.
struct SumCount {
    total: i64,
    records: i64,
}

impl Accumulator for SumCount {
    fn to_bytes(&self) -> Vec<u8> {
        [self.total.to_be_bytes(), self.records.to_be_bytes()].concat()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(SumCount {
            total: i64::from_be_bytes(bytes.get(..8)?.try_into().ok()?),
            records: i64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?),
        })
    }
}

/// A record's value: `{"amount": N}`, with the event time under
/// `time_field` if there is one.
fn parse(record: &Record<'_>) -> Option<serde_json::Value> {
    serde_json::from_slice::<serde_json::Value>(record.value?)
        .ok()
        .filter(|v| v.get("amount").is_some_and(|a| a.is_i64()))
}

/// What a record's value brings when the time field is `ts` or none:
/// parsed into a struct (no tree of the whole value, the way a user's
/// module would), with the same verdicts as [`parse`].
#[derive(serde::Deserialize)]
struct Spent {
    amount: i64,
    /// Any JSON: a time only if it is an integer.
    #[serde(default)]
    ts: TimeValue,
}

/// A JSON value, an event time if it is an integer (else none), read
/// without building a tree of it.
#[derive(Default)]
struct TimeValue(Option<i64>);

impl<'de> serde::Deserialize<'de> for TimeValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TimeVisitor)
    }
}

struct TimeVisitor;

impl<'de> serde::de::Visitor<'de> for TimeVisitor {
    type Value = TimeValue;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_i64<E>(self, v: i64) -> Result<TimeValue, E> {
        Ok(TimeValue(Some(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<TimeValue, E> {
        Ok(TimeValue(i64::try_from(v).ok()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<TimeValue, E> {
        Ok(TimeValue(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<TimeValue, E> {
        Ok(TimeValue(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<TimeValue, E> {
        Ok(TimeValue(None))
    }
    fn visit_unit<E>(self) -> Result<TimeValue, E> {
        Ok(TimeValue(None))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<TimeValue, A::Error> {
        while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
        Ok(TimeValue(None))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<TimeValue, A::Error> {
        while (map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?).is_some() {}
        Ok(TimeValue(None))
    }
}

struct Spend;

impl Aggregate for Spend {
    type Acc = SumCount;
    /// The amount.
    type Input = i64;
    fn init(&self) -> SumCount {
        SumCount {
            total: 0,
            records: 0,
        }
    }
    fn add(&self, acc: &mut SumCount, amount: &i64) {
        acc.total += amount;
        acc.records += 1;
    }
    fn merge(&self, acc: &mut SumCount, other: SumCount) {
        acc.total += other.total;
        acc.records += other.records;
    }
}

struct WindowSums {
    windowed: Windowed<Spend>,
    time_field: Option<String>,
    /// The window size, when standing in for a module built before 0.1.3.
    legacy_size_ms: Option<i64>,
}

impl WindowSums {
    /// A record's amount and, with a time field, its event time if the
    /// field holds an integer; `None`: not JSON with an integer `amount`.
    fn event(&self, record: &Record<'_>) -> Option<(i64, Option<i64>)> {
        match self.time_field.as_deref() {
            None | Some("ts") => {
                let spent: Spent = serde_json::from_slice(record.value?).ok()?;
                let time = spent.ts.0;
                Some((spent.amount, time.filter(|_| self.time_field.is_some())))
            }
            Some(field) => {
                let v = parse(record)?;
                Some((v["amount"].as_i64()?, v.get(field).and_then(|t| t.as_i64())))
            }
        }
    }

    /// Adds each record to its tumbling window the way the SDKs before
    /// contract 0.1.3 kept it (docs/event-time.md): no lateness, no
    /// closing (the test keeps every window of this part open).
    fn open_legacy_windows(&self, batch: &Batch, size_ms: i64) {
        for record in batch.records() {
            let Some(v) = parse(&record) else {
                record.time().clear_event_time();
                continue;
            };
            let field = self.time_field.as_deref().unwrap_or("ts");
            let time = v
                .get(field)
                .and_then(|t| t.as_i64())
                .unwrap_or(record.timestamp);
            record.time().set_event_time(time);
            let end = time - time.rem_euclid(size_ms) + size_ms;
            let key = record.key.unwrap_or_default();
            let ordered = ((end as u64) ^ (1 << 63)).to_be_bytes();
            let at = [&b"sluice/w/"[..], &ordered, key].concat();
            let state = record.state();
            let stored = state.get(&at);
            if stored.is_none() {
                record.time().set_timer(key, end - 1);
            }
            let mut acc = (stored.as_deref())
                .and_then(SumCount::from_bytes)
                .unwrap_or_else(|| Spend.init());
            Spend.add(&mut acc, &v["amount"].as_i64().unwrap_or_default());
            state.set(&at, &acc.to_bytes());
        }
    }
}

impl Transform for WindowSums {
    fn init(params: &Params) -> Result<Self, String> {
        let p: serde_json::Value =
            serde_json::from_str(params.json()).map_err(|e| format!("windows params: {e}"))?;
        let ms = |name: &str| {
            p.get(name)
                .and_then(|v| v.as_i64())
                .filter(|v| *v > 0)
                .ok_or(format!(
                    "windows params: `{name}` must be a positive integer"
                ))
        };
        let windows = match p.get("windows").and_then(|v| v.as_str()) {
            Some("tumbling") => Windows::Tumbling {
                size_ms: ms("size_ms")?,
            },
            Some("hopping") => Windows::Hopping {
                size_ms: ms("size_ms")?,
                hop_ms: ms("hop_ms")?,
            },
            Some("session") => Windows::Session {
                gap_ms: ms("gap_ms")?,
            },
            _ => return Err("windows params: `windows` is tumbling, hopping or session".into()),
        };
        let legacy_size_ms = match (windows, p.get("legacy_layout")) {
            (Windows::Tumbling { size_ms }, Some(serde_json::Value::Bool(true))) => Some(size_ms),
            (_, Some(serde_json::Value::Bool(true))) => {
                return Err("windows params: `legacy_layout` is for tumbling windows".into());
            }
            _ => None,
        };
        let early = p.get("early").and_then(|v| v.as_bool()).unwrap_or(false);
        let retain_ms = p.get("retain_ms").and_then(|v| v.as_i64()).unwrap_or(0);
        Ok(WindowSums {
            windowed: Windowed::new(windows, Spend).early(early).retain(retain_ms),
            time_field: p
                .get("time_field")
                .and_then(|v| v.as_str())
                .map(str::to_string),
            legacy_size_ms,
        })
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        if let Some(size_ms) = self.legacy_size_ms {
            self.open_legacy_windows(batch, size_ms);
            return Ok(());
        }
        let t = out.target(
            "windows",
            &[
                ("partition", Kind::Int64),
                ("key", Kind::Text),
                ("start_ms", Kind::Int64),
                ("end_ms", Kind::Int64),
                ("total", Kind::Int64),
                ("records", Kind::Int64),
                ("emit", Kind::Text),
            ],
        );
        self.windowed.run(
            batch,
            out,
            |r| match self.event(r) {
                Some((amount, time_ms)) => Taken::Event {
                    key: r.key.unwrap_or_default().to_vec(),
                    time_ms,
                    input: amount,
                },
                None => Taken::Rejected("the value is not JSON with an integer `amount`".into()),
            },
            |out, w| {
                let emit = match w.emit {
                    Emit::Early => "early",
                    Emit::Final => "final",
                    Emit::Update => "update",
                };
                out.row(t)
                    .int(w.partition as i64)
                    .text(&String::from_utf8_lossy(w.key))
                    .int(w.start_ms)
                    .int(w.end_ms)
                    .int(w.acc.total)
                    .int(w.acc.records)
                    .text(emit);
            },
        );
        Ok(())
    }
}

sluice_plugin::export!(WindowSums);
