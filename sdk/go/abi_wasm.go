//go:build wasip1

// The canonical ABI of the `sluice:plugin` world, by hand (there is no
// bindings generator for Go here): the core exports `init`, `process` and
// `cabi_realloc`, the core imports `write` of `sluice:plugin/log`,
// `get`, `set`, `delete` of `sluice:plugin/state` and the calls of
// `sluice:plugin/time`, and the
// memory layouts of their arguments and results. It must not hold
// transform logic: sluice.go does that.
//
// Every block the host is given (or gives) stays reachable from `pinned`
// until the instance ends, so Go's garbage collector (which never moves
// heap objects) cannot free memory the host still reads. The host makes a
// fresh instance for every batch, so nothing is ever released.

package sluice

import (
	"runtime/debug"
	"unsafe"
)

// While the host lowers a call's arguments (through cabi_realloc) the
// instance may not call any import, and a garbage collection would (Go's
// collector reads the clock): a trap, "cannot leave component instance".
// So the collector is off until `process` starts, which is after the host
// has lowered its batch, and on while the transform runs. Only `init`'s
// small params and the batch are allocated with it off.
func init() {
	debug.SetGCPercent(-1)
}

// collectGarbageFromNowOn turns the collector on (Go's default pacing).
func collectGarbageFromNowOn() {
	debug.SetGCPercent(100)
}

//go:wasmimport sluice:plugin/log@0.1.3 write
func logWrite(level uint32, message string)

// get: func(index: u32, key: list<u8>) -> option<list<u8>>. The result
// goes to a 12-byte block: discriminant (u8) at 0, the list at 4.
//
//go:wasmimport sluice:plugin/state@0.1.3 get
func stateGetImport(index uint32, key string, result unsafe.Pointer)

// set: func(index: u32, key: list<u8>, value: list<u8>, expires-at-ms:
// option<s64>); the option flattens to a discriminant and an s64.
//
//go:wasmimport sluice:plugin/state@0.1.3 set
func stateSetImport(index uint32, key string, value string, hasExpiry uint32, expiresAtMs int64)

//go:wasmimport sluice:plugin/state@0.1.3 delete
func stateDeleteImport(index uint32, key string)

// stateGet calls `get`. The host allocates the value through cabi_realloc
// while it lowers the result, when the instance may not call an import: so
// the collector (which reads the clock, an import) is held off for the
// call, as it is while the batch is lowered.
func stateGet(index uint32, key string) ([]byte, bool) {
	return optionalBytes(func(result unsafe.Pointer) { stateGetImport(index, key, result) })
}

// optionalBytes makes a call whose result is an option<list<u8>> in a
// 12-byte block (discriminant (u8) at 0, the list at 4), the collector
// held off meanwhile (see stateGet).
func optionalBytes(call func(result unsafe.Pointer)) ([]byte, bool) {
	result := words(3)
	pinned = append(pinned, result)
	percent := debug.SetGCPercent(-1)
	call(unsafe.Pointer(&result[0]))
	debug.SetGCPercent(percent)
	if result[0]&0xff == 0 {
		return nil, false
	}
	p, n := unsafe.Pointer(uintptr(result[1])), result[2]
	if n == 0 {
		return []byte{}, true
	}
	return unsafe.Slice((*byte)(p), n), true
}

func stateSet(index uint32, key string, value []byte, expires bool, expiresAtMs int64) {
	var hasExpiry uint32
	if expires {
		hasExpiry = 1
	}
	stateSetImport(index, key, unsafe.String(unsafe.SliceData(value), len(value)), hasExpiry, expiresAtMs)
}

func stateDelete(index uint32, key string) { stateDeleteImport(index, key) }

// watermark: func(index: u32) -> option<s64>. The result goes to a
// 16-byte block: discriminant (u8) at 0, the s64 at 8.
//
//go:wasmimport sluice:plugin/time@0.1.3 watermark
func timeWatermarkImport(index uint32, result unsafe.Pointer)

// set-record-time: func(index: u32, time-ms: option<s64>); the option
// flattens to a discriminant and an s64.
//
//go:wasmimport sluice:plugin/time@0.1.3 set-record-time
func timeSetRecordTimeImport(index uint32, hasTime uint32, timeMs int64)

//go:wasmimport sluice:plugin/time@0.1.3 set-timer
func timeSetTimerImport(index uint32, key string, atMs int64)

//go:wasmimport sluice:plugin/time@0.1.3 delete-timer
func timeDeleteTimerImport(index uint32, key string, atMs int64)

//go:wasmimport sluice:plugin/time@0.1.3 set-timer-value
func timeSetTimerValueImport(index uint32, key string, atMs int64, value string)

// timer-value: func(index: u32, key: list<u8>, at-ms: s64) ->
// option<list<u8>>: the result as `get`'s.
//
//go:wasmimport sluice:plugin/time@0.1.3 timer-value
func timeTimerValueImport(index uint32, key string, atMs int64, result unsafe.Pointer)

// due-timers-with-values: func() -> list<fired-timer-value>. The result
// goes to an 8-byte block (the list); a fired-timer-value is 32 bytes:
// index (u32) at 0, key (a list) at 4, at-ms (s64) at 16, value (a list)
// at 24.
//
//go:wasmimport sluice:plugin/time@0.1.3 due-timers-with-values
func timeDueTimersImport(result unsafe.Pointer)

//go:wasmimport sluice:plugin/time@0.1.3 late
func timeLateImport(index uint32, reason string)

// watermarkResult is where `watermark` writes, once per record: one
// block for the instance (it runs one call at a time), not one allocation
// per call.
var watermarkResult [2]uint64

func timeWatermark(index uint32) (int64, bool) {
	timeWatermarkImport(index, unsafe.Pointer(&watermarkResult[0]))
	return int64(watermarkResult[1]), watermarkResult[0]&0xff != 0
}

func timeSetRecordTime(index uint32, has bool, timeMs int64) {
	var hasTime uint32
	if has {
		hasTime = 1
	}
	timeSetRecordTimeImport(index, hasTime, timeMs)
}

func timeSetTimer(index uint32, key string, atMs int64) { timeSetTimerImport(index, key, atMs) }

func timeSetTimerValue(index uint32, key string, atMs int64, value []byte) {
	timeSetTimerValueImport(index, key, atMs, unsafe.String(unsafe.SliceData(value), len(value)))
}

func timeTimerValue(index uint32, key string, atMs int64) ([]byte, bool) {
	return optionalBytes(func(result unsafe.Pointer) { timeTimerValueImport(index, key, atMs, result) })
}

func timeDeleteTimer(index uint32, key string, atMs int64) {
	timeDeleteTimerImport(index, key, atMs)
}

func timeLate(index uint32, reason string) { timeLateImport(index, reason) }

// timeDueTimers calls `due-timers-with-values`; the host allocates the
// list, the keys and the values through cabi_realloc while it lowers
// them, so the collector is held off for the call (as for stateGet).
func timeDueTimers() []FiredTimer {
	result := words(2)
	pinned = append(pinned, result)
	percent := debug.SetGCPercent(-1)
	timeDueTimersImport(unsafe.Pointer(&result[0]))
	debug.SetGCPercent(percent)
	p, n := unsafe.Pointer(uintptr(result[0])), result[1]
	timers := make([]FiredTimer, n)
	for i := range timers {
		e := unsafe.Add(p, 32*i)
		timers[i] = FiredTimer{
			Index: *(*uint32)(e),
			Key:   readString(e, 4),
			AtMs:  *(*int64)(unsafe.Add(e, 16)),
			Value: readList[byte](e, 24),
		}
	}
	return timers
}

// adapterArena is where the WASI preview-1 adapter keeps its state and
// stack. The adapter allocates them on its first WASI call, which Go's
// runtime makes while it initialises, before any Go function can run: so
// `sluice build` finds this array by its marker and adds a plain-Wasm
// `cabi_realloc_adapter` that bump-allocates in it
// (host/src/plugin_build/adapter_realloc.rs). The marker and the size must
// match that file's.
var adapterArena = [256 << 10]byte{
	's', 'l', 'u', 'i', 'c', 'e', ':', 'w', 'a', 's', 'i', '-', 'a', 'd', 'a', 'p',
	't', 'e', 'r', '-', 'a', 'r', 'e', 'n', 'a', ':', 'v', '1', 0, 0, 0, 0,
}

// pinned keeps alive every block handed across the boundary.
var pinned []any

// empty is where zero-length blocks point: aligned, never written.
var empty [1]uint64

//go:wasmexport cabi_realloc
func cabiRealloc(old unsafe.Pointer, oldSize, align, newSize uint32) unsafe.Pointer {
	if align > 8 {
		panic("cabi_realloc: alignment over 8")
	}
	if newSize == 0 {
		return unsafe.Pointer(&empty)
	}
	block := make([]uint64, (newSize+7)/8)
	pinned = append(pinned, block)
	p := unsafe.Pointer(&block[0])
	if old != nil && oldSize > 0 {
		copy(unsafe.Slice((*byte)(p), newSize), unsafe.Slice((*byte)(old), min(oldSize, newSize)))
	}
	return p
}

// transform is what `init` made; `process` runs it.
var transform Transform

// init: func(params: string) -> result<_, string>. The result goes to a
// 12-byte block: discriminant (u8) at 0, the error string at 4.
//
//go:wasmexport init
func wasmInit(params string) unsafe.Pointer {
	// A use of the arena, so the linker keeps it (the adapter allocates
	// past the marker, so this byte stays).
	if adapterArena[0] != 's' {
		panic("the WASI adapter's arena is corrupt")
	}
	result := words(3)
	t, err := initTransform([]byte(params))
	if err != nil {
		result[0] = 1
		putString(result[1:3], err.Error())
		return pin(result)
	}
	transform = t
	return pin(result)
}

// process: func(ctx: batch-context, batch: record-batch) ->
// result<output, batch-error>. Its 30 flat parameters exceed 16, so the
// host passes them in one 128-byte block: the context (two strings, s64,
// u64: 32 bytes) then the batch's twelve lists (8 bytes each) at 32. The
// result goes to a 20-byte block: discriminant at 0, then output
// (targets and rejections lists) or batch-error (message string, bool) at
// 4.
//
//go:wasmexport process
func wasmProcess(args unsafe.Pointer) unsafe.Pointer {
	if transform == nil {
		panic("process before a successful init")
	}
	collectGarbageFromNowOn()
	b := &Batch{
		Context: Context{
			Pipeline:    readString(args, 0),
			BatchID:     readString(args, 8),
			BatchTimeMs: *(*int64)(unsafe.Add(args, 16)),
			Seed:        *(*uint64)(unsafe.Add(args, 24)),
		},
	}
	lists := unsafe.Add(args, 32)
	raw := &b.raw
	raw.slices = readSlices(lists, 0)
	raw.offsets = readList[int64](lists, 8)
	raw.timestamps = readList[int64](lists, 16)
	raw.keyLengths = readList[int32](lists, 24)
	raw.keys = readList[byte](lists, 32)
	raw.valueLengths = readList[int32](lists, 40)
	raw.values = readList[byte](lists, 48)
	raw.headerCounts = readList[uint32](lists, 56)
	raw.headerNameLengths = readList[uint32](lists, 64)
	raw.headerNames = readList[byte](lists, 72)
	raw.headerValueLengths = readList[int32](lists, 80)
	raw.headerValues = readList[byte](lists, 88)

	result := words(5)
	out, failed := processBatch(transform, b)
	if failed != nil {
		result[0] = 1
		putString(result[1:3], failed.Message)
		if failed.Retryable {
			result[3] = 1
		}
		return pin(result)
	}
	putList(result[1:3], lowerTargets(out.targets), len(out.targets))
	putList(result[3:5], lowerRejections(out.rejections), len(out.rejections))
	return pin(result)
}

// lowerTargets lays out list<target-rows>: 20 bytes each (target string,
// rows u32, columns list).
func lowerTargets(targets []target) unsafe.Pointer {
	if len(targets) == 0 {
		return nil
	}
	block := words(5 * len(targets))
	for i := range targets {
		t := &targets[i]
		w := block[5*i : 5*i+5]
		putString(w[0:2], t.name)
		w[2] = t.rows
		putList(w[3:5], lowerColumns(t.columns), len(t.columns))
	}
	return pin(block)
}

// lowerColumns lays out list<column>: 36 bytes each (name string, nulls
// list, then column-data: discriminant at 16, payload at 20: one list, or
// var-column's two).
func lowerColumns(columns []column) unsafe.Pointer {
	if len(columns) == 0 {
		return nil
	}
	block := words(9 * len(columns))
	for i := range columns {
		c := &columns[i]
		w := block[9*i : 9*i+9]
		putString(w[0:2], c.name)
		putList(w[2:4], pinSlice(c.nulls), len(c.nulls))
		switch c.kind {
		case Int64:
			w[4] = 0
			putList(w[5:7], pinSlice(c.ints), len(c.ints))
		case Float64:
			w[4] = 1
			putList(w[5:7], pinSlice(c.floats), len(c.floats))
		case Text, Bytes:
			w[4] = 2
			if c.kind == Bytes {
				w[4] = 3
			}
			putList(w[5:7], pinSlice(c.lengths), len(c.lengths))
			putList(w[7:9], pinSlice(c.data), len(c.data))
		case Bool:
			w[4] = 4
			putList(w[5:7], pinSlice(c.data), len(c.data))
		}
	}
	return pin(block)
}

// lowerRejections lays out list<rejection>: 12 bytes each (index u32,
// reason string).
func lowerRejections(rejections []rejection) unsafe.Pointer {
	if len(rejections) == 0 {
		return nil
	}
	block := words(3 * len(rejections))
	for i, r := range rejections {
		block[3*i] = r.index
		putString(block[3*i+1:3*i+3], r.reason)
	}
	return pin(block)
}

// words is a zeroed, 4-byte aligned block of n 32-bit words.
func words(n int) []uint32 { return make([]uint32, n) }

func pin(block []uint32) unsafe.Pointer {
	pinned = append(pinned, block)
	return unsafe.Pointer(&block[0])
}

// pinSlice keeps s alive and returns where its elements start (nil if none).
func pinSlice[T any](s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	pinned = append(pinned, s)
	return unsafe.Pointer(unsafe.SliceData(s))
}

// address is a pointer as the 32-bit offset into linear memory it is.
func address(p unsafe.Pointer) uint32 { return uint32(uintptr(p)) }

// putList writes a list's (pointer, length) into two words.
func putList(w []uint32, p unsafe.Pointer, n int) {
	w[0], w[1] = address(p), uint32(n)
}

// putString writes a string's (pointer, length) into two words.
func putString(w []uint32, s string) {
	pinned = append(pinned, s)
	putList(w, unsafe.Pointer(unsafe.StringData(s)), len(s))
}

// pointerAt reads the (pointer, length) descriptor at base+offset.
func pointerAt(base unsafe.Pointer, offset uintptr) (unsafe.Pointer, uint32) {
	ptr := *(*uint32)(unsafe.Add(base, offset))
	n := *(*uint32)(unsafe.Add(base, offset+4))
	return unsafe.Pointer(uintptr(ptr)), n
}

// readList reads the list<T> whose descriptor is at base+offset; its
// memory is a block the host filled through cabi_realloc.
func readList[T any](base unsafe.Pointer, offset uintptr) []T {
	p, n := pointerAt(base, offset)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*T)(p), n)
}

func readString(base unsafe.Pointer, offset uintptr) string {
	p, n := pointerAt(base, offset)
	if n == 0 {
		return ""
	}
	return unsafe.String((*byte)(p), n)
}

// readSlices reads list<partition-slice>: 20 bytes each (topic string,
// partition s32, first u32, count u32).
func readSlices(base unsafe.Pointer, offset uintptr) []slice {
	p, n := pointerAt(base, offset)
	slices := make([]slice, n)
	for i := range slices {
		e := unsafe.Add(p, 20*i)
		slices[i] = slice{
			topic:     readString(e, 0),
			partition: *(*int32)(unsafe.Add(e, 8)),
			first:     *(*uint32)(unsafe.Add(e, 12)),
			count:     *(*uint32)(unsafe.Add(e, 16)),
		}
	}
	return slices
}
