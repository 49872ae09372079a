package main

import (
	"net"
	"sync"
)

// limitListener accepts at most n connections at a time: Accept waits for
// one to close before it accepts another, so that the connections beyond n
// wait in the kernel's listen queue and cost this process nothing. It is
// golang.org/x/net/netutil's LimitListener, without the dependency. It is
// safe for concurrent use; Close unblocks a waiting Accept.
type limitListener struct {
	net.Listener
	sem       chan struct{} // a token per open connection
	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

// newLimitListener returns l accepting at most n (> 0) connections at a
// time.
func newLimitListener(l net.Listener, n int) *limitListener {
	return &limitListener{Listener: l, sem: make(chan struct{}, n), done: make(chan struct{})}
}

// Accept waits for a free slot, then for a connection.
func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

// Close closes the listener and unblocks a waiting Accept. It is
// idempotent.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// open returns the number of connections accepted and not yet closed.
func (l *limitListener) open() int { return len(l.sem) }

// limitConn gives its slot back when first closed.
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
