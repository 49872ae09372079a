package redisstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// ExampleNew shares limits through a Redis server: every process that runs
// this code against the same server and prefix draws from the same
// buckets. (It needs a server, so it is compiled but not run.)
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	s := redisstore.New(client,
		redisstore.WithPrefix("mybot"),
		redisstore.WithFailurePolicy(redisstore.FailOpen),
		redisstore.WithLocalShare(8),                          // up to 8 processes per bot
		redisstore.WithPolicy(store.Policy{GlobalLimit: 500}), // a bot whose global limit Discord raised
		redisstore.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))),
	)
	defer s.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := store.Claim{Credential: "hmac-of-the-token", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true}
	p, err := s.Acquire(ctx, c)
	if err != nil {
		fmt.Println("refused:", err)
		return
	}
	// ... send the request, then report what the response said:
	err = p.Report(ctx, store.Update{
		Sent: true, Status: 200, Bucket: "abcd1234", HasLimit: true, Limit: 5, Remaining: 4, ResetAfter: 5 * time.Second,
	})
	fmt.Println(err, s.Stats().Local)
}
