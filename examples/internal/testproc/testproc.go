// Package testproc runs a test binary again as helper processes, for the
// examples' tests of processes that share one Redis store.
package testproc

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// Run runs the test binary n more times at once, each running only the
// test named test, with env added to the environment and indexEnv set to
// the process's index (0 to n-1). It fails t with each process's output
// when that process fails.
func Run(t *testing.T, n int, test, indexEnv string, env ...string) {
	t.Helper()
	errs := make(chan error, n)
	for p := range n {
		go func() {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.v")
			cmd.Env = append(append(os.Environ(), env...), indexEnv+"="+strconv.Itoa(p))
			out, err := cmd.CombinedOutput()
			if err != nil {
				err = fmt.Errorf("process %d: %v\n%s", p, err, out)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
