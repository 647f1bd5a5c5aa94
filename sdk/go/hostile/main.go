// A deliberately misbehaving Go transform, for the host's tests: each
// record's value names what it tries, and the row it writes (target
// `probe`: offset, what, n, text) says what it got. It proves that WASI is
// deterministic and gives no access, and that the sandbox holds.
//
//   - clock: n = time.Now() in ms (must be the batch time)
//   - sleep: n = monotonic ns that pass over time.Sleep(time.Hour) (virtual:
//     an hour, at once)
//   - random: n = 62 bits of math/rand/v2, text = crypto/rand bytes in hex
//   - file: tries to read /etc/passwd; text = the error
//   - listdir: tries to list /; text = the error or what it saw
//   - socket: tries to dial 127.0.0.1:5432; text = the error
//   - env: n = number of environment variables
//   - print: prints 20,000 lines
//   - spin, bomb, recurse, panic, exit: loops forever, allocates without
//     end, recurses without end, panics, calls os.Exit(3)
//   - anything else: echoed (n = its length)
package main

import (
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"time"

	sluice "sluice.dev/plugin"
)

type hostile struct{}

// attempt runs action and reports (1, what it got) or (0, the error).
func attempt(action func() (string, error)) (int64, string) {
	got, err := action()
	if err != nil {
		return 0, "error: " + err.Error()
	}
	return 1, got
}

var hoard [][]byte

//go:noinline
func recurse(n int) int {
	var frame [256]byte
	frame[n&255] = byte(n)
	return recurse(n+1) + int(frame[(n*7)&255])
}

func (hostile) Process(batch *sluice.Batch, out *sluice.Output) error {
	t := out.Target("probe",
		sluice.Col("offset", sluice.Int64),
		sluice.Col("what", sluice.Text),
		sluice.Col("n", sluice.Int64),
		sluice.Col("text", sluice.Text),
	)
	for r := range batch.Records() {
		what, _ := r.Text()
		var n int64
		text := ""
		switch what {
		case "clock":
			n = time.Now().UnixMilli()
		case "sleep":
			before := time.Now()
			time.Sleep(time.Hour)
			n = int64(time.Since(before))
		case "random":
			n = int64(rand.Uint64() >> 2)
			b := make([]byte, 8)
			crand.Read(b)
			text = hex.EncodeToString(b)
		case "file":
			n, text = attempt(func() (string, error) {
				b, err := os.ReadFile("/etc/passwd")
				return string(b), err
			})
		case "listdir":
			n, text = attempt(func() (string, error) {
				entries, err := os.ReadDir("/")
				return fmt.Sprint(len(entries)), err
			})
		case "socket":
			n, text = attempt(func() (string, error) {
				c, err := net.Dial("tcp", "127.0.0.1:5432")
				if c != nil {
					c.Close()
				}
				return "connected", err
			})
		case "env":
			n = int64(len(os.Environ()))
		case "print":
			for i := 0; i < 20000; i++ {
				fmt.Printf("line %d of a flood\n", i)
			}
		case "spin":
			for {
			}
		case "bomb":
			for {
				b := make([]byte, 1<<20)
				for i := 0; i < len(b); i += 4096 {
					b[i] = 1
				}
				hoard = append(hoard, b)
			}
		case "recurse":
			n = int64(recurse(0))
		case "panic":
			panic("hostile plugin panics on purpose")
		case "exit":
			os.Exit(3)
		default:
			n = int64(len(what))
		}
		out.Row(t).Int(r.Offset).Text(what).Int(n).Text(text)
	}
	return nil
}

func init() {
	sluice.Export(func([]byte) (sluice.Transform, error) { return hostile{}, nil })
}

func main() {}
