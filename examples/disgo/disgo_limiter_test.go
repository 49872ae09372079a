//go:build !race

// Package disgo_test, in this file, keeps disgo's own rate limiter in front
// of ratecord. The file is left out under the race detector, which reports
// disgo v0.19.6's limiter itself (see TestCreateMessage).
package disgo_test

import "testing"

// TestCreateMessageDisgoLimiter is TestCreateMessage with disgo's default
// rate limiter left in place: ratecord adds the global limit and
// concurrency within buckets beneath it.
func TestCreateMessageDisgoLimiter(t *testing.T) {
	sendMessages(t)
}
