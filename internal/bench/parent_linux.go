package bench

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill cmd's process when this one ends, even
// by SIGKILL: a stopped worker or a Redis server of the bench does not
// outlive it.
func dieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
