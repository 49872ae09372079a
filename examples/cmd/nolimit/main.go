// Command nolimit is an upstream that never rate limits: it answers every
// request with 200 and a small JSON message, as fast as it can. It stands in
// for Discord when measuring the overhead of "ratecord proxy":
//
//	go run ./cmd/nolimit -addr 127.0.0.1:8090
//
// With -engine raw (the default) it speaks just enough HTTP/1.1 for
// keep-alive clients that send Content-Length bodies, so that it takes
// little of the machine's CPU; -engine nethttp uses net/http's server.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

const body = `{"id":"1","channel_id":"1","content":"hello"}`

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "loopback `address` to listen on")
	engine := flag.String("engine", "raw", "server: raw or nethttp")
	flag.Parse()
	host, _, err := net.SplitHostPort(*addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintln(os.Stderr, "nolimit: -addr must be a loopback IP address and port")
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nolimit:", err)
		os.Exit(1)
	}
	fmt.Printf("nolimit listening on http://%s\n", ln.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *engine == "nethttp" {
		serveNetHTTP(ctx, ln)
		return
	}
	serveRaw(ctx, ln)
}

func serveNetHTTP(ctx context.Context, ln net.Listener) {
	srv := &http.Server{
		ReadHeaderTimeout: 10 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header()["Content-Type"] = []string{"application/json"}
			io.WriteString(w, body)
		}),
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, "nolimit:", err)
		os.Exit(1)
	}
}

func serveRaw(ctx context.Context, ln net.Listener) {
	response := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	var mu sync.Mutex // guards conns
	conns := map[net.Conn]bool{}
	go func() {
		<-ctx.Done()
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
			}()
			r := bufio.NewReaderSize(c, 8<<10)
			for {
				length, err := readRequest(r)
				if err != nil {
					return
				}
				if _, err := r.Discard(int(length)); err != nil {
					return
				}
				if _, err := c.Write(response); err != nil {
					return
				}
			}
		}()
	}
}

// readRequest reads a request's line and headers and returns its
// Content-Length.
func readRequest(r *bufio.Reader) (int64, error) {
	if _, err := r.ReadSlice('\n'); err != nil {
		return 0, err
	}
	var length int64
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			return length, nil
		}
		if name, value, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(name, []byte("Content-Length")) {
			if length, err = strconv.ParseInt(string(bytes.TrimSpace(value)), 10, 64); err != nil {
				return 0, err
			}
		}
	}
}
