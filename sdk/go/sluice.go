// Package sluice is the Go SDK for sluice transforms.
//
// It owns the guest side of the `sluice:plugin` world for Go: it hides the
// columnar batch layout behind a record iterator and the columnar output
// layout behind a row builder, so a transform is a type with Process:
//
//	type Upper struct{}
//
//	func (Upper) Process(batch *sluice.Batch, out *sluice.Output) error {
//		t := out.Target("upper", sluice.Col("offset", sluice.Int64), sluice.Col("value", sluice.Text))
//		for r := range batch.Records() {
//			out.Row(t).Int(r.Offset).Text(strings.ToUpper(string(r.Value)))
//		}
//		return nil
//	}
//
//	func init() { sluice.Export(func(params []byte) (sluice.Transform, error) { return Upper{}, nil }) }
//	func main() {}
//
// Build it with `sluice build` (Go for GOOS=wasip1 as a reactor, then
// `wasm-tools` with the WASI preview-1 adapter). It must not reach outside
// the world: the host gives the module a fixed clock (the batch time),
// seeded random, no files and no network, so the same batch gives the same
// output on every run. The canonical ABI itself lives in abi_wasm.go.
package sluice

import (
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Transform is what a plugin implements: Process runs once per batch, in a
// fresh instance of the module.
//
// A returned error fails the whole batch: a *BatchError says whether
// running it again can succeed, any other error is not retryable. A panic
// is a trap: the host retries the batch, then bisects it, and the record
// that panics becomes a dead letter whose reason is the panic's message.
type Transform interface {
	Process(batch *Batch, out *Output) error
}

// Export registers the transform's constructor; call it from an init
// function. The constructor receives the pipeline's [module.params] as
// JSON and may refuse them with an error the user sees.
func Export(init func(params []byte) (Transform, error)) {
	constructor = init
}

var constructor func(params []byte) (Transform, error)

// BatchError is a declared failure of the whole batch (not a trap).
type BatchError struct {
	Message string
	// True if running the same batch again can succeed.
	Retryable bool
}

func (e *BatchError) Error() string { return e.Message }

// Context says where and when the batch runs; every field comes from the
// batch plan, never from a clock, so a replay sees the same values.
type Context struct {
	// Pipeline name from the configuration.
	Pipeline string
	// Deterministic id of the batch (derived from its offset ranges).
	BatchID string
	// Batch time in milliseconds since the Unix epoch, fixed in the plan.
	BatchTimeMs int64
	// Seed for any randomness, derived from pipeline, partition and offsets.
	Seed uint64
}

// Header is one record header; Value is nil when the header's value is null.
type Header struct {
	Name  string
	Value []byte
}

// Record is one input record. Key and Value are nil when null; they point
// into the batch and must not be changed.
type Record struct {
	// Index of the record in the batch (what a rejection names).
	Index     uint32
	Topic     string
	Partition int32
	Offset    int64
	// Kafka timestamp, ms since the Unix epoch.
	Timestamp int64
	Key       []byte
	Value     []byte

	batch       *Batch
	firstHeader uint32
	headerCount uint32
	nameAt      uint32
	valueAt     uint32
}

// Text is the value as UTF-8 text; an error when it is null or not UTF-8.
func (r *Record) Text() (string, error) {
	if r.Value == nil {
		return "", errors.New("value is null")
	}
	if !utf8.Valid(r.Value) {
		return "", errors.New("value is not UTF-8")
	}
	return string(r.Value), nil
}

// LossyText returns the value as UTF-8 text, "" for a null value (see
// Lossy).
func (r *Record) LossyText() string { return Lossy(r.Value) }

// Lossy returns bytes as UTF-8 text, each maximal invalid subsequence
// replaced by U+FFFD: what Rust's String::from_utf8_lossy, Python's
// decode("utf-8", "replace") and JavaScript's TextDecoder give
// (strings.ToValidUTF8 would replace a run of them by one).
func Lossy(bytes []byte) string {
	if utf8.Valid(bytes) {
		return string(bytes)
	}
	var b strings.Builder
	for rest := bytes; len(rest) > 0; {
		n := validPrefix(rest)
		if n > 0 {
			b.Write(rest[:n])
		} else {
			n = invalidSubpart(rest)
			b.WriteRune(utf8.RuneError)
		}
		rest = rest[n:]
	}
	return b.String()
}

// validPrefix is the length of the valid UTF-8 sequence starting b, or 0.
func validPrefix(b []byte) int {
	r, n := utf8.DecodeRune(b)
	if r == utf8.RuneError && n <= 1 {
		return 0
	}
	return n
}

// invalidSubpart is the length of the maximal subpart of an ill-formed
// sequence at b's start (Unicode 3.9, U+FFFD substitution): a lead byte
// and the continuation bytes it may take, up to the first that does not
// fit; a byte that leads nothing is one.
func invalidSubpart(b []byte) int {
	lo, hi, need := byte(0x80), byte(0xBF), 0
	switch c := b[0]; {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		lo, need = 0xA0, 2
	case c == 0xED:
		hi, need = 0x9F, 2
	case c >= 0xE1 && c <= 0xEF:
		need = 2
	case c == 0xF0:
		lo, need = 0x90, 3
	case c == 0xF4:
		hi, need = 0x8F, 3
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	}
	n := 1
	for ; n <= need && n < len(b) && b[n] >= lo && b[n] <= hi; n++ {
		lo, hi = 0x80, 0xBF
	}
	return n
}

// JSON parses the value into v as strict JSON from strict UTF-8 (an error
// for a null value, bad UTF-8, NaN or Infinity literals, trailing data,
// nesting deeper than MaxJSONDepth arrays and objects, and a lone
// surrogate escape).
func (r *Record) JSON(v any) error {
	if r.Value == nil {
		return errors.New("value is null")
	}
	if !utf8.Valid(r.Value) {
		return errors.New("value is not UTF-8")
	}
	if err := checkJSON(r.Value); err != nil {
		return err
	}
	return json.Unmarshal(r.Value, v)
}

// MaxJSONDepth is how many arrays and objects Record.JSON lets nest. Every
// SDK's JSON helper refuses what Rust's serde_json refuses beyond RFC 8259
// (docs/languages.md): a deeper value (which would exhaust the module's
// stack) and a \u escape of half a surrogate pair (encoding/json would
// replace it; it has no UTF-8 encoding).
const MaxJSONDepth = 127

func checkJSON(b []byte) error {
	depth, inString := 0, false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case inString && c == '\\':
			if i+1 < len(b) && b[i+1] == 'u' {
				n, err := surrogates(b, i)
				if err != nil {
					return err
				}
				i += n - 1
			} else {
				i++
			}
		case inString:
			inString = c != '"'
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			if depth > MaxJSONDepth {
				return fmt.Errorf("JSON nested deeper than %d levels", MaxJSONDepth)
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return nil
}

// hex4 is the code unit of the 4 hex digits at b[at:], or -1.
func hex4(b []byte, at int) int {
	if at+4 > len(b) {
		return -1
	}
	v, err := strconv.ParseUint(string(b[at:at+4]), 16, 16)
	if err != nil {
		return -1 // not an escape: json.Unmarshal says so
	}
	return int(v)
}

// surrogates checks the \u escape at b[i:]; its length (a pair: both).
func surrogates(b []byte, i int) (int, error) {
	unit := hex4(b, i+2)
	if unit >= 0xDC00 && unit <= 0xDFFF {
		return 0, fmt.Errorf("lone surrogate escape \\u%04x in JSON", unit)
	}
	if unit >= 0xD800 && unit <= 0xDBFF {
		low := -1
		if i+8 <= len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
			low = hex4(b, i+8)
		}
		if low < 0xDC00 || low > 0xDFFF {
			return 0, fmt.Errorf("lone surrogate escape \\u%04x in JSON", unit)
		}
		return 12, nil
	}
	return 6, nil
}

// Headers returns the record's headers in order.
func (r *Record) Headers() []Header {
	if r.headerCount == 0 {
		return nil
	}
	raw := &r.batch.raw
	headers := make([]Header, 0, r.headerCount)
	nameAt, valueAt := r.nameAt, r.valueAt
	for h := r.firstHeader; h < r.firstHeader+r.headerCount; h++ {
		n := raw.headerNameLengths[h]
		name := strings.ToValidUTF8(string(raw.headerNames[nameAt:nameAt+n]), "\uFFFD")
		nameAt += n
		var value []byte
		if l := raw.headerValueLengths[h]; l >= 0 {
			value = raw.headerValues[valueAt : valueAt+uint32(l) : valueAt+uint32(l)]
			valueAt += uint32(l)
		}
		headers = append(headers, Header{Name: name, Value: value})
	}
	return headers
}

type slice struct {
	topic     string
	partition int32
	first     uint32
	count     uint32
}

// rawBatch is the batch as the host lowered it: one list per column.
type rawBatch struct {
	slices             []slice
	offsets            []int64
	timestamps         []int64
	keyLengths         []int32
	keys               []byte
	valueLengths       []int32
	values             []byte
	headerCounts       []uint32
	headerNameLengths  []uint32
	headerNames        []byte
	headerValueLengths []int32
	headerValues       []byte
}

// Batch is one batch of records, in order (by partition slice, then
// offset).
type Batch struct {
	Context Context
	raw     rawBatch
}

// Len is the number of records in the batch.
func (b *Batch) Len() int { return len(b.raw.offsets) }

// Records iterates over the batch's records in order.
func (b *Batch) Records() iter.Seq[Record] {
	return func(yield func(Record) bool) {
		raw := &b.raw
		var keyAt, valueAt, header, nameAt, headerValueAt uint32
		for _, s := range raw.slices {
			for i := s.first; i < s.first+s.count; i++ {
				r := Record{
					Index:       i,
					Topic:       s.topic,
					Partition:   s.partition,
					Offset:      raw.offsets[i],
					Timestamp:   raw.timestamps[i],
					batch:       b,
					firstHeader: header,
					headerCount: raw.headerCounts[i],
					nameAt:      nameAt,
					valueAt:     headerValueAt,
				}
				r.Key, keyAt = take(raw.keys, keyAt, raw.keyLengths[i])
				r.Value, valueAt = take(raw.values, valueAt, raw.valueLengths[i])
				for h := header; h < header+r.headerCount; h++ {
					nameAt += raw.headerNameLengths[h]
					if l := raw.headerValueLengths[h]; l > 0 {
						headerValueAt += uint32(l)
					}
				}
				header += r.headerCount
				if !yield(r) {
					return
				}
			}
		}
	}
}

// take cuts the next `length` bytes of data at `at` (nil for -1, null).
func take(data []byte, at uint32, length int32) ([]byte, uint32) {
	if length < 0 {
		return nil, at
	}
	end := at + uint32(length)
	return data[at:end:end], end
}

// Kind is the kind of an output column.
type Kind uint8

const (
	Int64 Kind = iota
	Float64
	Text
	Bytes
	Bool
)

func (k Kind) String() string {
	switch k {
	case Int64:
		return "int64"
	case Float64:
		return "float64"
	case Text:
		return "text"
	case Bytes:
		return "bytes"
	case Bool:
		return "bool"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Column declares one output column of a target.
type Column struct {
	Name string
	Kind Kind
}

// Col is a Column, for Output.Target.
func Col(name string, kind Kind) Column { return Column{Name: name, Kind: kind} }

// column holds one output column's values; nulls stays empty until the
// first null (most columns never hold one).
type column struct {
	name    string
	kind    Kind
	nulls   []uint8
	ints    []int64
	floats  []float64
	lengths []uint32
	data    []byte
}

func (c *column) mark(row uint32, null bool) {
	if null {
		for uint32(len(c.nulls)) < row {
			c.nulls = append(c.nulls, 0)
		}
		c.nulls = append(c.nulls, 1)
	} else if len(c.nulls) > 0 {
		c.nulls = append(c.nulls, 0)
	}
}

type target struct {
	name    string
	rows    uint32
	columns []column
}

// Target is the handle of a declared output target.
type Target int

type rejection struct {
	index  uint32
	reason string
}

// Output collects a batch's rows per target and its rejected records.
type Output struct {
	targets    []target
	rejections []rejection
	row        Row
	rowsHint   int
}

// Target declares (or finds, by name) a target with its columns in order;
// rows give one value per column, in this order.
func (o *Output) Target(name string, columns ...Column) Target {
	for i := range o.targets {
		if o.targets[i].name == name {
			return Target(i)
		}
	}
	mustBeUTF8("target name", name)
	t := target{name: name, columns: make([]column, len(columns))}
	for i, c := range columns {
		mustBeUTF8("column name", c.Name)
		if c.Kind > Bool {
			panic(fmt.Sprintf("target %q column %q: %v is not a kind", name, c.Name, c.Kind))
		}
		t.columns[i] = column{name: c.Name, kind: c.Kind}
		switch c.Kind {
		case Int64:
			t.columns[i].ints = make([]int64, 0, o.rowsHint)
		case Float64:
			t.columns[i].floats = make([]float64, 0, o.rowsHint)
		case Bool:
			t.columns[i].data = make([]byte, 0, o.rowsHint)
		default:
			t.columns[i].lengths = make([]uint32, 0, o.rowsHint)
		}
	}
	o.targets = append(o.targets, t)
	return Target(len(o.targets) - 1)
}

// Row starts a row of target t: then one call per column, in declared
// order (Int, Float, Text, Bytes, Bool or Null). Too few or too many
// values, or a value of the wrong kind, panic (a trap).
func (o *Output) Row(t Target) *Row {
	o.finishRow()
	if int(t) < 0 || int(t) >= len(o.targets) {
		panic(fmt.Sprintf("row for target %d, which was not declared", t))
	}
	o.row = Row{out: o, index: int(t), open: true}
	return &o.row
}

// finishRow closes the row being built, if any.
func (o *Output) finishRow() {
	r := &o.row
	if !r.open {
		return
	}
	t := r.target()
	if r.column != len(t.columns) {
		panic(fmt.Sprintf("row for target %q has %d of %d values",
			t.name, r.column, len(t.columns)))
	}
	t.rows++
	r.open = false
}

// Reject makes record r a dead letter with reason.
func (o *Output) Reject(r Record, reason string) {
	o.rejections = append(o.rejections, rejection{index: r.Index, reason: strings.ToValidUTF8(reason, "\uFFFD")})
}

// Row builds one row, column by column. It names its target by index, never
// by pointer: declaring a target appends to Output.targets, which may move
// them.
type Row struct {
	out    *Output
	index  int
	column int
	open   bool
}

func (r *Row) target() *target { return &r.out.targets[r.index] }

func (r *Row) next(null bool, given string, takes ...Kind) *column {
	if !r.open {
		panic("a value for a row that is finished: start one with out.Row")
	}
	t := r.target()
	if r.column >= len(t.columns) {
		panic(fmt.Sprintf("row for target %q has more than %d values", t.name, len(t.columns)))
	}
	c := &t.columns[r.column]
	ok := null
	for _, k := range takes {
		ok = ok || c.kind == k
	}
	if !ok {
		panic(fmt.Sprintf("column %q (%v) does not take a %s value", c.name, c.kind, given))
	}
	r.column++
	c.mark(t.rows, null)
	return c
}

// Int gives the next column an integer (an Int64 or Float64 column).
func (r *Row) Int(v int64) *Row {
	c := r.next(false, "integer", Int64, Float64)
	if c.kind == Float64 {
		c.floats = append(c.floats, float64(v))
	} else {
		c.ints = append(c.ints, v)
	}
	return r
}

// Float gives the next column a float.
func (r *Row) Float(v float64) *Row {
	c := r.next(false, "float", Float64)
	c.floats = append(c.floats, v)
	return r
}

// Text gives the next column a text; it must be UTF-8.
func (r *Row) Text(v string) *Row {
	c := r.next(false, "text", Text)
	if !utf8.ValidString(v) {
		panic(fmt.Sprintf("column %q: text is not UTF-8", c.name))
	}
	c.lengths = append(c.lengths, uint32(len(v)))
	c.data = append(c.data, v...)
	return r
}

// Bytes gives the next column raw bytes (a Bytes column, or a Text column
// if they are UTF-8).
func (r *Row) Bytes(v []byte) *Row {
	c := r.next(false, "bytes", Bytes, Text)
	if c.kind == Text && !utf8.Valid(v) {
		panic(fmt.Sprintf("column %q: text is not UTF-8", c.name))
	}
	c.lengths = append(c.lengths, uint32(len(v)))
	c.data = append(c.data, v...)
	return r
}

// Bool gives the next column a boolean.
func (r *Row) Bool(v bool) *Row {
	c := r.next(false, "boolean", Bool)
	var b byte
	if v {
		b = 1
	}
	c.data = append(c.data, b)
	return r
}

// Null makes the next column null.
func (r *Row) Null() *Row {
	c := r.next(true, "null")
	switch c.kind {
	case Int64:
		c.ints = append(c.ints, 0)
	case Float64:
		c.floats = append(c.floats, 0)
	case Bool:
		c.data = append(c.data, 0)
	default:
		c.lengths = append(c.lengths, 0)
	}
	return r
}

func mustBeUTF8(what, s string) {
	if !utf8.ValidString(s) {
		panic(fmt.Sprintf("%s %q is not UTF-8", what, s))
	}
}

// Level is a log line's level.
type Level uint32

const (
	LevelDebug Level = iota
	LevelInfo
	LevelWarn
	LevelError
)

func (l Level) String() string {
	switch l {
	case LevelDebug:
		return "debug"
	case LevelInfo:
		return "info"
	case LevelWarn:
		return "warn"
	case LevelError:
		return "error"
	}
	return fmt.Sprintf("level(%d)", uint32(l))
}

type logger struct{}

// Log writes deterministic log lines, buffered by the host per batch.
var Log logger

func (logger) Debug(message string)              { write(LevelDebug, message) }
func (logger) Info(message string)               { write(LevelInfo, message) }
func (logger) Warn(message string)               { write(LevelWarn, message) }
func (logger) Error(message string)              { write(LevelError, message) }
func (logger) Debugf(format string, args ...any) { write(LevelDebug, fmt.Sprintf(format, args...)) }
func (logger) Infof(format string, args ...any)  { write(LevelInfo, fmt.Sprintf(format, args...)) }
func (logger) Warnf(format string, args ...any)  { write(LevelWarn, fmt.Sprintf(format, args...)) }
func (logger) Errorf(format string, args ...any) { write(LevelError, fmt.Sprintf(format, args...)) }
func write(level Level, message string) {
	logWrite(uint32(level), strings.ToValidUTF8(message, "\uFFFD"))
}

// initTransform runs the constructor on the params; the error is the
// message `init` returns.
func initTransform(params []byte) (Transform, error) {
	if constructor == nil {
		return nil, errors.New("the plugin registers no transform: call sluice.Export in an init function")
	}
	return constructor(params)
}

// processBatch runs the transform; a returned error becomes a batch error.
func processBatch(t Transform, b *Batch) (*Output, *BatchError) {
	out := &Output{rowsHint: b.Len()}
	err := t.Process(b, out)
	out.finishRow()
	if err == nil {
		return out, nil
	}
	var declared *BatchError
	if errors.As(err, &declared) {
		return nil, &BatchError{Message: err.Error(), Retryable: declared.Retryable}
	}
	return nil, &BatchError{Message: err.Error()}
}
