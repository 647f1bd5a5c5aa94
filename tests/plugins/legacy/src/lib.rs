//! A transform built against the 0.1.0 contract (a frozen copy of its WIT
//! in `wit/`, bound directly, without the SDK): the host, at 0.1.1, must
//! load and run it unchanged. One row per record in target `records`
//! (`offset`).

wit_bindgen::generate!({
    path: "wit",
    world: "transform",
});

use sluice::plugin::types::{Column, ColumnData, TargetRows};

struct Legacy;

impl Guest for Legacy {
    fn init(_params: String) -> Result<(), String> {
        sluice::plugin::log::write(sluice::plugin::log::Level::Info, "built against 0.1.0");
        Ok(())
    }

    fn process(_ctx: BatchContext, batch: RecordBatch) -> Result<Output, BatchError> {
        let offsets = batch.offsets;
        Ok(Output {
            targets: vec![TargetRows {
                target: "records".into(),
                rows: offsets.len() as u32,
                columns: vec![Column {
                    name: "offset".into(),
                    nulls: Vec::new(),
                    data: ColumnData::Int64(offsets),
                }],
            }],
            rejections: Vec::new(),
        })
    }
}

export!(Legacy);
