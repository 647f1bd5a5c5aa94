//! A `read_committed` reader that honours the broker's transaction
//! markers itself: it fetches raw record batches (Kafka protocol, through
//! the `kafka-protocol` codec) and keeps a transactional batch only once
//! its producer's COMMIT marker follows it, drops it at an ABORT marker,
//! and keeps none left without one. This is Kafka's own definition of
//! what `read_committed` returns, computed from the markers the broker
//! wrote into the log, producer epochs included ([`MarkedLog`]).
//!
//! It exists because Tansu answers every Fetch with an empty
//! `aborted_transactions` list, so librdkafka's `read_committed` cannot
//! skip aborted batches (`kafka_sink::broker_defect_*`). The Kafka sink's
//! fault-injection tests read their output with this; input expectations
//! still come from librdkafka's `read_committed` view, which is what
//! sluice's source reads too. It must not be used where librdkafka's view
//! is what is tested.

use crate::Consumed;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiKey, FetchRequest, FetchResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use kafka_protocol::records::{Record, RecordBatchDecoder};
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Fetch v11: topic names, record batches v2, no tagged fields.
const FETCH_VERSION: i16 = 11;

/// Everything committed in `topic` (every partition, up to its high
/// watermark: a transaction without a marker yet is not committed, and
/// this broker's last stable offset can stick), as the markers in the log say, in (partition, offset) order.
pub fn read_committed_by_markers(brokers: &str, topic: &str, partitions: i32) -> Vec<Consumed> {
    let mut conn = connect(brokers);
    let mut out = Vec::new();
    for partition in 0..partitions {
        let mut log = MarkedLog::default();
        read_log(&mut conn, topic, partition, |record| log.push(record));
        out.extend(log.committed.into_iter().map(|r| consumed(partition, r)));
    }
    out
}

/// A connection to the first of `brokers`.
fn connect(brokers: &str) -> TcpStream {
    let broker = brokers.split(',').next().expect("a broker");
    let conn = TcpStream::connect(broker).expect("connect to the broker");
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    conn
}

/// True if some partition of `topic` has a transaction still open: its
/// last stable offset is below its high watermark.
pub fn has_open_transaction(brokers: &str, topic: &str, partitions: i32) -> bool {
    let mut conn = connect(brokers);
    (0..partitions).any(|p| {
        let reply = fetch(&mut conn, topic, p, 0, 1, Isolation::Committed);
        reply.last_stable < reply.high_watermark
    })
}

/// Hands `each` every record and marker of `topic`'s `partition` from
/// its start to its high watermark (read uncommitted, in offset order);
/// returns the last stable offset and the high watermark last seen.
fn read_log(
    conn: &mut TcpStream,
    topic: &str,
    partition: i32,
    mut each: impl FnMut(Record),
) -> (i64, i64) {
    let mut next = 0i64;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            Instant::now() < deadline,
            "reading {topic}[{partition}] by markers did not end"
        );
        let reply = fetch(
            conn,
            topic,
            partition,
            next,
            64 << 20,
            Isolation::Uncommitted,
        );
        let from = next;
        let mut progressed = false;
        for record in reply.records.into_iter().filter(|r| r.offset >= from) {
            next = record.offset + 1;
            progressed = true;
            each(record);
        }
        if next >= reply.high_watermark || !progressed {
            return (reply.last_stable, reply.high_watermark);
        }
    }
}

/// One partition's log resolved by its markers, as Kafka defines it:
/// a producer's transactional records are committed by the next COMMIT
/// marker of that producer and epoch (or a later epoch's, which is how
/// the coordinator ends a transaction it aborts on a bump) and dropped at
/// an ABORT marker. Two things Kafka never writes into a log are dropped
/// too, as Kafka would have refused them: a record carrying an epoch
/// older than one its producer id has already shown (a fenced producer's
/// write, which this broker can let in when the fence races the write),
/// and records left open when their producer id goes on with a newer
/// epoch (a bump ends, by abort, any transaction still open).
#[derive(Default)]
struct MarkedLog {
    committed: Vec<Record>,
    pending: HashMap<i64, Pending>,
    newest_epoch: HashMap<i64, i16>,
}

/// A producer's transactional records not yet resolved by a marker.
struct Pending {
    epoch: i16,
    records: Vec<Record>,
}

impl MarkedLog {
    fn push(&mut self, record: Record) {
        if !record.transactional && !record.control {
            self.committed.push(record);
            return;
        }
        let (pid, epoch) = (record.producer_id, record.producer_epoch);
        let newest = self.newest_epoch.entry(pid).or_insert(epoch);
        if epoch < *newest {
            return; // a fenced producer's write
        }
        *newest = epoch;
        if record.control {
            let resolved = self.pending.remove(&pid);
            if marker_commits(&record) {
                self.committed
                    .extend(resolved.into_iter().flat_map(|p| p.records));
            }
            return;
        }
        let pending = self.pending.entry(pid).or_insert(Pending {
            epoch,
            records: Vec::new(),
        });
        if pending.epoch < epoch {
            // The older epoch's open transaction was ended by the bump.
            *pending = Pending {
                epoch,
                records: Vec::new(),
            };
        }
        pending.records.push(record);
    }
}

/// Every record and marker of `topic`'s partitions as the log holds them,
/// one line each (offset, producer id and epoch, kind, key, the value's
/// start): what a failed check writes out to be read.
pub fn dump_raw(brokers: &str, topic: &str, partitions: i32) -> String {
    use std::fmt::Write as _;
    let mut conn = connect(brokers);
    let mut out = String::new();
    for partition in 0..partitions {
        let (stable, high) = read_log(&mut conn, topic, partition, |r| {
            let _ = writeln!(out, "{}", raw_line(&r));
        });
        let _ = writeln!(
            out,
            "# {topic}[{partition}] ends: last stable {stable}, high watermark {high}"
        );
    }
    out
}

/// One record or marker as [`dump_raw`] shows it.
fn raw_line(r: &Record) -> String {
    let text = |b: &Option<Bytes>| {
        b.as_ref()
            .map(|b| String::from_utf8_lossy(&b[..b.len().min(120)]).into_owned())
    };
    let kind = match (r.control, r.transactional) {
        (true, _) if marker_commits(r) => "COMMIT",
        (true, _) => "ABORT",
        (false, true) => "txn",
        (false, false) => "plain",
    };
    // A lineage entry is shown by its ranges; anything else by the start
    // of its value.
    let ranges = r
        .value
        .as_ref()
        .and_then(|v| serde_json::from_slice::<serde_json::Value>(v).ok())
        .and_then(|entry| entry.get("ranges").map(|r| r.to_string()));
    let value = match ranges {
        Some(ranges) => Some(format!("ranges {ranges}")),
        None if r.control => None,
        None => text(&r.value),
    };
    format!(
        "{} pid {} epoch {} {kind} key {:?} value {:?}",
        r.offset,
        r.producer_id,
        r.producer_epoch,
        text(&r.key),
        value
    )
}

/// A control record's key is (version: i16, type: i16); type 1 commits.
fn marker_commits(record: &Record) -> bool {
    let key = record.key.as_ref().expect("a control record has a key");
    assert!(key.len() >= 4, "control record key too short");
    i16::from_be_bytes([key[2], key[3]]) == 1
}

fn consumed(partition: i32, r: Record) -> Consumed {
    let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
    Consumed {
        partition,
        key: r.key.as_ref().map(text),
        value: r.value.as_ref().map(text).unwrap_or_default(),
        headers: r
            .headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_ref().map(text).unwrap_or_default()))
            .collect::<BTreeMap<_, _>>(),
    }
}

/// What one Fetch of a partition returned.
struct Fetched {
    last_stable: i64,
    high_watermark: i64,
    /// The records of the batches returned, markers included.
    records: Vec<Record>,
}

/// A Fetch's isolation level.
#[derive(Clone, Copy)]
enum Isolation {
    /// Every record and marker up to the high watermark.
    Uncommitted = 0,
    /// Up to the last stable offset.
    Committed = 1,
}

/// One Fetch of up to `max_bytes` at `offset`.
fn fetch(
    conn: &mut TcpStream,
    topic: &str,
    partition: i32,
    offset: i64,
    max_bytes: i32,
    isolation: Isolation,
) -> Fetched {
    let request = FetchRequest::default()
        .with_replica_id((-1).into())
        .with_max_wait_ms(100)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_isolation_level(isolation as i8)
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![
            FetchTopic::default()
                .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![
                    FetchPartition::default()
                        .with_partition(partition)
                        .with_fetch_offset(offset)
                        .with_partition_max_bytes(max_bytes),
                ]),
        ]);
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Fetch as i16)
        .with_request_api_version(FETCH_VERSION)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("sluice-markers")));
    let mut body = BytesMut::new();
    header
        .encode(&mut body, FetchRequest::header_version(FETCH_VERSION))
        .expect("encode header");
    request
        .encode(&mut body, FETCH_VERSION)
        .expect("encode fetch");
    let mut framed = BytesMut::with_capacity(body.len() + 4);
    framed.put_i32(body.len() as i32);
    framed.put_slice(&body);
    conn.write_all(&framed).expect("send fetch");
    let mut size = [0u8; 4];
    conn.read_exact(&mut size).expect("fetch reply size");
    let mut reply = vec![0u8; i32::from_be_bytes(size) as usize];
    conn.read_exact(&mut reply).expect("fetch reply");
    let mut reply = Bytes::from(reply);
    ResponseHeader::decode(&mut reply, FetchResponse::header_version(FETCH_VERSION))
        .expect("reply header");
    let response = FetchResponse::decode(&mut reply, FETCH_VERSION).expect("fetch reply");
    let data = response
        .responses
        .into_iter()
        .flat_map(|t| t.partitions)
        .find(|p| p.partition_index == partition)
        .expect("the partition in the reply");
    assert_eq!(data.error_code, 0, "fetch {topic}[{partition}] at {offset}");
    let mut records = Vec::new();
    if let Some(mut bytes) = data.records {
        while bytes.has_remaining() {
            match RecordBatchDecoder::decode(&mut bytes) {
                Ok(set) => records.extend(set.records),
                // A batch cut short by the size limit: read again from it.
                Err(_) => break,
            }
        }
    }
    Fetched {
        last_stable: data.last_stable_offset,
        high_watermark: data.high_watermark,
        records,
    }
}
