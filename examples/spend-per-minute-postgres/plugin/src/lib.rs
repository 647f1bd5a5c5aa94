//! Spend per user per minute of event time: payments (`{"user", "cents",
//! "ts"}`, `ts` in ms since the epoch) summed in tumbling one-minute
//! windows per user, with the SDK's windows. Each window's row is upserted
//! on every batch that changes it (`final` = false: a dashboard's running
//! figure), then once more when the watermark passes the minute's end
//! (`final` = true). A payment for a minute already final still counts if
//! it comes within 90 s of event time after the minute closed (the row is
//! upserted again, as an update, still final); later than that it is a
//! `late` dead letter. A record that is not a payment is rejected.

use sluice_plugin::window::{Accumulator, Aggregate, Emit, Taken, Windowed, Windows};
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Record, Transform};

#[derive(serde::Deserialize)]
struct Payment {
    user: String,
    cents: i64,
    ts: i64,
}

fn payment(record: &Record<'_>) -> Option<Payment> {
    serde_json::from_slice::<Payment>(record.value?)
        .ok()
        .filter(|p| !p.user.is_empty())
}

/// Cents and payments, 16 bytes: two big-endian i64.
struct Spent {
    cents: i64,
    payments: i64,
}

impl Accumulator for Spent {
    fn to_bytes(&self) -> Vec<u8> {
        [self.cents.to_be_bytes(), self.payments.to_be_bytes()].concat()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(Spent {
            cents: i64::from_be_bytes(bytes.get(..8)?.try_into().ok()?),
            payments: i64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?),
        })
    }
}

struct Spend;

impl Aggregate for Spend {
    type Acc = Spent;
    /// The payment's cents.
    type Input = i64;
    fn init(&self) -> Spent {
        Spent {
            cents: 0,
            payments: 0,
        }
    }
    fn add(&self, acc: &mut Spent, cents: &i64) {
        acc.cents += cents;
        acc.payments += 1;
    }
    fn merge(&self, acc: &mut Spent, other: Spent) {
        acc.cents += other.cents;
        acc.payments += other.payments;
    }
}

struct SpendPerMinute {
    windowed: Windowed<Spend>,
}

impl Transform for SpendPerMinute {
    fn init(_params: &Params) -> Result<Self, String> {
        let minutes = Windows::Tumbling { size_ms: 60_000 };
        Ok(SpendPerMinute {
            windowed: Windowed::new(minutes, Spend).early(true).retain(90_000),
        })
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target(
            "spend_per_minute",
            &[
                ("user", Kind::Text),
                ("minute", Kind::Int64),
                ("cents", Kind::Int64),
                ("payments", Kind::Int64),
                ("final", Kind::Bool),
            ],
        );
        self.windowed.run(
            batch,
            out,
            |r| match payment(r) {
                Some(p) => Taken::Event {
                    key: p.user.into_bytes(),
                    time_ms: Some(p.ts),
                    input: p.cents,
                },
                None => {
                    Taken::Rejected("not a payment: {\"user\", \"cents\", \"ts\"} expected".into())
                }
            },
            |out, w| {
                out.row(t)
                    .text(&String::from_utf8_lossy(w.key))
                    .int(w.start_ms)
                    .int(w.acc.cents)
                    .int(w.acc.payments)
                    .bool(w.emit != Emit::Early);
            },
        );
        Ok(())
    }
}

sluice_plugin::export!(SpendPerMinute);
