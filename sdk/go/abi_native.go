//go:build !wasip1

// Outside Wasm (`go vet`, `go test` of a transform's own logic on the
// machine), log lines go to stderr; nothing here crosses a component
// boundary. It must not be linked into a module: abi_wasm.go is.

package sluice

import (
	"fmt"
	"os"
)

func logWrite(level uint32, message string) {
	fmt.Fprintf(os.Stderr, "[%v] %s\n", Level(level), message)
}
