//! A deliberately misbehaving transform for the host's tests: it exists only
//! to prove the sandbox's limits (fuel, memory, traps, declared errors).
//!
//! Params: `{"mode": "..."}`:
//! - `"spin"`: loops forever (stopped by fuel or the epoch deadline)
//! - `"bomb"`: allocates until the memory cap stops it
//! - `"poison"`: passes records through, but on a value containing
//!   `poison-spin` loops forever (fuel), on one containing `poison-bomb`
//!   allocates until the memory cap stops it, on one containing
//!   `poison-recurse` recurses until the Wasm stack is exhausted, on one
//!   containing `poison-hungry` uses 100 MiB and then passes it through
//!   (a record that fits some caps and not others), and traps on any other
//!   value containing `poison` (the host bisects and dead-letters each)
//! - `"flood"`: for a record whose value is `flood:N`, N rows of one
//!   boolean column into target `flood` (`flag`); other records write
//!   nothing. The host must not need much more memory than the module.
//! - `"wide"`: for a record whose value is `wide:N`, one row of target
//!   `wide` whose text column `text` holds N bytes
//! - `"floats"`: one row per record into target `floats` (`offset`, `x`):
//!   the value parsed as a float (`NaN`, `inf`, `-0` included), null if it
//!   is not one
//! - `"hungry"`: needs 100 MiB of memory in `init` (a host whose cap is
//!   lower cannot run it), then passes every value through like `echo`
//! - `"raw"`: like `echo`, but writes each value's bytes into the text
//!   column as they are (`Row::bytes`, unchecked): a value that is not
//!   UTF-8 breaks the output contract on that record alone
//! - `"shout"`: like `echo`, and logs an 8 MiB line for every record (the
//!   host keeps each line cut to 4 KiB)
//! - `"timers"`: for a record whose value is `timers:N`, sets N event-time
//!   timers on its partition, keys of 240 bytes (`offset.i` then dots),
//!   far in the future (4e12 + i ms); `timers:N:V` keeps V bytes with each
//!   (`set-timer-value`); a record whose value is `flush` has
//!   the event time 5e12 (past them all); each timer that comes due is one
//!   row of target `fired` (`timer`: the key without its dots, then
//!   `=V` if it kept V bytes, all as set; `at_ms`).
//!   The host must not hold every timer, nor every value, in memory.
//! - `"fail"`: returns a declared, non-retryable batch error
//! - `"echo"`: passes every value through as text (the default)

use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};

struct Hostile {
    mode: String,
}

fn mode_of(json: &str) -> Option<String> {
    // Tiny hand parse: this plugin must stay free of dependencies.
    let at = json.find("\"mode\"")?;
    let rest = &json[at + 6..];
    let start = rest.find('"')? + 1;
    let end = rest[start..].find('"')? + start;
    Some(rest[start..end].to_string())
}

impl Transform for Hostile {
    fn init(params: &Params) -> Result<Self, String> {
        let mode = mode_of(params.json()).unwrap_or_else(|| "echo".to_string());
        match mode.as_str() {
            "hungry" => {
                let appetite = vec![1u8; 100 << 20];
                std::hint::black_box(&appetite);
                Ok(Hostile { mode })
            }
            "spin" | "bomb" | "poison" | "flood" | "wide" | "floats" | "fail" | "echo" | "raw"
            | "shout" | "timers" => Ok(Hostile { mode }),
            other => Err(format!("unknown mode `{other}`")),
        }
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        match self.mode.as_str() {
            "spin" => spin(batch.len() as u64),
            "bomb" => bomb(),
            "fail" => return Err(BatchError::fatal("hostile plugin refuses this batch")),
            "timers" => {
                timers(batch, out);
                return Ok(());
            }
            "flood" => {
                let t = out.target("flood", &[("flag", Kind::Bool)]);
                for r in batch.records() {
                    let value = std::str::from_utf8(r.value.unwrap_or_default()).unwrap_or("");
                    let n: u64 = value
                        .strip_prefix("flood:")
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    for i in 0..n {
                        out.row(t).bool(i % 3 == 0);
                    }
                }
                return Ok(());
            }
            "wide" => {
                let t = out.target("wide", &[("text", Kind::Text)]);
                for r in batch.records() {
                    let value = std::str::from_utf8(r.value.unwrap_or_default()).unwrap_or("");
                    if let Some(n) = value.strip_prefix("wide:").and_then(|n| n.parse().ok()) {
                        out.row(t).text(&"w".repeat(n));
                    }
                }
                return Ok(());
            }
            "floats" => {
                let t = out.target("floats", &[("offset", Kind::Int64), ("x", Kind::Float64)]);
                for r in batch.records() {
                    let text = std::str::from_utf8(r.value.unwrap_or_default()).unwrap_or("");
                    let row = out.row(t).int(r.offset);
                    match text.trim().parse::<f64>() {
                        Ok(x) => row.float(x),
                        Err(_) => row.null(),
                    };
                }
                return Ok(());
            }
            _ => {}
        }
        let t = out.target("echo", &[("offset", Kind::Int64), ("value", Kind::Text)]);
        for r in batch.records() {
            let value = r.value.unwrap_or_default();
            match self.mode.as_str() {
                "poison" => poison(value, r.offset),
                "raw" => {
                    out.row(t).int(r.offset).bytes(value);
                    continue;
                }
                "shout" => sluice_plugin::log::info(&"!".repeat(8 << 20)),
                _ => {}
            }
            out.row(t)
                .int(r.offset)
                .text(&String::from_utf8_lossy(value));
        }
        Ok(())
    }
}

/// Sets the timers records ask for and writes a row per timer due.
fn timers(batch: &Batch, out: &mut Output) {
    let t = out.target("fired", &[("timer", Kind::Text), ("at_ms", Kind::Int64)]);
    for r in batch.records() {
        let value = std::str::from_utf8(r.value.unwrap_or_default()).unwrap_or("");
        if value == "flush" {
            r.time().set_event_time(5_000_000_000_000);
        }
        let Some(ask) = value.strip_prefix("timers:") else {
            continue;
        };
        let (n, kept) = ask.split_once(':').unwrap_or((ask, "0"));
        let (Ok(n), Ok(kept)) = (n.parse::<i64>(), kept.parse::<usize>()) else {
            continue;
        };
        let kept = vec![b'v'; kept];
        for i in 0..n {
            let key = format!("{:.<240}", format!("{}.{i}", r.offset));
            r.time()
                .set_timer_value(key.as_bytes(), 4_000_000_000_000 + i, &kept);
        }
    }
    for timer in sluice_plugin::due_timers() {
        let key = String::from_utf8_lossy(&timer.key);
        let key = key.trim_end_matches('.');
        let row = out.row(t);
        let row = match timer.value.len() {
            0 => row.text(key),
            _ if timer.value.iter().all(|b| *b == b'v') => {
                row.text(&format!("{key}={}", timer.value.len()))
            }
            _ => row.text(&format!("{key}=garbled")),
        };
        row.int(timer.at_ms);
    }
}

/// Misbehaves on this one record as its value says (see the header).
fn poison(value: &[u8], offset: i64) {
    let has = |needle: &[u8]| value.windows(needle.len()).any(|w| w == needle);
    if has(b"poison-spin") {
        spin(offset as u64);
    }
    if has(b"poison-bomb") {
        bomb();
    }
    if has(b"poison-recurse") {
        std::hint::black_box(recurse(offset as u64, 1, 2));
    }
    if has(b"poison-hungry") {
        std::hint::black_box(vec![1u8; 100 << 20]);
        return;
    }
    if has(b"poison") {
        panic!("poison record at offset {offset}");
    }
}

fn spin(seed: u64) -> ! {
    let mut x = seed;
    loop {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

/// Recurses, keeping every frame (the result is used after the call) and
/// its values in Wasm locals (nothing address-taken, so the guest's own
/// shadow stack in linear memory stays small), until the Wasm stack limit
/// traps.
#[inline(never)]
fn recurse(depth: u64, a: u64, b: u64) -> u64 {
    if depth == u64::MAX {
        return a;
    }
    let deeper = recurse(depth + 1, a ^ depth, b.wrapping_add(a));
    deeper.wrapping_mul(b | 1) ^ a
}

fn bomb() -> ! {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![1u8; 1 << 20]);
        std::hint::black_box(&hoard);
    }
}

sluice_plugin::export!(Hostile);
