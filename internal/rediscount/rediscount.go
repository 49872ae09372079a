// Package rediscount counts the Redis commands a go-redis client sends, for
// measuring commands per request in tests and the load benchmark.
package rediscount

import (
	"context"
	"net"
	"strings"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// Hook is a go-redis hook. Commands counts every command sent except the
// handshake of new connections (HELLO, CLIENT, AUTH, SELECT), which does
// not grow with the requests; Setup counts those. It is safe for
// concurrent use.
type Hook struct {
	Commands atomic.Int64
	Setup    atomic.Int64
}

func (h *Hook) count(cmd redis.Cmder) {
	switch strings.ToLower(cmd.Name()) {
	case "hello", "client", "auth", "select":
		h.Setup.Add(1)
	default:
		h.Commands.Add(1)
	}
}

// DialHook passes dials through.
func (h *Hook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return next(ctx, network, addr)
	}
}

// ProcessHook counts a command.
func (h *Hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts every command of a pipeline.
func (h *Hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}
