package main

import (
	"bufio"
	"io"
	"sync"
	"time"
)

// logBuffer buffers log lines and writes them out when its buffer fills or
// every interval, so that a busy proxy does not make a system call per log
// line. Lines are written whole: slog hands each record to Write at once.
// It is safe for concurrent use; Close flushes it and stops its goroutine.
type logBuffer struct {
	mu  sync.Mutex // guards buf
	buf *bufio.Writer

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newLogBuffer(w io.Writer, interval time.Duration) *logBuffer {
	b := &logBuffer{buf: bufio.NewWriterSize(w, 64<<10), stop: make(chan struct{}), done: make(chan struct{})}
	go b.flushEvery(interval)
	return b
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) flush() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Flush()
}

func (b *logBuffer) flushEvery(interval time.Duration) {
	defer close(b.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			b.flush()
		case <-b.stop:
			b.flush()
			return
		}
	}
}

// Close writes out what is buffered and stops the flushing goroutine. It
// is idempotent.
func (b *logBuffer) Close() error {
	b.once.Do(func() {
		close(b.stop)
		<-b.done
	})
	return nil
}
