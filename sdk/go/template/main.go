// {{name}}: a sluice transform in Go.
//
// Each record's value is read as text; a record whose value is null or not
// UTF-8 is rejected (it becomes a dead letter); every other one gives a row of target `out`
// with its offset and its value in upper case, after the `prefix` param.
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
		value, err := r.Text()
		if err != nil {
			out.Reject(r, err.Error()) // a dead letter with this reason
			continue
		}
		out.Row(t).Int(r.Offset).Text(u.Prefix + strings.ToUpper(value))
	}
	sluice.Log.Info(fmt.Sprintf("%d records", batch.Len()))
	return nil // or &sluice.BatchError{Message: "...", Retryable: true}
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
