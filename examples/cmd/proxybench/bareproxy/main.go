// Command bareproxy is the least a Go reverse proxy on net/http can do: a
// net/http server whose handler sends each request on through an
// http.Transport and copies the response back, with no checks, no rate
// limiting, no log and no metrics. It measures what net/http alone costs
// per request on both sides of a proxy, the floor under "ratecord proxy":
//
//	cd examples
//	go build -o /tmp/bareproxy ./cmd/proxybench/bareproxy
//	go run ./cmd/proxybench -proxy /tmp/bareproxy -routes 0
//
// It takes the arguments proxybench gives ratecord ("proxy -addr ADDR
// -upstream URL" and flags it ignores) and listens on loopback only.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "proxy" {
		args = args[1:]
	}
	fs := flag.NewFlagSet("bareproxy", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:8080", "loopback `address` to listen on")
	upstream := fs.String("upstream", "http://127.0.0.1:8090", "`URL` of the upstream")
	fs.Int("global-limit", 0, "ignored")
	fs.Parse(args)
	u, err := url.Parse(*upstream)
	host, _, herr := net.SplitHostPort(*addr)
	if ip := net.ParseIP(host); err != nil || herr != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintln(os.Stderr, "bareproxy: -addr must be a loopback IP address and port, -upstream a URL")
		os.Exit(2)
	}
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 512, DisableCompression: true}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			io.WriteString(w, "ok")
			return
		}
		out := r.WithContext(r.Context())
		out.URL = &url.URL{Scheme: u.Scheme, Host: u.Host, Path: r.URL.Path, RawQuery: r.URL.RawQuery}
		out.Host, out.RequestURI = "", ""
		if r.ContentLength == 0 {
			out.Body = nil
		}
		res, err := tr.RoundTrip(out)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer res.Body.Close()
		h := w.Header()
		for k, vv := range res.Header {
			h[k] = vv
		}
		w.WriteHeader(res.StatusCode)
		io.Copy(w, res.Body)
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bareproxy:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Handler: handler}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	srv.Serve(ln)
}
