package redisstore_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
	"github.com/ratecord/ratecord/store/redisstore"
)

var _ ratecord.FallbackCounter = (*redisstore.Store)(nil)

// TestFallbacksMetric stops the server under a transport: the requests the
// local limiter grants are counted by Fallbacks and reported by the
// transport's discord.ratelimit.store.fallbacks metric.
func TestFallbacksMetric(t *testing.T) {
	srv := startServer(t)
	client := fastClient(t, srv.addr())
	s := redisstore.New(client, redisstore.WithPrefix(testPrefix(t)), redisstore.WithProbeInterval(time.Hour))
	t.Cleanup(func() { s.Close() })
	emu := discordtest.NewServer()
	t.Cleanup(emu.Close)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	tr := ratecord.NewTransport(nil, ratecord.WithStore(s), ratecord.WithMeterProvider(mp))
	t.Cleanup(func() { tr.Close() })
	hc := &http.Client{Transport: tr}

	get := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", emu.URL()+"/api/v10/users/@me", nil)
		req.Header.Set("Authorization", "Bot fallbacks-test")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET /users/@me = %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	fallbacks := func() int64 {
		t.Helper()
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(t.Context(), &rm); err != nil {
			t.Fatal(err)
		}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "discord.ratelimit.store.fallbacks" {
					var n int64
					for _, dp := range sum.DataPoints {
						n += dp.Value
					}
					return n
				}
			}
		}
		return -1
	}

	get()
	if n, got := s.Fallbacks(), fallbacks(); n != 0 || got != 0 {
		t.Fatalf("with Redis up: Fallbacks() = %d, metric = %d; want 0 and 0", n, got)
	}
	srv.stop()
	const local = 3
	for range local {
		get()
	}
	st := s.Stats()
	if !st.Local || st.Fallbacks != 1 {
		t.Errorf("Stats() = %+v after Redis went away; want local mode after one switch", st)
	}
	if n := s.Fallbacks(); n != 1 || st.LocalGrants != local {
		t.Errorf("Fallbacks() = %d, Stats().LocalGrants = %d; want 1 switch and %d requests granted locally", n, st.LocalGrants, local)
	}
	if got := fallbacks(); got != 1 {
		t.Errorf("discord.ratelimit.store.fallbacks = %d; want 1", got)
	}
}
