//! A running balance per account, in keyed state, for the Kafka balance
//! example. Each record is a movement on an account; the module keeps the
//! account's balance (integer cents) in state and writes one row per
//! movement with the balance after it. A withdrawal that would take the
//! balance below zero is rejected (a dead letter) and leaves the balance as
//! it was. State is scoped to the input partition: an account's movements
//! must share a partition, which a producer keyed by account gives.
//!
//! Input values are JSON objects like `{"account":"acc-1","cents":-250}`
//! (other fields are ignored). A value without a text `account` and an
//! integer `cents` is rejected too; it must not fail the batch.
//!
//! Out: target `balances` (account, cents, balance).

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::borrow::Cow;

#[derive(Deserialize)]
struct Movement<'a> {
    #[serde(borrow)]
    account: Cow<'a, str>,
    cents: i64,
}

struct Balance;

impl Transform for Balance {
    fn init(_: &Params) -> Result<Self, String> {
        Ok(Balance)
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let balances = out.target(
            "balances",
            &[
                ("account", Kind::Text),
                ("cents", Kind::Int64),
                ("balance", Kind::Int64),
            ],
        );
        for r in batch.records() {
            let m = match r.value.map(serde_json::from_slice::<Movement<'_>>) {
                Some(Ok(m)) if !m.account.is_empty() => m,
                Some(Ok(_)) => {
                    out.reject(&r, "empty `account`");
                    continue;
                }
                Some(Err(err)) => {
                    out.reject(&r, format!("not a movement: {err}"));
                    continue;
                }
                None => {
                    out.reject(&r, "null value");
                    continue;
                }
            };
            let state = r.state();
            let before = state.get_i64(m.account.as_bytes()).unwrap_or(0);
            let after = match before.checked_add(m.cents) {
                Some(after) if after >= 0 => after,
                _ => {
                    out.reject(
                        &r,
                        format!("insufficient funds: {before} cents, {} asked", -m.cents),
                    );
                    continue;
                }
            };
            state.set_i64(m.account.as_bytes(), after);
            out.row(balances).text(&m.account).int(m.cents).int(after);
        }
        Ok(())
    }
}

sluice_plugin::export!(Balance);
