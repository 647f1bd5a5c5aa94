//go:build !wasip1

// Outside Wasm (`go vet`, `go test` of a transform's own logic on the
// machine), log lines go to stderr and state to a map; nothing here crosses a component
// boundary. It must not be linked into a module: abi_wasm.go is.

package sluice

import (
	"fmt"
	"os"
)

func logWrite(level uint32, message string) {
	fmt.Fprintf(os.Stderr, "[%v] %s\n", Level(level), message)
}

// Outside Wasm, state is a plain map of this process (one partition, no
// expiry): enough to unit-test a transform's logic, nothing more.
var nativeState = map[string][]byte{}

func stateGet(_ uint32, key string) ([]byte, bool) {
	v, ok := nativeState[key]
	return v, ok
}

func stateSet(_ uint32, key string, value []byte, _ bool, _ int64) {
	nativeState[key] = append([]byte{}, value...)
}

func stateDelete(_ uint32, key string) { delete(nativeState, key) }

// Outside Wasm there is no partition clock: no watermark, no timer comes
// due; setting times and timers does nothing.
func timeWatermark(uint32) (int64, bool)                  { return 0, false }
func timeSetRecordTime(uint32, bool, int64)               {}
func timeSetTimer(uint32, string, int64)                  {}
func timeSetTimerValue(uint32, string, int64, []byte)     {}
func timeTimerValue(uint32, string, int64) ([]byte, bool) { return nil, false }
func timeDeleteTimer(uint32, string, int64)               {}
func timeLate(uint32, string)                             {}
func timeDueTimers() []FiredTimer                         { return nil }
