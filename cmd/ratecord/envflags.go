package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// envName returns the environment variable that stands in for a flag of the
// proxy: RATECORD_ and the flag's name in upper case, dashes as underscores
// ("redis-fail" → RATECORD_REDIS_FAIL).
func envName(flagName string) string {
	return "RATECORD_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag of fs not given on the command line from its
// environment variable (see envName), when that is set. lookup is
// [os.LookupEnv] outside tests. A value the flag rejects is a usage error
// naming the variable.
func applyEnv(fs *flag.FlagSet, lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] {
			return
		}
		v, ok := lookup(envName(f.Name))
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = &usageError{msg: fmt.Sprintf("invalid value for %s: %v", envName(f.Name), e)}
		}
	})
	return err
}

// annotateEnv appends the environment variable of every flag to its usage
// text, so that -h lists both.
func annotateEnv(fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		f.Usage += " [$" + envName(f.Name) + "]"
	})
}
