//go:build unix

package bench

import (
	"os"
	"syscall"
)

// canFreeze reports whether this system can stop and continue processes.
const canFreeze = true

func stopProcess(p *os.Process) error     { return p.Signal(syscall.SIGSTOP) }
func continueProcess(p *os.Process) error { return p.Signal(syscall.SIGCONT) }
