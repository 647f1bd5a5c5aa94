//! A stateful transform for the host's keyed-state tests: it counts the
//! records of each key per partition in state and writes one row per
//! record, `tallies` (partition, offset, key, n): the record's key and how
//! many records of that key its partition has had so far, this one
//! included. A test recomputes every row and the final state from the
//! input alone, so a lost or doubled state write shows as a wrong `n`.
//!
//! Params (all optional):
//! - `"dedupe_ttl_ms": T`: instead of counting, pass a key's first record
//!   and drop its repeats for T ms of record time (state with expiry): a
//!   passed record's row has n = 1, a dropped one gives no row.
//! - `"poison": "V"`: a record whose value is V traps (after a state write,
//!   which must not land).
//! - `"big": N`: a record whose value is `big` stores N bytes under its key.
//! - `"forget": "V"`: a record whose value is V deletes its key's count.

use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};

#[derive(Default)]
struct Tally {
    dedupe_ttl_ms: Option<i64>,
    poison: Option<String>,
    big: usize,
    forget: Option<String>,
}

impl Transform for Tally {
    fn init(params: &Params) -> Result<Self, String> {
        let p: serde_json::Value =
            serde_json::from_str(params.json()).map_err(|e| format!("tally params: {e}"))?;
        let text = |name: &str| p.get(name).and_then(|v| v.as_str()).map(str::to_string);
        Ok(Tally {
            dedupe_ttl_ms: p.get("dedupe_ttl_ms").and_then(|v| v.as_i64()),
            poison: text("poison"),
            big: p.get("big").and_then(|v| v.as_u64()).unwrap_or(0) as usize,
            forget: text("forget"),
        })
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target(
            "tallies",
            &[
                ("partition", Kind::Int64),
                ("offset", Kind::Int64),
                ("key", Kind::Bytes),
                ("n", Kind::Int64),
            ],
        );
        for r in batch.records() {
            let key = r.key.unwrap_or_default();
            let value = r.value.unwrap_or_default();
            let state = r.state();
            if self
                .forget
                .as_deref()
                .is_some_and(|f| f.as_bytes() == value)
            {
                state.delete(key);
                continue;
            }
            let n = match self.dedupe_ttl_ms {
                Some(ttl) => {
                    if state.get(key).is_some() {
                        continue;
                    }
                    state.set_expiring(key, b"1", r.timestamp + ttl);
                    1
                }
                None => {
                    let n = state.get_i64(key).unwrap_or(0) + 1;
                    state.set_i64(key, n);
                    n
                }
            };
            if self
                .poison
                .as_deref()
                .is_some_and(|p| p.as_bytes() == value)
            {
                panic!("poison record at offset {}", r.offset);
            }
            if self.big > 0 && value == b"big" {
                state.set(key, &vec![b'x'; self.big]);
            }
            out.row(t)
                .int(r.partition.into())
                .int(r.offset)
                .bytes(key)
                .int(n);
        }
        Ok(())
    }
}

sluice_plugin::export!(Tally);
