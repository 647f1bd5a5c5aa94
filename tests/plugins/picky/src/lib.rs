//! A transform with a bug to fix, for the host's tests of dead letters and
//! their redrive. A record's value is a decimal number `n`; it becomes a
//! row of target `numbers` (n, partition, offset, timestamp) unless `n` is
//! a multiple of `reject_multiples_of`, which it rejects (the "bug"): the
//! fixed version is the same module with that param at 0. `spin` burns
//! that many rounds of arithmetic per record, so a test can catch a
//! redrive half-way. A value that is not a number is rejected too.
//!
//! Params: `{"reject_multiples_of": 5, "spin": 0}` (both optional, 0 = off).

use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};

#[derive(Default)]
struct Picky {
    reject_multiples_of: i64,
    spin: u64,
}

fn param(json: &str, name: &str) -> Result<u64, String> {
    // The params are tiny and fixed; no JSON crate needed.
    let Some(at) = json.find(&format!("\"{name}\"")) else {
        return Ok(0);
    };
    let rest = json[at + name.len() + 2..]
        .trim_start()
        .trim_start_matches(':');
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .map_err(|_| format!("picky params: `{name}` must be a whole number"))
}

impl Transform for Picky {
    fn init(params: &Params) -> Result<Self, String> {
        Ok(Picky {
            reject_multiples_of: param(params.json(), "reject_multiples_of")? as i64,
            spin: param(params.json(), "spin")?,
        })
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target(
            "numbers",
            &[
                ("n", Kind::Int64),
                ("partition", Kind::Int64),
                ("offset", Kind::Int64),
                ("timestamp", Kind::Int64),
            ],
        );
        for r in batch.records() {
            let mut acc = r.offset as u64;
            for i in 0..self.spin {
                acc = std::hint::black_box(acc.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
            std::hint::black_box(acc);
            let text = std::str::from_utf8(r.value.unwrap_or_default()).unwrap_or("");
            let Ok(n) = text.parse::<i64>() else {
                out.reject(&r, "value is not a number");
                continue;
            };
            if self.reject_multiples_of > 0 && n % self.reject_multiples_of == 0 {
                out.reject(
                    &r,
                    format!("{n} is a multiple of {}", self.reject_multiples_of),
                );
                continue;
            }
            out.row(t)
                .int(n)
                .int(r.partition as i64)
                .int(r.offset)
                .int(r.timestamp);
        }
        Ok(())
    }
}

sluice_plugin::export!(Picky);
