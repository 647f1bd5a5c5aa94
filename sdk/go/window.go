// Event-time windows on keyed state and timers: tumbling, hopping and
// session windows per user key, each with a user aggregate, emitted once
// when the partition's watermark passes their end (and, optionally, early
// on every batch that changes them). A record whose windows have all
// closed is a dead letter of kind `late`, never dropped, or, with
// RetainMs, updates a window that closed less than that ago (handed out
// again as an Update).
//
// It keeps windows in state exactly as the Rust, Python, JavaScript and C
// SDKs do (docs/event-time.md), so a windowed transform gives the same
// rows, state and digest in any of them:
//
//   - tumbling and hopping: the timer (key, end - 1) closes window
//     [start, end) of key and keeps its aggregate as its value, after a
//     tag byte 1. A timer with an empty value holds no window (a
//     retention's) or one opened before timer values, under `sluice/w/` +
//     end (8 bytes, big-endian, sign bit flipped) + key: read from there,
//     moved into the timer on its next change;
//   - sessions: every open session of key under `sluice/s/` + key, per
//     session its start and end (8 bytes each, big-endian) and its
//     aggregate's length (4 bytes, big-endian) and bytes, in start order;
//     a timer (key, end - 1) per session closes it;
//   - with a retention R: a closed window's aggregate under `sluice/r/` +
//     end + key, a closed session under `sluice/t/` + key (the layout of
//     open ones); a timer (key, end - 1 + R) forgets it (set without a
//     value, unless that timer exists already: it may hold a window).
//
// What it costs a record: a host call for its event time; the host's
// watermark only when one of its windows may have closed (watermark); a
// tumbling or hopping window is read from its timer and written back once
// a batch (heldWindows), whatever the number of its records.
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
// false means the bytes are not one. Decode must give back what Encode was
// given: a batch keeps each window's value in memory and state keeps its
// bytes between batches, so a value that does not survive the round trip
// would depend on where batches end.
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

// Emit says why a window's value is handed out.
type Emit uint8

const (
	// Final: the watermark passed the window's end; handed out once.
	Final Emit = iota
	// Early: the batch changed the window, which is still open (with
	// EmitEarly).
	Early
	// Update: late records changed the closed window (with RetainMs); once
	// per batch that changed it.
	Update
)

// WindowValue is a window's value, handed to the emit function.
type WindowValue[Acc any] struct {
	Topic     string
	Partition int32
	Key       string
	StartMs   int64
	EndMs     int64
	Acc       Acc
	Emit      Emit
	State     State
}

// Windowed is windows of one shape with one aggregate.
type Windowed[Acc, In any] struct {
	Windows   Windows
	Aggregate Aggregate[Acc, In]
	// EmitEarly also hands out every open window a batch changed.
	EmitEarly bool
	// RetainMs keeps each closed window that much more event time: a
	// record behind the watermark whose window ended less than RetainMs
	// before it updates the window (handed out again as an Update, once
	// per batch) instead of becoming a `late` dead letter; a closed session
	// only if the record's time is within its records (first to last), so
	// its bounds never move. 0: no updates.
	RetainMs int64
}

var (
	windowPrefix          = "sluice/w/"
	sessionPrefix         = "sluice/s/"
	retainedPrefix        = "sluice/r/"
	retainedSessionPrefix = "sluice/t/"
)

// orderedKey is prefix + end (8 bytes that sort as the numbers do) + key.
func orderedKey(prefix string, end int64, key string) string {
	b := make([]byte, 0, len(prefix)+8+len(key))
	b = append(b, prefix...)
	b = binary.BigEndian.AppendUint64(b, uint64(end)^(1<<63))
	return string(append(b, key...))
}

// windowTag comes before a window's aggregate in its closing timer's value.
const windowTag = 1

// windowIn is the aggregate of key's window ending at end kept by its
// closing timer's value or, for a window opened before timer values,
// under its old key (removed when take, as its timer is about to hold it).
func windowIn(state State, value []byte, key string, end int64, take bool) ([]byte, bool) {
	if len(value) > 0 && value[0] == windowTag {
		return value[1:], true
	}
	at := orderedKey(windowPrefix, end, key)
	data, ok := state.Get(at)
	if ok && take {
		state.Delete(at)
	}
	return data, ok
}

// openWindow is the aggregate of key's open window ending at end: false if
// no timer closes one there.
func openWindow(state State, key string, end int64, take bool) ([]byte, bool) {
	value, ok := Time{index: state.index}.TimerValue(key, end-1)
	if !ok {
		return nil, false
	}
	return windowIn(state, value, key, end, take)
}

// setBareTimer sets a timer without a value (a retention's), unless the
// timer exists: it may hold a window, and fires at the same time anyway.
func setBareTimer(t Time, key string, atMs int64) {
	if _, ok := t.TimerValue(key, atMs); !ok {
		t.SetTimer(key, atMs)
	}
}

type session struct {
	start, end int64
	acc        []byte
}

// readSessions is the sessions under at (an open or a retained sessions key).
func readSessions(state State, at string) []session {
	data, _ := state.Get(at)
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

func writeSessions(state State, at string, sessions []session) {
	if len(sessions) == 0 {
		state.Delete(at)
		return
	}
	var value []byte
	for _, s := range sessions {
		value = binary.BigEndian.AppendUint64(value, uint64(s.start))
		value = binary.BigEndian.AppendUint64(value, uint64(s.end))
		value = binary.BigEndian.AppendUint32(value, uint32(len(s.acc)))
		value = append(value, s.acc...)
	}
	state.Set(at, value)
}

func sortByStart(sessions []session) {
	sort.SliceStable(sessions, func(i, j int) bool { return sessions[i].start < sessions[j].start })
}

type touched struct {
	index     uint32
	topic     string
	partition int32
	key       string
	end       int64
}

func touchedBy(r *Record, key string, end int64) touched {
	return touched{r.Index, r.Topic, r.Partition, key, end}
}

// closedWindow is a window as it was when it closed.
type closedWindow struct {
	index      uint32
	key        string
	start, end int64
	acc        []byte
}

// ceiling is what a batch knows of a partition's watermark without asking
// the host: at least the watermark before its next record, once known.
type ceiling struct {
	known bool
	// has: the partition has a watermark, at most at.
	has bool
	at  int64
}

// watermark is a partition's watermark just before a record, asked of the
// host only when a window's fate depends on it. Its ceiling is the higher
// of the watermark the host told for one of the partition's records in the
// batch and the event times of its records since: the watermark (highest
// event time minus a lateness never negative, never falling) is at most
// that, so a window whose last millisecond is past it is open for sure.
type watermark struct {
	time    Time
	ceiling ceiling
	told    bool
	has     bool
	at      int64
}

// get is the watermark, and whether the partition has one.
func (m *watermark) get() (int64, bool) {
	if !m.told {
		m.at, m.has = m.time.Watermark()
		m.told = true
	}
	return m.at, m.has
}

// reached is whether the watermark has reached atMs (a window's last
// millisecond): the window has closed.
func (m *watermark) reached(atMs int64) bool {
	if c := m.ceiling; c.known && (!c.has || atMs > c.at) {
		return false
	}
	w, ok := m.get()
	return ok && atMs <= w
}

// ceilingAfter is the ceiling for the partition's next record, after this
// one at timeMs.
func (m *watermark) ceilingAfter(timeMs int64) ceiling {
	c := m.ceiling
	if m.told {
		c = ceiling{known: true, has: m.has, at: m.at}
	}
	if c.known && (!c.has || timeMs > c.at) {
		c = ceiling{known: true, has: true, at: timeMs}
	}
	return c
}

// partitionOf names a record's partition in a batch.
type partitionOf struct {
	topic     string
	partition int32
}

// heldAt names an open window in a batch.
type heldAt struct {
	partitionOf
	key string
	end int64
}

// heldWindow is an open window a batch holds: a record of its partition
// (to name it to the host), and its aggregate.
type heldWindow[Acc any] struct {
	index uint32
	at    heldAt
	acc   Acc
	taken bool
}

// heldWindows are the open tumbling and hopping windows a batch adds
// records to, held (their aggregates as values) until the batch's end:
// each is read from its closing timer once and written back to it once,
// in the order first read, however many of the batch's records it takes.
// The host keeps a timer's last value, so what the batch commits is the
// same. Written back before the batch asks for its due timers; a window a
// late record closes is let go (take).
type heldWindows[Acc any] struct {
	at   map[heldAt]int
	held []heldWindow[Acc]
}

// get is the held window at, read (by read) the first time.
func (h *heldWindows[Acc]) get(r *Record, at heldAt, read func() Acc) *heldWindow[Acc] {
	if h.at == nil {
		h.at = map[heldAt]int{}
	}
	i, ok := h.at[at]
	if !ok {
		i = len(h.held)
		h.at[at] = i
		h.held = append(h.held, heldWindow[Acc]{index: r.Index, at: at, acc: read()})
	}
	return &h.held[i]
}

// take lets the window at go: its aggregate, if it was held.
func (h *heldWindows[Acc]) take(at heldAt) (Acc, bool) {
	i, ok := h.at[at]
	if !ok {
		var none Acc
		return none, false
	}
	delete(h.at, at)
	h.held[i].taken = true
	return h.held[i].acc, true
}

// writeBack writes every held window back to its closing timer.
func (h *heldWindows[Acc]) writeBack(encode func(Acc) []byte) {
	for _, held := range h.held {
		if !held.taken {
			value := append([]byte{windowTag}, encode(held.acc)...)
			Time{index: held.index}.SetTimerValue(held.at.key, held.at.end-1, value)
		}
	}
	h.at, h.held = nil, nil
}

// pending is what a batch's records leave to hand out at its end.
type pending struct {
	// early: open windows the batch changed (with EmitEarly).
	early []touched
	// closed: windows a late record reached before their timer closed
	// them, with their final values.
	closed []closedWindow
	// updated: closed windows late records changed (with RetainMs).
	updated []touched
}

// Run runs a batch: take says once per record what it brings (an Event),
// or that it is in no window (Ignored, or Rejected: either way it does not
// move the watermark, so a malformed record's Kafka timestamp cannot close
// windows). Each event goes into its windows, or updates retained ones, or
// becomes a `late` dead letter; then every window the watermark passed is
// handed to emit once, as Final, every retained window late records
// changed as an Update (and, with EmitEarly, every open window the batch
// changed as Early).
func (w *Windowed[Acc, In]) Run(batch *Batch, out *Output, take func(Record) Taken[In],
	emit func(*Output, WindowValue[Acc])) {
	var p pending
	var held heldWindows[Acc]
	ceilings := map[partitionOf]ceiling{}
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
		partition := partitionOf{r.Topic, r.Partition}
		m := &watermark{time: r.Time(), ceiling: ceilings[partition]}
		e := event[In]{key: taken.key, time: at, input: taken.input, watermark: m}
		var added bool
		if w.Windows.Kind == Session {
			added = w.addToSession(&r, e, &p)
		} else {
			added = w.addToWindows(&r, e, &p, &held)
		}
		if !added {
			shown := "None"
			if wm, ok := m.get(); ok {
				shown = fmt.Sprintf("Some(%d)", wm)
			}
			r.Time().Late(fmt.Sprintf("event time %d is behind the watermark %s: its window has closed", at, shown))
		}
		ceilings[partition] = m.ceilingAfter(at)
	}
	held.writeBack(w.Aggregate.Encode)
	fired := DueTimers()
	for _, c := range p.closed {
		w.handOut(batch, out, emit, c, Final)
	}
	// Before the timers: one may forget a window this batch updated.
	w.emitChanged(batch, p.updated, Update, out, emit)
	for _, timer := range fired {
		w.close(batch, timer, out, emit)
	}
	if w.EmitEarly {
		w.emitChanged(batch, p.early, Early, out, emit)
	}
}

// event is a record on its way into its windows.
type event[In any] struct {
	key   string
	time  int64
	input In
	// watermark just before the record.
	watermark *watermark
}

// closedBy is whether the watermark before e has closed a window ending at end.
func (e event[In]) closedBy(end int64) bool { return e.watermark.reached(end - 1) }

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

// retained is whether a window ending at end, closed by e's watermark,
// still takes late records.
func (w *Windowed[Acc, In]) retained(end int64, e event[In]) bool {
	if w.RetainMs <= 0 {
		return false
	}
	wm, ok := e.watermark.get()
	return ok && end-1+w.RetainMs > wm
}

// decode is the aggregate in data, or Init if there is none.
func (w *Windowed[Acc, In]) decode(data []byte, ok bool) Acc {
	if ok {
		if acc, ok := w.Aggregate.Decode(data); ok {
			return acc
		}
	}
	return w.Aggregate.Init()
}

// addToWindows adds the event to its open windows and its retained closed
// ones; false if it reached none.
func (w *Windowed[Acc, In]) addToWindows(r *Record, e event[In], p *pending, held *heldWindows[Acc]) bool {
	state, agg := r.State(), w.Aggregate
	added := false
	for _, window := range w.windowsOf(e.time) {
		start, end := window[0], window[1]
		if e.closedBy(end) {
			added = w.updateClosedWindow(r, e, start, end, p, held) || added
			continue
		}
		at := heldAt{partitionOf{r.Topic, r.Partition}, e.key, end}
		h := held.get(r, at, func() Acc { return w.decode(openWindow(state, e.key, end, true)) })
		h.acc = agg.Add(h.acc, e.input)
		if w.EmitEarly {
			p.early = append(p.early, touchedBy(r, e.key, end))
		}
		added = true
	}
	return added
}

// updateClosedWindow adds a late event to the closed window [start, end)
// if it is retained (closing it first if its timer has not yet).
func (w *Windowed[Acc, In]) updateClosedWindow(r *Record, e event[In], start, end int64, p *pending, held *heldWindows[Acc]) bool {
	if !w.retained(end, e) {
		return false
	}
	state := r.State()
	at := orderedKey(retainedPrefix, end, e.key)
	data, ok := state.Get(at)
	if !ok {
		if acc, wasHeld := held.take(heldAt{partitionOf{r.Topic, r.Partition}, e.key, end}); wasHeld {
			data, ok = w.Aggregate.Encode(acc), true
		} else {
			data, ok = openWindow(state, e.key, end, true)
		}
		if ok {
			// Its timer stays, without the window: it may also forget a
			// retained one.
			r.Time().SetTimer(e.key, end-1)
			p.closed = append(p.closed, closedWindow{r.Index, e.key, start, end, data})
		}
		setBareTimer(r.Time(), e.key, end-1+w.RetainMs)
	}
	state.Set(at, w.Aggregate.Encode(w.Aggregate.Add(w.decode(data, ok), e.input)))
	p.updated = append(p.updated, touchedBy(r, e.key, end))
	return true
}

// addToSession adds the event to a session, merging the open ones it
// meets, or, if that has closed, to a retained closed one; false if none
// takes it.
func (w *Windowed[Acc, In]) addToSession(r *Record, e event[In], p *pending) bool {
	state, agg, gap := r.State(), w.Aggregate, w.Windows.GapMs
	start, end := e.time, e.time+gap
	sessions := readSessions(state, sessionPrefix+e.key)
	var meets, apart []session
	for _, s := range sessions {
		// A session the watermark has passed is closed, though its timer
		// fires only at the batch's end: nothing joins it.
		if !e.closedBy(s.end) && s.start < e.time+gap && e.time < s.end {
			meets = append(meets, s)
			start, end = min(start, s.start), max(end, s.end)
		} else {
			apart = append(apart, s)
		}
	}
	if e.closedBy(end) {
		return w.updateClosedSession(r, e, sessions, p)
	}
	acc := agg.Add(agg.Init(), e.input)
	for _, s := range meets {
		// With a retention, the timer may also forget a closed session.
		if s.end != end && w.RetainMs <= 0 {
			r.Time().DeleteTimer(e.key, s.end-1)
		}
		if other, ok := agg.Decode(s.acc); ok {
			acc = agg.Merge(acc, other)
		}
	}
	r.Time().SetTimer(e.key, end-1)
	kept := append(apart, session{start, end, agg.Encode(acc)})
	sortByStart(kept)
	writeSessions(state, sessionPrefix+e.key, kept)
	if w.EmitEarly {
		p.early = append(p.early, touchedBy(r, e.key, end))
	}
	return true
}

// updateClosedSession adds a late event to the retained closed session of
// its key whose records' span holds its time (closing it first if its
// timer has not yet: sessions are the key's open ones); false if none.
func (w *Windowed[Acc, In]) updateClosedSession(r *Record, e event[In], sessions []session, p *pending) bool {
	holds := func(s session) bool {
		return w.retained(s.end, e) && s.start <= e.time && e.time <= s.end-w.Windows.GapMs
	}
	find := func(sessions []session, also func(session) bool) int {
		for i, s := range sessions {
			if also(s) && holds(s) {
				return i
			}
		}
		return -1
	}
	every := func(session) bool { return true }
	state := r.State()
	retained := readSessions(state, retainedSessionPrefix+e.key)
	at := find(retained, every)
	if at < 0 {
		i := find(sessions, func(s session) bool { return e.closedBy(s.end) })
		if i < 0 {
			return false
		}
		s := sessions[i]
		writeSessions(state, sessionPrefix+e.key, append(sessions[:i:i], sessions[i+1:]...))
		p.closed = append(p.closed, closedWindow{r.Index, e.key, s.start, s.end, s.acc})
		r.Time().SetTimer(e.key, s.end-1+w.RetainMs)
		retained = append(retained, s)
		sortByStart(retained)
		at = find(retained, every)
	}
	s := &retained[at]
	s.acc = w.Aggregate.Encode(w.Aggregate.Add(w.decode(s.acc, true), e.input))
	end := s.end
	writeSessions(state, retainedSessionPrefix+e.key, retained)
	p.updated = append(p.updated, touchedBy(r, e.key, end))
	return true
}

// find is the window (or session) of key ending at end under the open
// (or, retained, the retained) prefix: its start and bytes, removed from
// state when take.
func (w *Windowed[Acc, In]) find(state State, key string, end int64, retained, take bool) (int64, []byte, bool) {
	if w.Windows.Kind != Session {
		if !retained {
			data, ok := openWindow(state, key, end, take)
			return end - w.Windows.SizeMs, data, ok
		}
		at := orderedKey(retainedPrefix, end, key)
		data, ok := state.Get(at)
		if ok && take {
			state.Delete(at)
		}
		return end - w.Windows.SizeMs, data, ok
	}
	at := sessionPrefix + key
	if retained {
		at = retainedSessionPrefix + key
	}
	sessions := readSessions(state, at)
	for i, s := range sessions {
		if s.end == end {
			if take {
				writeSessions(state, at, append(sessions[:i:i], sessions[i+1:]...))
			}
			return s.start, s.acc, true
		}
	}
	return 0, nil, false
}

// close hands out the window timer closes, as Final, keeping it if there
// is a retention; forgets the retained window it ends.
func (w *Windowed[Acc, In]) close(batch *Batch, timer FiredTimer, out *Output, emit func(*Output, WindowValue[Acc])) {
	state, end := timer.State(), timer.AtMs+1
	if w.RetainMs > 0 {
		w.find(state, timer.Key, end-w.RetainMs, true, true)
	}
	var start int64
	var data []byte
	var ok bool
	if w.Windows.Kind == Session {
		start, data, ok = w.find(state, timer.Key, end, false, true)
	} else {
		start = end - w.Windows.SizeMs
		data, ok = windowIn(state, timer.Value, timer.Key, end, true)
	}
	if !ok {
		return
	}
	if w.RetainMs > 0 {
		w.keepClosed(state, timer.Key, session{start, end, data})
		if w.Windows.Kind == Session {
			timer.Time().SetTimer(timer.Key, timer.AtMs+w.RetainMs)
		} else {
			setBareTimer(timer.Time(), timer.Key, timer.AtMs+w.RetainMs)
		}
	}
	w.handOut(batch, out, emit, closedWindow{timer.Index, timer.Key, start, end, data}, Final)
}

// keepClosed keeps a closed window for late records.
func (w *Windowed[Acc, In]) keepClosed(state State, key string, c session) {
	if w.Windows.Kind != Session {
		state.Set(orderedKey(retainedPrefix, c.end, key), c.acc)
		return
	}
	retained := append(readSessions(state, retainedSessionPrefix+key), c)
	sortByStart(retained)
	writeSessions(state, retainedSessionPrefix+key, retained)
}

func (w *Windowed[Acc, In]) handOut(batch *Batch, out *Output, emit func(*Output, WindowValue[Acc]), c closedWindow, why Emit) {
	acc, ok := w.Aggregate.Decode(c.acc)
	if !ok {
		return
	}
	topic, partition, _ := batch.PartitionOf(c.index)
	emit(out, WindowValue[Acc]{topic, partition, c.key, c.start, c.end, acc, why, State{index: c.index}})
}

// emitChanged hands out, as why, each window the batch changed (Early:
// still open; Update: still retained), once, in the order first changed.
func (w *Windowed[Acc, In]) emitChanged(batch *Batch, changed []touched, why Emit, out *Output, emit func(*Output, WindowValue[Acc])) {
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
		start, data, ok := w.find(State{index: t.index}, t.key, t.end, why == Update, false)
		if ok {
			w.handOut(batch, out, emit, closedWindow{t.index, t.key, start, t.end, data}, why)
		}
	}
}
