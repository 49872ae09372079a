package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
)

// rawConn sends HTTP/1.1 requests over one keep-alive connection with
// little parsing, so that the load generator spends its CPU time on the
// server under test rather than on itself.
type rawConn struct {
	addr string
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
	buf  []byte
}

func (c *rawConn) close() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
}

// do sends one request and returns the response's status code, having
// read and discarded its body.
func (c *rawConn) do(method, host, path, auth, body string) (int, error) {
	if c.conn == nil {
		conn, err := net.Dial("tcp", c.addr)
		if err != nil {
			return 0, err
		}
		c.conn, c.r, c.w = conn, bufio.NewReaderSize(conn, 8<<10), bufio.NewWriterSize(conn, 8<<10)
	}
	b := c.buf[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: loadgen\r\n"...)
	if auth != "" {
		b = append(b, "Authorization: "...)
		b = append(b, auth...)
		b = append(b, "\r\n"...)
	}
	if body != "" || method == "POST" || method == "PUT" || method == "PATCH" {
		b = append(b, "Content-Type: application/json\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	b = append(b, body...)
	c.buf = b
	if _, err := c.w.Write(b); err != nil {
		c.close()
		return 0, err
	}
	if err := c.w.Flush(); err != nil {
		c.close()
		return 0, err
	}
	status, err := c.readResponse()
	if err != nil {
		c.close()
	}
	return status, err
}

var errBadResponse = errors.New("malformed response")

func (c *rawConn) readResponse() (int, error) {
	line, err := c.r.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return 0, errBadResponse
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil {
		return 0, errBadResponse
	}
	length, chunked, closing := int64(-1), false, false
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if len(line) == 0 {
			break
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return 0, errBadResponse
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.ParseInt(string(value), 10, 64); err != nil {
				return 0, errBadResponse
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		case bytes.EqualFold(name, []byte("Connection")):
			closing = bytes.EqualFold(value, []byte("close"))
		}
	}
	switch {
	case chunked:
		err = c.skipChunks()
	case length >= 0:
		_, err = c.r.Discard(int(length))
	default:
		_, err = io.Copy(io.Discard, c.r)
		closing = true
	}
	if closing {
		c.close()
	}
	return status, err
}

func (c *rawConn) skipChunks() error {
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(bytes.SplitN(line, []byte(";"), 2)[0])), 16, 64)
		if err != nil {
			return fmt.Errorf("chunk size: %w", err)
		}
		if size == 0 {
			for { // trailers up to the empty line
				line, err := c.r.ReadSlice('\n')
				if err != nil {
					return err
				}
				if len(bytes.TrimRight(line, "\r\n")) == 0 {
					return nil
				}
			}
		}
		if _, err := c.r.Discard(int(size) + 2); err != nil {
			return err
		}
	}
}
