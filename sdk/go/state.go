// Keyed state as a Go transform sees it: the typed helpers over the
// world's `state` import (abi_wasm.go lowers the calls; abi_native.go stands
// in outside Wasm). It must not keep state itself: the host does, and
// commits it with the batch.

package sluice

import (
	"strconv"
	"unicode/utf8"
)

// State is the keyed state of the input partition a record came from, as
// the record sees it: the state as the batch started plus the batch's own
// earlier writes. The host commits what the batch writes with its rows and
// offsets, exactly once, and replays it in `sluice verify`. Keys (any
// bytes, as a Go string) are at most 255 bytes; values at most
// `limits.max_state_value_kib`: past either the call traps and the record
// becomes a dead letter.
//
// The typed helpers store integers as their decimal text and strings as
// UTF-8: the same bytes in every SDK.
type State struct {
	index uint32
}

// State is the keyed state of the partition this record came from.
func (r *Record) State() State { return State{index: r.Index} }

// Get is the value under key; false if absent or expired.
func (s State) Get(key string) ([]byte, bool) { return stateGet(s.index, key) }

// Set stores value under key.
func (s State) Set(key string, value []byte) { stateSet(s.index, key, value, false, 0) }

// SetExpiring stores value under key until expiresAtMs (ms since the Unix
// epoch): batches whose batch time is at or past it read it as absent.
// Expiry follows batch time (Context.BatchTimeMs) or a time the module
// computes (a record's timestamp), never the host's clock.
func (s State) SetExpiring(key string, value []byte, expiresAtMs int64) {
	stateSet(s.index, key, value, true, expiresAtMs)
}

// Delete removes key.
func (s State) Delete(key string) { stateDelete(s.index, key) }

// GetInt64 is the integer under key (decimal text: an optional '-' then
// digits, in int64's range); false if absent or anything else.
func (s State) GetInt64(key string) (int64, bool) {
	value, ok := s.Get(key)
	if !ok {
		return 0, false
	}
	digits := value
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(value), 10, 64)
	return n, err == nil
}

// SetInt64 stores v under key as decimal text.
func (s State) SetInt64(key string, v int64) {
	s.Set(key, strconv.AppendInt(nil, v, 10))
}

// GetString is the text under key; false if absent or not UTF-8.
func (s State) GetString(key string) (string, bool) {
	value, ok := s.Get(key)
	if !ok || !utf8.Valid(value) {
		return "", false
	}
	return string(value), true
}

// SetString stores v under key as its bytes (UTF-8 for Go text).
func (s State) SetString(key string, v string) { s.Set(key, []byte(v)) }
