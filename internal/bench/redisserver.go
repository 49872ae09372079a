package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// restartTail is how long a run of -redis-restart goes on after the
// restarted server is up, at least: the run lasts at least
// 1.5 × (outage + restartTail), so that the server is killed a third of the
// way in and is back restartTail before the end or earlier.
const restartTail = 5 * time.Second

// redisReady bounds how long a starting server may take to answer.
const redisReady = 10 * time.Second

// RedisServer is a redis-server this program started on a loopback port,
// with no persistence: killed and started again, it comes back empty.
type RedisServer struct {
	// Addr is the server's address, the same after every restart.
	Addr string
	dir  string

	mu     sync.Mutex // guards cmd, exited and out
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
	out    *bytes.Buffer
}

// StartRedis starts redis-server on a free loopback port and returns once
// it answers; the caller closes it.
func StartRedis(ctx context.Context) (*RedisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("-redis-restart starts its own Redis: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := l.Addr().String()
	l.Close()
	dir, err := os.MkdirTemp("", "ratecord-bench-redis-")
	if err != nil {
		return nil, err
	}
	s := &RedisServer{Addr: addr, dir: dir}
	if err := s.start(ctx, bin); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Kill kills the server with SIGKILL and waits until it is gone.
func (s *RedisServer) Kill() error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return errors.New("redis-server is not running")
	}
	err := cmd.Process.Kill()
	<-exited
	if errors.Is(err, os.ErrProcessDone) {
		err = nil
	}
	return err
}

// Restart starts the server again, empty, on the same port, and returns
// once it answers.
func (s *RedisServer) Restart(ctx context.Context) error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return err
	}
	return s.start(ctx, bin)
}

// Close kills the server, if it runs, and removes its directory.
func (s *RedisServer) Close() error {
	s.mu.Lock()
	running := s.cmd != nil
	s.mu.Unlock()
	var err error
	if running {
		err = s.Kill()
	}
	return errors.Join(err, os.RemoveAll(s.dir))
}

func (s *RedisServer) start(ctx context.Context, bin string) error {
	host, port, err := net.SplitHostPort(s.Addr)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, "--bind", host, "--port", port, "--save", "", "--appendonly", "no", "--dir", s.dir)
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited, s.out = cmd, exited, out
	s.mu.Unlock()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	deadline := time.Now().Add(redisReady)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			s.mu.Lock()
			s.cmd = nil
			s.mu.Unlock()
			return fmt.Errorf("redis-server on %s exited: %s", s.Addr, bytes.TrimSpace(out.Bytes()))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s: no answer within %v: %w", s.Addr, redisReady, err)
		}
	}
}

// RedisOutage is the fault of -redis-restart: in every scenario run, the
// run's Redis is killed a third of the way in and started again, empty,
// Down later.
type RedisOutage struct {
	Server *RedisServer
	Down   time.Duration
}

// runLength is how long a run of at least d lasts with the outage: long
// enough that the server is back restartTail before the end.
func (o *RedisOutage) runLength(d time.Duration) time.Duration {
	if o == nil {
		return d
	}
	return max(d, 3*(o.Down+restartTail)/2)
}

// outageRecord is what an outage of one run did.
type outageRecord struct {
	Killed   time.Time `json:"killed"`
	Back     time.Time `json:"back"`
	Restarts int       `json:"restarts"`
}

// cause runs the outage of a run that started at start and lasts d: it
// kills the server at d/3 unless runCtx ended first, and starts it again
// Down later unless ctx ended first.
func (o *RedisOutage) cause(ctx, runCtx context.Context, start time.Time, d time.Duration) (outageRecord, error) {
	var rec outageRecord
	sleep(runCtx, time.Until(start.Add(d/3)))
	if runCtx.Err() != nil {
		return rec, nil
	}
	rec.Killed = time.Now()
	if err := o.Server.Kill(); err != nil {
		return rec, fmt.Errorf("kill redis-server: %w", err)
	}
	sleep(ctx, time.Until(rec.Killed.Add(o.Down)))
	if ctx.Err() != nil {
		return rec, ctx.Err()
	}
	if err := o.Server.Restart(ctx); err != nil {
		return rec, fmt.Errorf("restart redis-server: %w", err)
	}
	rec.Back = time.Now()
	rec.Restarts = 1
	return rec, nil
}
