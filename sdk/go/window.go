// Event-time windows on keyed state and timers: tumbling, hopping and
// session windows per user key, each with a user aggregate, emitted once
// when the partition's watermark passes their end (and, optionally, early
// on every batch that changes them). A record whose windows have all
// closed is a dead letter of kind `late`, never dropped.
//
// It keeps windows in state exactly as the Rust, Python, JavaScript and C
// SDKs do (docs/event-time.md), so a windowed transform gives the same
// rows, state and digest in any of them:
//
//   - tumbling and hopping: the aggregate of window [start, end) of key
//     under `sluice/w/` + end (8 bytes, big-endian, sign bit flipped) +
//     key; a timer (key, end - 1) closes it;
//   - sessions: every open session of key under `sluice/s/` + key, per
//     session its start and end (8 bytes each, big-endian) and its
//     aggregate's length (4 bytes, big-endian) and bytes, in start order;
//     a timer (key, end - 1) per session closes it.
//
// It must not read the host's clock or keep anything between batches
// outside state.

package sluice

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// WindowKind is tumbling, hopping or session windows.
type WindowKind uint8

const (
	// Tumbling windows: back to back, SizeMs each, aligned to the epoch.
	Tumbling WindowKind = iota
	// Hopping windows: SizeMs each, one starting every HopMs.
	Hopping
	// Session windows: records of a key less than GapMs apart, together.
	Session
)

// Windows is the shape of a windowed transform's windows.
type Windows struct {
	Kind   WindowKind
	SizeMs int64
	HopMs  int64
	GapMs  int64
}

// Aggregate is what a window computes over its records. Values are
// immutable: Add and Merge return the new one. Encode and Decode are how
// state keeps it (the same bytes as the other SDKs' accumulator); Decode's
// false means the bytes are not one.
type Aggregate[Acc, In any] interface {
	Init() Acc
	Add(acc Acc, input In) Acc
	// Merge joins two sessions' values (sessions only).
	Merge(acc, other Acc) Acc
	Encode(acc Acc) []byte
	Decode(data []byte) (Acc, bool)
}

// Taken is what a record brings to the windows: an Event, Ignored or a
// Rejected reason.
type Taken[In any] struct {
	kind   takenKind
	key    string
	hasTs  bool
	timeMs int64
	input  In
	reason string
}

type takenKind uint8

const (
	takenIgnored takenKind = iota
	takenEvent
	takenRejected
)

// Event puts a record into the windows of key at its Kafka timestamp,
// bringing input to their aggregates.
func Event[In any](key string, input In) Taken[In] {
	return Taken[In]{kind: takenEvent, key: key, input: input}
}

// EventAt puts a record into the windows of key at timeMs.
func EventAt[In any](key string, timeMs int64, input In) Taken[In] {
	return Taken[In]{kind: takenEvent, key: key, hasTs: true, timeMs: timeMs, input: input}
}

// Ignored puts a record in no window.
func Ignored[In any]() Taken[In] { return Taken[In]{} }

// Rejected puts a record in no window: a `rejected` dead letter with reason.
func Rejected[In any](reason string) Taken[In] {
	return Taken[In]{kind: takenRejected, reason: reason}
}

// WindowValue is a window's value, handed to the emit function; Early is
// true for a window the batch changed, still open, false for a final one
// (handed out once).
type WindowValue[Acc any] struct {
	Topic     string
	Partition int32
	Key       string
	StartMs   int64
	EndMs     int64
	Acc       Acc
	Early     bool
	State     State
}

// Windowed is windows of one shape with one aggregate.
type Windowed[Acc, In any] struct {
	Windows   Windows
	Aggregate Aggregate[Acc, In]
	// EmitEarly also hands out every open window a batch changed.
	EmitEarly bool
}

var (
	windowPrefix  = "sluice/w/"
	sessionPrefix = "sluice/s/"
)

// windowKey is `sluice/w/` + end (8 bytes that sort as the numbers do) + key.
func windowKey(end int64, key string) string {
	b := make([]byte, 0, len(windowPrefix)+8+len(key))
	b = append(b, windowPrefix...)
	b = binary.BigEndian.AppendUint64(b, uint64(end)^(1<<63))
	return string(append(b, key...))
}

type session struct {
	start, end int64
	acc        []byte
}

func readSessions(state State, key string) []session {
	data, _ := state.Get(sessionPrefix + key)
	var sessions []session
	for at := 0; at+20 <= len(data); {
		n := int(binary.BigEndian.Uint32(data[at+16:]))
		end := min(at+20+n, len(data))
		sessions = append(sessions, session{
			start: int64(binary.BigEndian.Uint64(data[at:])),
			end:   int64(binary.BigEndian.Uint64(data[at+8:])),
			acc:   data[at+20 : end],
		})
		at += 20 + n
	}
	return sessions
}

func writeSessions(state State, key string, sessions []session) {
	if len(sessions) == 0 {
		state.Delete(sessionPrefix + key)
		return
	}
	var value []byte
	for _, s := range sessions {
		value = binary.BigEndian.AppendUint64(value, uint64(s.start))
		value = binary.BigEndian.AppendUint64(value, uint64(s.end))
		value = binary.BigEndian.AppendUint32(value, uint32(len(s.acc)))
		value = append(value, s.acc...)
	}
	state.Set(sessionPrefix+key, value)
}

type touched struct {
	index     uint32
	topic     string
	partition int32
	key       string
	end       int64
}

// Run runs a batch: take says once per record what it brings (an Event),
// or that it is in no window (Ignored, or Rejected: either way it does not
// move the watermark, so a malformed record's Kafka timestamp cannot close
// windows). Each event goes into its windows, or becomes a `late` dead
// letter; then every window the watermark passed is handed to emit once,
// as final (and, with EmitEarly, every other window the batch changed as
// early).
func (w *Windowed[Acc, In]) Run(batch *Batch, out *Output, take func(Record) Taken[In],
	emit func(*Output, WindowValue[Acc])) {
	var changed []touched
	for r := range batch.Records() {
		taken := take(r)
		if taken.kind != takenEvent {
			r.Time().ClearEventTime()
			if taken.kind == takenRejected {
				out.Reject(r, taken.reason)
			}
			continue
		}
		at := r.Timestamp
		if taken.hasTs {
			at = taken.timeMs
			r.Time().SetEventTime(at)
		}
		watermark, hasWatermark := r.Time().Watermark()
		var ends []int64
		if w.Windows.Kind == Session {
			ends = w.addToSession(&r, taken, at, watermark, hasWatermark)
		} else {
			ends = w.addToWindows(&r, taken, at, watermark, hasWatermark)
		}
		if len(ends) == 0 {
			shown := "None"
			if hasWatermark {
				shown = fmt.Sprintf("Some(%d)", watermark)
			}
			r.Time().Late(fmt.Sprintf("event time %d is behind the watermark %s: its window has closed", at, shown))
		}
		if w.EmitEarly {
			for _, end := range ends {
				changed = append(changed, touched{r.Index, r.Topic, r.Partition, taken.key, end})
			}
		}
	}
	for _, timer := range DueTimers() {
		w.close(batch, timer, out, emit)
	}
	if w.EmitEarly {
		w.emitEarly(changed, out, emit)
	}
}

// windowsOf is [start, end) of every window time falls in, oldest first.
func (w *Windowed[Acc, In]) windowsOf(time int64) [][2]int64 {
	size, hop := w.Windows.SizeMs, w.Windows.SizeMs
	if w.Windows.Kind == Hopping {
		hop = w.Windows.HopMs
	}
	rem := time % hop
	if rem < 0 {
		rem += hop
	}
	var windows [][2]int64
	for start := time - rem; start > time-size; start -= hop {
		windows = append(windows, [2]int64{start, start + size})
	}
	for i, j := 0, len(windows)-1; i < j; i, j = i+1, j-1 {
		windows[i], windows[j] = windows[j], windows[i]
	}
	return windows
}

// addToWindows adds the event to its open windows; their ends.
func (w *Windowed[Acc, In]) addToWindows(r *Record, t Taken[In], time, watermark int64, hasWatermark bool) []int64 {
	state, agg := r.State(), w.Aggregate
	var ends []int64
	for _, window := range w.windowsOf(time) {
		end := window[1]
		if hasWatermark && end-1 <= watermark {
			continue
		}
		at := windowKey(end, t.key)
		acc := agg.Init()
		if stored, ok := state.Get(at); !ok {
			r.Time().SetTimer(t.key, end-1)
		} else if decoded, ok := agg.Decode(stored); ok {
			acc = decoded
		}
		state.Set(at, agg.Encode(agg.Add(acc, t.input)))
		ends = append(ends, end)
	}
	return ends
}

// addToSession adds the event to a session, merging those it meets; its
// end, or none if the session it would make has closed.
func (w *Windowed[Acc, In]) addToSession(r *Record, t Taken[In], time, watermark int64, hasWatermark bool) []int64 {
	state, agg, gap := r.State(), w.Aggregate, w.Windows.GapMs
	start, end := time, time+gap
	var meets, apart []session
	for _, s := range readSessions(state, t.key) {
		// A session the watermark has passed is closed, though its timer
		// fires only at the batch's end: nothing joins it.
		open := !hasWatermark || s.end-1 > watermark
		if open && s.start < time+gap && time < s.end {
			meets = append(meets, s)
			start, end = min(start, s.start), max(end, s.end)
		} else {
			apart = append(apart, s)
		}
	}
	if hasWatermark && end-1 <= watermark {
		return nil
	}
	acc := agg.Add(agg.Init(), t.input)
	for _, s := range meets {
		if s.end != end {
			r.Time().DeleteTimer(t.key, s.end-1)
		}
		if other, ok := agg.Decode(s.acc); ok {
			acc = agg.Merge(acc, other)
		}
	}
	r.Time().SetTimer(t.key, end-1)
	sessions := append(apart, session{start, end, agg.Encode(acc)})
	sort.SliceStable(sessions, func(i, j int) bool { return sessions[i].start < sessions[j].start })
	writeSessions(state, t.key, sessions)
	return []int64{end}
}

// find is the window (or session) of key ending at end: its start and
// bytes, removed from state when take.
func (w *Windowed[Acc, In]) find(state State, key string, end int64, take bool) (int64, []byte, bool) {
	if w.Windows.Kind != Session {
		at := windowKey(end, key)
		data, ok := state.Get(at)
		if ok && take {
			state.Delete(at)
		}
		return end - w.Windows.SizeMs, data, ok
	}
	sessions := readSessions(state, key)
	for i, s := range sessions {
		if s.end == end {
			if take {
				writeSessions(state, key, append(sessions[:i:i], sessions[i+1:]...))
			}
			return s.start, s.acc, true
		}
	}
	return 0, nil, false
}

func (w *Windowed[Acc, In]) close(batch *Batch, timer FiredTimer, out *Output, emit func(*Output, WindowValue[Acc])) {
	state, end := timer.State(), timer.AtMs+1
	start, data, ok := w.find(state, timer.Key, end, true)
	if !ok {
		return
	}
	acc, ok := w.Aggregate.Decode(data)
	if !ok {
		return
	}
	topic, partition, _ := batch.PartitionOf(timer.Index)
	emit(out, WindowValue[Acc]{topic, partition, timer.Key, start, end, acc, false, state})
}

func (w *Windowed[Acc, In]) emitEarly(changed []touched, out *Output, emit func(*Output, WindowValue[Acc])) {
	type window struct {
		topic     string
		partition int32
		key       string
		end       int64
	}
	seen := map[window]bool{}
	for _, t := range changed {
		id := window{t.topic, t.partition, t.key, t.end}
		if seen[id] {
			continue
		}
		seen[id] = true
		state := State{index: t.index}
		start, data, ok := w.find(state, t.key, t.end, false)
		if !ok {
			continue
		}
		if acc, ok := w.Aggregate.Decode(data); ok {
			emit(out, WindowValue[Acc]{t.topic, t.partition, t.key, start, t.end, acc, true, state})
		}
	}
}
