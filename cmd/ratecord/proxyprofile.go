//go:build proxyprofile

// Built with -tags proxyprofile, the command serves net/http/pprof on the
// loopback address in RATECORD_PPROF_ADDR, for profiling the proxy under
// load:
//
//	go build -tags proxyprofile -o /tmp/ratecord ./cmd/ratecord
//	RATECORD_PPROF_ADDR=127.0.0.1:6060 /tmp/ratecord proxy ...
//	go tool pprof -seconds 10 http://127.0.0.1:6060/debug/pprof/profile
//
// Ordinary builds have no such endpoint.
package main

import (
	"fmt"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	addr := os.Getenv("RATECORD_PPROF_ADDR")
	if addr == "" {
		return
	}
	if !isLoopback(addr) {
		fmt.Fprintln(os.Stderr, "RATECORD_PPROF_ADDR must be a loopback address")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pprof:", err)
		os.Exit(1)
	}
	go http.Serve(ln, http.DefaultServeMux)
}
