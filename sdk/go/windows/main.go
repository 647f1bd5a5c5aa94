// The windowed conformance transform in Go: the same as the Rust test
// plugin `tests/plugins/windows` (per record key, the sum and count of the
// records' `amount` in windows of event time, one `windows` row per
// window), so they must give the same rows, state and digest on the same
// input (tests/tests/languages.rs).
//
// Records: a key, and a JSON value `{"amount": N}` (optionally the event
// time under `time_field`; else the Kafka timestamp). Anything else is
// rejected. Params: `windows` ("tumbling" with `size_ms`, "hopping" with
// `size_ms` and `hop_ms`, "session" with `gap_ms`), `early`, `retain_ms`,
// `time_field`.
package main

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	sluice "sluice.dev/plugin"
)

// sumCount is (total, records), 16 bytes: two big-endian int64.
type sumCount struct{ total, records int64 }

type spend struct{}

func (spend) Init() sumCount { return sumCount{} }
func (spend) Add(acc sumCount, amount int64) sumCount {
	return sumCount{acc.total + amount, acc.records + 1}
}
func (spend) Merge(acc, other sumCount) sumCount {
	return sumCount{acc.total + other.total, acc.records + other.records}
}
func (spend) Encode(acc sumCount) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(acc.total))
	return binary.BigEndian.AppendUint64(b, uint64(acc.records))
}
func (spend) Decode(data []byte) (sumCount, bool) {
	if len(data) < 16 {
		return sumCount{}, false
	}
	return sumCount{int64(binary.BigEndian.Uint64(data)), int64(binary.BigEndian.Uint64(data[8:]))}, true
}

// int64Of is raw as an int64 if it is a JSON integer in range (as
// serde_json's as_i64 takes it).
func int64Of(raw json.RawMessage) (int64, bool) {
	n, err := strconv.ParseInt(string(raw), 10, 64)
	return n, err == nil
}

type windowSums struct {
	windowed  sluice.Windowed[sumCount, int64]
	timeField string
	hasField  bool
}

func newWindowSums(params []byte) (sluice.Transform, error) {
	var p map[string]json.RawMessage
	if err := json.Unmarshal(params, &p); err != nil {
		return nil, fmt.Errorf("windows params: %w", err)
	}
	ms := func(name string) (int64, error) {
		if v, ok := int64Of(p[name]); ok && v > 0 {
			return v, nil
		}
		return 0, fmt.Errorf("windows params: `%s` must be a positive integer", name)
	}
	var kind string
	_ = json.Unmarshal(p["windows"], &kind)
	var windows sluice.Windows
	var err, err2 error
	switch kind {
	case "tumbling":
		windows.Kind = sluice.Tumbling
		windows.SizeMs, err = ms("size_ms")
	case "hopping":
		windows.Kind = sluice.Hopping
		windows.SizeMs, err = ms("size_ms")
		windows.HopMs, err2 = ms("hop_ms")
	case "session":
		windows.Kind = sluice.Session
		windows.GapMs, err = ms("gap_ms")
	default:
		return nil, errors.New("windows params: `windows` is tumbling, hopping or session")
	}
	if err = errors.Join(err, err2); err != nil {
		return nil, err
	}
	var early bool
	_ = json.Unmarshal(p["early"], &early)
	var retainMs int64
	_ = json.Unmarshal(p["retain_ms"], &retainMs)
	t := &windowSums{windowed: sluice.Windowed[sumCount, int64]{
		Windows: windows, Aggregate: spend{}, EmitEarly: early, RetainMs: retainMs,
	}}
	t.hasField = json.Unmarshal(p["time_field"], &t.timeField) == nil && p["time_field"] != nil
	return t, nil
}

func (t *windowSums) take(r sluice.Record) sluice.Taken[int64] {
	var value map[string]json.RawMessage
	if r.JSON(&value) != nil {
		return sluice.Rejected[int64]("the value is not JSON with an integer `amount`")
	}
	amount, ok := int64Of(value["amount"])
	if !ok {
		return sluice.Rejected[int64]("the value is not JSON with an integer `amount`")
	}
	key := string(r.Key)
	if t.hasField {
		if at, ok := int64Of(value[t.timeField]); ok {
			return sluice.EventAt(key, at, amount)
		}
	}
	return sluice.Event(key, amount)
}

func (t *windowSums) Process(batch *sluice.Batch, out *sluice.Output) error {
	target := out.Target("windows",
		sluice.Col("partition", sluice.Int64),
		sluice.Col("key", sluice.Text),
		sluice.Col("start_ms", sluice.Int64),
		sluice.Col("end_ms", sluice.Int64),
		sluice.Col("total", sluice.Int64),
		sluice.Col("records", sluice.Int64),
		sluice.Col("emit", sluice.Text),
	)
	t.windowed.Run(batch, out, t.take, func(out *sluice.Output, w sluice.WindowValue[sumCount]) {
		emit := map[sluice.Emit]string{sluice.Final: "final", sluice.Early: "early", sluice.Update: "update"}[w.Emit]
		out.Row(target).Int(int64(w.Partition)).Text(sluice.Lossy([]byte(w.Key))).Int(w.StartMs).Int(w.EndMs).
			Int(w.Acc.total).Int(w.Acc.records).Text(emit)
	})
	return nil
}

func init() { sluice.Export(newWindowSums) }

func main() {}
