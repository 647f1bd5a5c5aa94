// The conformance transform in Go (docs/languages.md states it; every
// language's copy must give byte-identical output on the same input).
package main

import (
	"strings"

	sluice "sluice.dev/plugin"
)

type conformance struct{}

// asciiWords is the maximal runs of ASCII letters and digits, lowercased.
func asciiWords(text string) []string {
	words := strings.FieldsFunc(text, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9')
	})
	for i, w := range words {
		words[i] = strings.ToLower(w) // ASCII only, by construction
	}
	return words
}

func (conformance) Process(batch *sluice.Batch, out *sluice.Output) error {
	events := out.Target("events",
		sluice.Col("offset", sluice.Int64),
		sluice.Col("user", sluice.Text),
		sluice.Col("score", sluice.Float64),
		sluice.Col("scaled", sluice.Float64),
		sluice.Col("key", sluice.Bytes),
		sluice.Col("words", sluice.Int64),
		sluice.Col("vip", sluice.Bool),
	)
	words := out.Target("words", sluice.Col("offset", sluice.Int64), sluice.Col("word", sluice.Text))
	now := batch.Context.BatchTimeMs
	for r := range batch.Records() {
		var parsed any
		if err := r.JSON(&parsed); err != nil {
			out.Reject(r, "not a JSON object")
			continue
		}
		obj, ok := parsed.(map[string]any)
		if !ok {
			out.Reject(r, "not a JSON object")
			continue
		}
		if keep, ok := obj["keep"].(bool); ok && !keep {
			continue
		}
		var split []string
		if text, ok := obj["text"].(string); ok {
			split = asciiWords(text)
		}
		row := out.Row(events).Int(r.Offset)
		if user, ok := obj["user"].(string); ok {
			row.Text(user)
		} else {
			row.Null()
		}
		if score, ok := obj["score"].(float64); ok {
			row.Float(score).Float(score * 0.1)
		} else {
			row.Null().Null()
		}
		if r.Key != nil {
			row.Bytes(r.Key)
		} else {
			row.Null()
		}
		vip, _ := obj["vip"].(bool)
		row.Int(int64(len(split))).Bool(vip)
		for _, w := range split {
			out.Row(words).Int(r.Offset).Text(w)
		}
		user, ok := obj["user"].(string)
		if !ok {
			continue
		}
		state := r.State()
		n, _ := state.GetInt64("n:" + user)
		n++
		last, hasLast := state.GetString("last:" + user)
		if forget, _ := obj["forget"].(bool); forget {
			state.Delete("n:" + user)
		} else {
			state.SetInt64("n:"+user, n)
		}
		expires := now + 60_000
		if expire, _ := obj["expire"].(bool); expire {
			expires = now
		}
		text, _ := obj["text"].(string)
		state.SetExpiring("last:"+user, []byte(text), expires)
		// Declared where its first row is made: mid-batch, after rows of
		// the other targets (later calls find it by name).
		seen := out.Target("seen",
			sluice.Col("offset", sluice.Int64),
			sluice.Col("user", sluice.Text),
			sluice.Col("n", sluice.Int64),
			sluice.Col("last", sluice.Text),
		)
		row = out.Row(seen).Int(r.Offset).Text(user).Int(n)
		if hasLast {
			row.Text(last)
		} else {
			row.Null()
		}
	}
	return nil
}

func init() {
	sluice.Export(func([]byte) (sluice.Transform, error) { return conformance{}, nil })
}

func main() {}
