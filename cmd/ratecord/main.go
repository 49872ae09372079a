// Command ratecord is the command-line companion of the ratecord library.
//
// Usage:
//
//	ratecord <command> [flags]
//
// Run "ratecord -h" for the list of commands and "ratecord <command> -h" for
// the flags of one.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand. run returns flag.ErrHelp when the user asked for
// help and a usageError when the arguments were wrong.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// commands returns the subcommands, in the order "ratecord -h" lists them. A
// new subcommand lives in its own file and adds one line here.
func commands() []command {
	return []command{
		{name: "emulator", summary: "serve the Discord rate-limit emulator on a loopback address", run: runEmulator},
		{name: "bench", summary: "measure rate limiters against the emulator: utilization, 429s, lateness", run: runBench},
		{name: "proxy", summary: "serve a reverse proxy to Discord's API that keeps every bot inside the rate limits", run: runProxy},
	}
}

// usageError reports wrong arguments; the exit status is 2. reported means
// the flag package has already printed it.
type usageError struct {
	msg      string
	reported bool
}

func (e *usageError) Error() string { return e.msg }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches args to a subcommand and returns the exit status: 0 on
// success or help, 1 when the command failed, 2 on a usage error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return 0
	}
	for _, c := range commands() {
		if c.name != name {
			continue
		}
		err := c.run(ctx, args[1:], stdout, stderr)
		var ue *usageError
		switch {
		case err == nil, errors.Is(err, flag.ErrHelp):
			return 0
		case errors.As(err, &ue):
			if !ue.reported {
				fmt.Fprintf(stderr, "ratecord %s: %v\n", name, err)
			}
			return 2
		default:
			fmt.Fprintf(stderr, "ratecord %s: %v\n", name, err)
			return 1
		}
	}
	fmt.Fprintf(stderr, "ratecord: unknown command %q\n\n", name)
	usage(stderr)
	return 2
}

// usage lists the subcommands.
func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: ratecord <command> [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, `Run "ratecord <command> -h" for the flags of a command.`)
}
