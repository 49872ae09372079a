//go:build !linux

package bench

import "os/exec"

// dieWithParent does nothing where the kernel cannot kill a child when
// its parent ends.
func dieWithParent(*exec.Cmd) {}
