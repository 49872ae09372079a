// Command loadgen sends HTTP requests from N concurrent clients, at a fixed
// rate or as fast as the server answers, and prints the throughput and the
// latency percentiles. It measures "ratecord proxy" against an upstream on
// the same machine:
//
//	go run ./cmd/loadgen -url http://127.0.0.1:8080 -clients 64 -duration 10s
//	go run ./cmd/loadgen -url http://127.0.0.1:8080 -rate 1000 -duration 20s
//	go run ./cmd/loadgen -url http://127.0.0.1:8080 -requests 100000 -routes 10000
//
// Only loopback addresses are accepted.
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
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	base := flag.String("url", "http://127.0.0.1:8080", "base `URL` of the server (loopback only)")
	path := flag.String("path", "/api/v10/channels/%d/messages", "request path; %d is replaced by a route number in [1, -routes]")
	method := flag.String("method", "GET", "HTTP method")
	body := flag.String("body", "", "request body, sent with Content-Type application/json")
	auth := flag.String("auth", "Bot loadgen-token", "Authorization header; empty sends none")
	clients := flag.Int("clients", 64, "concurrent clients, each with one request in flight")
	rate := flag.Float64("rate", 0, "requests per second in total; 0 sends as fast as the server answers")
	duration := flag.Duration("duration", 10*time.Second, "how long to send (ignored with -requests)")
	total := flag.Int("requests", 0, "send exactly this many requests instead of running for -duration")
	routes := flag.Int("routes", 1, "distinct routes: %d in -path cycles through 1..routes")
	warmup := flag.Duration("warmup", time.Second, "requests sent during this first period are not counted")
	engine := flag.String("engine", "raw", "client: raw (HTTP/1.1 keep-alive connections with minimal parsing, cheap on CPU) or nethttp (net/http's client)")
	flag.Parse()

	u, err := url.Parse(*base)
	if err != nil || u.Scheme != "http" || !loopback(u.Hostname()) {
		fmt.Fprintln(os.Stderr, "loadgen: -url must be an http URL of a loopback address")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	tr := &http.Transport{MaxIdleConnsPerHost: *clients, MaxIdleConns: *clients, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var seq atomic.Int64
	var limit int64 = -1
	if *total > 0 {
		limit = int64(*total)
		*warmup = 0
	}
	var ticks chan struct{}
	if *rate > 0 {
		ticks = make(chan struct{}, *clients)
		go pace(ctx, *rate, ticks)
	}
	start := time.Now()
	counting := start.Add(*warmup)
	end := counting.Add(*duration)
	if limit > 0 {
		end = start.Add(24 * time.Hour)
	}

	type result struct {
		lat      []time.Duration
		statuses map[int]int
		errs     int
	}
	results := make([]result, *clients)
	var wg sync.WaitGroup
	for c := range *clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[c]
			r.statuses = map[int]int{}
			raw := &rawConn{addr: u.Host}
			defer raw.close()
			for ctx.Err() == nil {
				if ticks != nil {
					select {
					case <-ticks:
					case <-ctx.Done():
						return
					}
				}
				n := seq.Add(1)
				if limit > 0 && n > limit {
					return
				}
				sent := time.Now()
				if sent.After(end) {
					return
				}
				p := *path
				if strings.Contains(p, "%d") {
					p = fmt.Sprintf(p, (n-1)%int64(*routes)+1)
				}
				var status int
				var err error
				if *engine == "raw" {
					status, err = raw.do(*method, u.Host, p, *auth, *body)
				} else {
					status, err = send(ctx, client, *method, *base+p, *auth, *body)
				}
				lat := time.Since(sent)
				if sent.Before(counting) {
					continue
				}
				if err != nil {
					if ctx.Err() == nil {
						r.errs++
					}
					continue
				}
				r.statuses[status]++
				r.lat = append(r.lat, lat)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(counting)
	if limit > 0 {
		elapsed = time.Since(start)
	}

	var lat []time.Duration
	statuses := map[int]int{}
	errs := 0
	for _, r := range results {
		lat = append(lat, r.lat...)
		for s, n := range r.statuses {
			statuses[s] += n
		}
		errs += r.errs
	}
	slices.Sort(lat)
	fmt.Printf("requests %d in %.2fs: %.0f/s, errors %d, statuses %v\n",
		len(lat), elapsed.Seconds(), float64(len(lat))/elapsed.Seconds(), errs, statuses)
	if len(lat) > 0 {
		fmt.Printf("latency p50 %v p90 %v p99 %v p99.9 %v max %v\n",
			pct(lat, 50), pct(lat, 90), pct(lat, 99), pct(lat, 99.9), lat[len(lat)-1])
	}
	if errs > 0 {
		os.Exit(1)
	}
}

// send sends one request through net/http's client.
func send(ctx context.Context, client *http.Client, method, url, auth, body string) (int, error) {
	var rb io.Reader
	if body != "" {
		rb = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rb)
	if err != nil {
		return 0, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// pace puts rate tokens per second into ticks until ctx ends; tokens that
// find no idle client are dropped.
func pace(ctx context.Context, rate float64, ticks chan<- struct{}) {
	interval := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for {
		next = next.Add(interval)
		if d := time.Until(next); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return
			}
		}
		select {
		case ticks <- struct{}{}:
		default:
		}
	}
}

func pct(sorted []time.Duration, p float64) time.Duration {
	i := int(float64(len(sorted)-1) * p / 100)
	return sorted[i].Round(time.Microsecond)
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
