// Event time as a Go transform sees it: a record's (or a fired timer's)
// partition's watermark, its event time, timers, late records, and the
// timers that came due, over the world's `time` import (abi_wasm.go lowers
// the calls; abi_native.go stands in outside Wasm). It must not read the
// host's clock: a partition's time is its records' times.

package sluice

// Time is event time of one input partition, as a record (or a fired
// timer) names it. A partition's watermark is the highest event time of
// its records so far minus `event_time.allowed_lateness_ms`, kept in its
// state by the host; a timer comes due once the watermark reaches its
// time, in the batch that moved it there (DueTimers). Times are ms since
// the Unix epoch.
type Time struct {
	index uint32
}

// Time is event time of the partition this record came from.
func (r *Record) Time() Time { return Time{index: r.Index} }

// Watermark is the partition's watermark just before this record: as the
// batch started, moved by the partition's records before it; false before
// its first record.
func (t Time) Watermark() (int64, bool) { return timeWatermark(t.index) }

// SetEventTime sets this record's event time (default: its Kafka
// timestamp). Call it (or ClearEventTime) in record order, before the
// Watermark of later records and before DueTimers.
func (t Time) SetEventTime(ms int64) { timeSetRecordTime(t.index, true, ms) }

// ClearEventTime leaves this record out of the watermark: it has no event
// time (a record no window takes: no key, not parseable).
func (t Time) ClearEventTime() { timeSetRecordTime(t.index, false, 0) }

// SetTimer sets the timer (key, atMs) on the partition (key at most 245
// bytes); setting it again is one timer (and empties its value).
func (t Time) SetTimer(key string, atMs int64) { timeSetTimer(t.index, key, atMs) }

// SetTimerValue sets the timer (key, atMs) keeping value with it (bounded
// like a state value), handed back in FiredTimer.Value: state that lives
// as long as the timer, one stored entry where a state key and a timer
// would take two. Setting it again replaces the value.
func (t Time) SetTimerValue(key string, atMs int64, value []byte) {
	timeSetTimerValue(t.index, key, atMs, value)
}

// TimerValue is the value kept with the timer (key, atMs): false if there
// is no such timer (never set, deleted, fired), empty if it was set by
// SetTimer.
func (t Time) TimerValue(key string, atMs int64) ([]byte, bool) {
	return timeTimerValue(t.index, key, atMs)
}

// DeleteTimer removes the timer (key, atMs) of the partition.
func (t Time) DeleteTimer(key string, atMs int64) { timeDeleteTimer(t.index, key, atMs) }

// Late makes the record a dead letter of kind `late` with reason.
func (t Time) Late(reason string) { timeLate(t.index, reason) }

// FiredTimer is a timer that came due; Index names its partition.
type FiredTimer struct {
	Index uint32
	Key   string
	AtMs  int64
	// Value is what SetTimerValue kept with it (empty for SetTimer).
	Value []byte
}

// State is the keyed state of the timer's partition.
func (f FiredTimer) State() State { return State{index: f.Index} }

// Time is event time of the timer's partition.
func (f FiredTimer) Time() Time { return Time{index: f.Index} }

// DueTimers moves each partition's watermark past the batch's records and
// returns the timers that came due by it, oldest first, each once (they
// are removed as they are returned). What the module writes and emits for
// them commits with this batch.
func DueTimers() []FiredTimer { return timeDueTimers() }

// PartitionOf is the topic and partition of record index (or a timer's
// Index); false if no record of the batch has it.
func (b *Batch) PartitionOf(index uint32) (string, int32, bool) {
	for _, s := range b.raw.slices {
		if s.first <= index && index < s.first+s.count {
			return s.topic, s.partition, true
		}
	}
	return "", 0, false
}
