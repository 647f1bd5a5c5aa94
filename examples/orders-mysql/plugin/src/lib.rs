//! Orders with a business key: each JSON order becomes one row that carries
//! its Kafka partition and offset, appended in the same transaction as the
//! offsets (the seed's Kafka -> MySQL case).
//!
//! Input values are JSON objects like
//! `{"order_id":"A-1001","customer":"ann","total_cents":1250}`. A value that
//! is not such an object is rejected (it becomes a dead letter); it must not
//! fail the batch. No params.

use serde::Deserialize;
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Transform};
use std::borrow::Cow;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Order<'a> {
    #[serde(borrow)]
    order_id: Cow<'a, str>,
    #[serde(borrow)]
    customer: Cow<'a, str>,
    total_cents: i64,
}

struct Orders;

impl Transform for Orders {
    fn init(params: &Params) -> Result<Self, String> {
        match params.json().trim() {
            "" | "{}" | "null" => Ok(Orders),
            other => Err(format!("orders takes no params, got {other}")),
        }
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target(
            "orders",
            &[
                ("order_id", Kind::Text),
                ("customer", Kind::Text),
                ("total_cents", Kind::Int64),
                ("kafka_partition", Kind::Int64),
                ("kafka_offset", Kind::Int64),
            ],
        );
        for r in batch.records() {
            match r.value.map(serde_json::from_slice::<Order<'_>>) {
                Some(Ok(o)) => {
                    out.row(t)
                        .text(&o.order_id)
                        .text(&o.customer)
                        .int(o.total_cents)
                        .int(r.partition as i64)
                        .int(r.offset);
                }
                Some(Err(err)) => out.reject(&r, format!("not an order: {err}")),
                None => out.reject(&r, "null value"),
            }
        }
        Ok(())
    }
}

sluice_plugin::export!(Orders);
