// Command bench runs ratecord's load benchmark with discordgo's built-in
// rate limiter as a third contender, beside ratecord and no limiter at all,
// in one run against the same in-process emulator:
//
//	go run ./cmd/bench
//
// With -redis (or -redis-cluster), go-redis/redis_rate runs too, as
// redis_rate, on the same Redis as ratecord-redis: the table then gives
// what each costs Redis per 2xx under the same load (see [RedisRate]):
//
//	go run ./cmd/bench -redis 127.0.0.1:6379 -limiters ratecord-redis,redis_rate
//
// It takes the flags of "ratecord bench".
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/bwmarrin/discordgo"

	"github.com/ratecord/ratecord/internal/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := bench.Main(ctx, os.Args[1:], os.Stdout, os.Stderr, Discordgo(), bench.Limiter{Name: NameRedisRate, Redis: RedisRate})
	stop()
	if errors.Is(err, flag.ErrHelp) {
		return // -h: the flags were printed
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// Discordgo drives requests through discordgo Sessions (one per
// Authorization value), so discordgo's own limiter decides when they go.
func Discordgo() bench.Limiter {
	return bench.Limiter{Name: "discordgo", New: func(base http.RoundTripper, _ bench.ClientConfig) bench.Client {
		return &sessions{client: &http.Client{Transport: base}, byAuth: map[string]*discordgo.Session{}}
	}}
}

type sessions struct {
	client *http.Client
	mu     sync.Mutex // guards byAuth
	byAuth map[string]*discordgo.Session
}

func (s *sessions) session(auth string) *discordgo.Session {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.byAuth[auth]
	if sess == nil {
		sess, _ = discordgo.New(auth)
		sess.Client = s.client
		s.byAuth[auth] = sess
	}
	return sess
}

// Do sends through Session.Request, which keys discordgo's limiter by URL,
// as its endpoint helpers do.
func (s *sessions) Do(ctx context.Context, method, url, auth string, body []byte) (int, error) {
	var data any
	if body != nil {
		data = json.RawMessage(body)
	}
	_, err := s.session(auth).Request(method, url, data, discordgo.WithContext(ctx))
	if err == nil {
		return http.StatusOK, nil
	}
	var rest *discordgo.RESTError
	if errors.As(err, &rest) && rest.Response != nil {
		return rest.Response.StatusCode, nil
	}
	return 0, err
}

func (s *sessions) Close() error { return nil }
