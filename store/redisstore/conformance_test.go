package redisstore_test

import (
	"testing"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
	"github.com/ratecord/ratecord/store/storetest"
)

// TestConformance runs the store contract's suite against one server.
func TestConformance(t *testing.T) {
	client := newClient(t, redisAddr(t))
	storetest.Run(t, func(t *testing.T, p store.Policy) store.Store {
		return redisstore.New(client, redisstore.WithPolicy(p), redisstore.WithPrefix(testPrefix(t)), redisstore.WithFailurePolicy(redisstore.FailClosed))
	})
}
