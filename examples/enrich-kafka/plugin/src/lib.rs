//! Enrich: validates JSON order events and adds what a consumer downstream
//! wants to know without recomputing it: the amount's tier and the user's
//! region, from a table given in the params.
//!
//! Input values are JSON objects like
//! `{"id":7,"user":"ann","country":"de","amount":12.5}`. A value that is not
//! such an object (not JSON, a field missing or of the wrong type, a
//! negative amount) is rejected: it becomes a dead letter, the rest of the
//! batch goes on.
//!
//! Params: `{"gold": 100.0, "silver": 10.0, "regions": {"de": "eu"}}` (all
//! optional; an unlisted country's region is `"other"`).

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::borrow::Cow;
use std::collections::BTreeMap;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_gold")]
    gold: f64,
    #[serde(default = "default_silver")]
    silver: f64,
    #[serde(default)]
    regions: BTreeMap<String, String>,
}

fn default_gold() -> f64 {
    100.0
}

fn default_silver() -> f64 {
    10.0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Order<'a> {
    id: i64,
    #[serde(borrow)]
    user: Cow<'a, str>,
    #[serde(borrow)]
    country: Cow<'a, str>,
    amount: f64,
}

struct Enrich(Config);

impl Enrich {
    fn tier(&self, amount: f64) -> &'static str {
        if amount >= self.0.gold {
            "gold"
        } else if amount >= self.0.silver {
            "silver"
        } else {
            "bronze"
        }
    }

    fn region(&self, country: &str) -> &str {
        self.0.regions.get(country).map_or("other", String::as_str)
    }
}

impl Transform for Enrich {
    fn init(params: &Params) -> Result<Self, String> {
        let config: Config =
            serde_json::from_str(params.json()).map_err(|e| format!("enrich params: {e}"))?;
        if !(config.silver <= config.gold) {
            return Err("enrich params: `silver` must not be above `gold`".into());
        }
        Ok(Enrich(config))
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target(
            "orders",
            &[
                ("id", Kind::Int64),
                ("user", Kind::Text),
                ("country", Kind::Text),
                ("amount", Kind::Float64),
                ("tier", Kind::Text),
                ("region", Kind::Text),
            ],
        );
        for r in batch.records() {
            let order = match r.value.map(serde_json::from_slice::<Order<'_>>) {
                Some(Ok(o)) if o.amount.is_finite() && o.amount >= 0.0 => o,
                Some(Ok(o)) => {
                    out.reject(
                        &r,
                        format!("order {}: amount {} is negative", o.id, o.amount),
                    );
                    continue;
                }
                Some(Err(e)) => {
                    out.reject(&r, format!("not an order event: {e}"));
                    continue;
                }
                None => {
                    out.reject(&r, "null value");
                    continue;
                }
            };
            out.row(t)
                .int(order.id)
                .text(&order.user)
                .text(&order.country)
                .float(order.amount)
                .text(self.tier(order.amount))
                .text(self.region(&order.country));
        }
        Ok(())
    }
}

sluice_plugin::export!(Enrich);
