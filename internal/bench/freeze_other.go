//go:build !unix

package bench

import "os"

// canFreeze reports whether this system can stop and continue processes.
const canFreeze = false

func stopProcess(*os.Process) error     { return errNoFreeze }
func continueProcess(*os.Process) error { return errNoFreeze }
