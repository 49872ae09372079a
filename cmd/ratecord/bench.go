package main

import (
	"context"
	"io"

	"github.com/ratecord/ratecord/internal/bench"
)

// runBench is "ratecord bench": the load benchmark against an in-process
// emulator. Peers that need other modules (discordgo) are measured by the
// same code from the examples module.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return bench.Main(ctx, args, stdout, stderr)
}
