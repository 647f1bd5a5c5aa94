// {{name}}: a sluice transform in Go.
//
// Each record's value is read as UTF-8 text (bad bytes replaced by U+FFFD);
// a record with no value is rejected (it becomes a dead letter); every other
// one gives a row of target `out` with its offset and its value, ASCII
// letters in upper case, after the `prefix` param. Every language's
// template does exactly this.
//
// Try it:   sluice build && sluice test dist/{{name}}.wasm --input sample.jsonl
package main

import (
	"encoding/json"
	"fmt"
	"strings"

	sluice "sluice.dev/plugin"
)

type upper struct {
	Prefix string `json:"prefix"`
}

func (u *upper) Process(batch *sluice.Batch, out *sluice.Output) error {
	t := out.Target("out", sluice.Col("offset", sluice.Int64), sluice.Col("value", sluice.Text))
	for r := range batch.Records() {
		if r.Value == nil {
			out.Reject(r, "no value") // a dead letter with this reason
			continue
		}
		out.Row(t).Int(r.Offset).Text(u.Prefix + asciiUpper(r.LossyText()))
	}
	sluice.Log.Info(fmt.Sprintf("%d records", batch.Len()))
	return nil // or &sluice.BatchError{Message: "...", Retryable: true}
}

// asciiUpper upper-cases the ASCII letters of s and leaves the rest.
func asciiUpper(s string) string {
	return strings.Map(func(c rune) rune {
		if c >= 'a' && c <= 'z' {
			return c - 'a' + 'A'
		}
		return c
	}, s)
}

func init() {
	// The pipeline's [module.params], as JSON; an error refuses them.
	sluice.Export(func(params []byte) (sluice.Transform, error) {
		u := &upper{}
		if err := json.Unmarshal(params, u); err != nil {
			return nil, fmt.Errorf("params: %w", err)
		}
		return u, nil
	})
}

func main() {}
