//! Sessions of page views per user: views (`{"user", "page", "ts"}`, `ts`
//! in ms since the epoch) grouped in session windows of their own time with
//! the SDK's windows, a session ending 30 minutes after its last view.
//! Each session is written once, when the watermark passes its end, as a
//! record of topic `sessions` keyed by user: `{"user", "start_ms",
//! "end_ms", "views"}`. A view that would only extend a session already
//! written is a `late` dead letter; a record that is not a view is
//! rejected.

use sluice_plugin::window::{Aggregate, Emit, Taken, Windowed, Windows};
use sluice_plugin::{Batch, BatchError, Kind, Output, Params, Record, Transform};

/// Thirty minutes of silence end a session.
const GAP_MS: i64 = 30 * 60 * 1000;

#[derive(serde::Deserialize)]
struct View {
    user: String,
    ts: i64,
}

fn view(record: &Record<'_>) -> Option<View> {
    serde_json::from_slice::<View>(record.value?)
        .ok()
        .filter(|v| !v.user.is_empty())
}

/// The number of views.
struct Views;

impl Aggregate for Views {
    type Acc = i64;
    type Input = ();
    fn init(&self) -> i64 {
        0
    }
    fn add(&self, views: &mut i64, _: &()) {
        *views += 1;
    }
    fn merge(&self, views: &mut i64, other: i64) {
        *views += other;
    }
}

struct Sessions {
    windowed: Windowed<Views>,
}

impl Transform for Sessions {
    fn init(_params: &Params) -> Result<Self, String> {
        let sessions = Windows::Session { gap_ms: GAP_MS };
        Ok(Sessions {
            windowed: Windowed::new(sessions, Views),
        })
    }

    fn process(&self, batch: &Batch, out: &mut Output) -> Result<(), BatchError> {
        let t = out.target(
            "sessions",
            &[
                ("user", Kind::Text),
                ("start_ms", Kind::Int64),
                ("end_ms", Kind::Int64),
                ("views", Kind::Int64),
            ],
        );
        self.windowed.run(
            batch,
            out,
            |r| match view(r) {
                Some(v) => Taken::Event {
                    key: v.user.into_bytes(),
                    time_ms: Some(v.ts),
                    input: (),
                },
                None => Taken::Rejected("not a page view: {\"user\", \"ts\"} expected".into()),
            },
            |out, s| {
                if s.emit == Emit::Final {
                    out.row(t)
                        .text(&String::from_utf8_lossy(s.key))
                        .int(s.start_ms)
                        .int(s.end_ms)
                        .int(*s.acc);
                }
            },
        );
        Ok(())
    }
}

sluice_plugin::export!(Sessions);
