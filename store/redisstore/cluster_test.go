package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
	"github.com/ratecord/ratecord/store/storetest"
)

// startCluster starts three masters on loopback ports, splits the 16384
// slots between them, joins them and returns a cluster client.
func startCluster(t *testing.T) *redis.ClusterClient {
	t.Helper()
	var nodes []*server
	for i := range 3 {
		nodes = append(nodes, startServer(t, "--cluster-enabled", "yes",
			"--cluster-config-file", t.TempDir()+"/nodes-"+strconv.Itoa(i)+".conf",
			"--cluster-node-timeout", "5000"))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var addrs []string
	for i, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.addr()})
		from, to := i*16384/3, (i+1)*16384/3-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", from, to).Err(); err != nil {
			c.Close()
			t.Fatalf("CLUSTER ADDSLOTSRANGE %d %d on %s: %v", from, to, n.addr(), err)
		}
		if i > 0 {
			if err := c.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", nodes[0].port).Err(); err != nil {
				c.Close()
				t.Fatalf("CLUSTER MEET from %s: %v", n.addr(), err)
			}
		}
		c.Close()
		addrs = append(addrs, n.addr())
	}
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.addr()})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:3") {
				break
			}
			if ctx.Err() != nil {
				c.Close()
				t.Fatalf("cluster node %s never became ready: %v\n%s", n.addr(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { cc.Close() })
	// Every node must know the whole slot map before the client trusts it.
	for {
		err := cc.ForEachShard(ctx, func(ctx context.Context, c *redis.Client) error {
			return c.Ping(ctx).Err()
		})
		shards, serr := cc.ClusterShards(ctx).Result()
		if err == nil && serr == nil && len(shards) == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("cluster client not ready: %v %v", err, serr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return cc
}

// TestClusterConformance runs the conformance suite against a Redis Cluster
// of three masters started by the test.
func TestClusterConformance(t *testing.T) {
	cc := startCluster(t)
	storetest.Run(t, func(t *testing.T, p store.Policy) store.Store {
		return redisstore.New(cc, redisstore.WithPolicy(p), redisstore.WithPrefix(testPrefix(t)), redisstore.WithFailurePolicy(redisstore.FailClosed))
	})
}

// TestClusterSpreadsCredentials checks that the keys of different
// credentials land on different masters and one credential's on one.
func TestClusterSpreadsCredentials(t *testing.T) {
	cc := startCluster(t)
	s := redisstore.New(cc, redisstore.WithPrefix(testPrefix(t)))
	t.Cleanup(func() { s.Close() })
	ctx := t.Context()
	for i := range 30 {
		c := store.Claim{Credential: "cred-" + strconv.Itoa(i), Route: "POST /channels/:id/messages", Major: "channels/1", Global: true}
		p, err := s.Acquire(ctx, c)
		if err != nil {
			t.Fatalf("Acquire(credential %d) = %v", i, err)
		}
		u := store.Update{Sent: true, Status: 200,
			Bucket: "h", HasLimit: true, Limit: 5, Remaining: 4, ResetAfter: time.Second}
		if err := p.Report(ctx, u); err != nil {
			t.Fatalf("Update(credential %d) = %v", i, err)
		}
	}
	var used atomic.Int32
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		n, err := c.DBSize(ctx).Result()
		if n > 0 {
			used.Add(1)
		}
		return err
	})
	if err != nil {
		t.Fatalf("DBSIZE: %v", err)
	}
	if used.Load() < 2 {
		t.Errorf("keys of 30 credentials on %d masters; want them spread over several", used.Load())
	}
}
