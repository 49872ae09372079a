package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

// runEmulator serves the Discord rate-limit emulator until ctx is cancelled,
// then shuts it down gracefully and prints what it saw.
func runEmulator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("ratecord emulator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: ratecord emulator [flags]")
		fmt.Fprintln(stderr)
		fmt.Fprintln(stderr, "Serves an emulator of Discord's REST rate limits on a loopback address.")
		fmt.Fprintln(stderr)
		fs.PrintDefaults()
	}
	addr := fs.String("addr", "127.0.0.1:8089", "loopback `address` to listen on (port 0 picks a free port)")
	global := fs.Int("global", 50, "global limit in requests per second per credential (0 disables it); "+
		"without this flag, the limit that goes with -max-concurrency")
	maxConcurrency := fs.Int("max-concurrency", 1, "session_start_limit.max_concurrency reported by GET /gateway/bot; "+
		"sets the global limit to match (1: 50/s, more: max(500, 25 × `n`)/s) unless -global is given")
	scale := fs.Float64("time-scale", 1, "`factor` applied to every window and duration (0.1 runs ten times faster)")
	latency := fs.Duration("latency", 0, "fixed latency added to every response")
	jitter := fs.Duration("jitter", 0, "random latency of up to this much added to every response")
	tokens := fs.String("tokens", "", "comma-separated valid tokens; when empty every token is accepted")
	invalidLimit := fs.Int("invalid-limit", 10000, "invalid requests per client IP within -invalid-window before a ban (0 disables bans)")
	invalidWindow := fs.Duration("invalid-window", 10*time.Minute, "window of the invalid-request limit")
	ban := fs.Duration("ban", time.Hour, "how long a ban lasts")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return &usageError{msg: err.Error(), reported: true}
	}
	if fs.NArg() > 0 {
		return &usageError{msg: fmt.Sprintf("unexpected arguments %q", fs.Args())}
	}
	if *scale <= 0 {
		return &usageError{msg: fmt.Sprintf("-time-scale %v must be positive", *scale)}
	}
	if *maxConcurrency < 1 {
		return &usageError{msg: fmt.Sprintf("-max-concurrency %d must be at least 1", *maxConcurrency)}
	}
	globalSet := false
	fs.Visit(func(f *flag.Flag) { globalSet = globalSet || f.Name == "global" })

	opts := []discordtest.Option{
		discordtest.WithAddr(*addr),
		discordtest.WithMaxConcurrency(*maxConcurrency),
		discordtest.WithTimeScale(*scale),
		discordtest.WithLatency(*latency, *jitter),
		discordtest.WithInvalidRequestLimit(*invalidLimit, *invalidWindow),
		discordtest.WithBanDuration(*ban),
	}
	if globalSet {
		opts = append(opts, discordtest.WithGlobalLimit(*global)) // after WithMaxConcurrency: it wins
	}
	if list := splitList(*tokens); len(list) > 0 {
		opts = append(opts, discordtest.WithTokens(list...))
	}
	srv, err := discordtest.Start(opts...)
	if err != nil {
		return err
	}
	defer srv.Close()

	fmt.Fprintf(stdout, "Discord rate-limit emulator listening on %s\n", srv.URL())
	limit := discordtest.GlobalLimitFor(*maxConcurrency)
	if globalSet {
		limit = *global
	}
	fmt.Fprintf(stdout, "Global limit %d requests/s per credential; GET /gateway/bot reports max_concurrency %d.\n", limit, *maxConcurrency)
	fmt.Fprintf(stdout, "Point a bot at it by using %s/api/v10 as the API base URL instead of https://discord.com/api/v10.\n", srv.URL())
	fmt.Fprintln(stdout, "Stop it with Ctrl-C.")

	<-ctx.Done()
	srv.Close()
	st := srv.Stats()
	fmt.Fprintf(stdout, "Stopped after %d requests: %d answered 429 (%d avoidable, %d unavoidable), %d bans.\n",
		st.Requests, st.ByStatus[429], st.Avoidable, st.Unavoidable, st.Bans)
	return nil
}

// splitList splits a comma-separated list, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
