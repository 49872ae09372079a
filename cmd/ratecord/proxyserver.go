package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// runProxy serves a reverse proxy to Discord's API that sends every request
// through a ratecord Transport, until ctx is cancelled; it then stops
// accepting connections and lets the requests in flight finish.
func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseProxyFlags(args, stderr, os.LookupEnv)
	if err != nil {
		return err
	}
	_, gogc := os.LookupEnv("GOGC")
	_, gomemlimit := os.LookupEnv("GOMEMLIMIT")
	if !gogc && !gomemlimit {
		// A proxy holds little live memory: a memory limit keeps its
		// resident size small with far fewer collections than a low
		// GOGC.
		tuner := startGCTuner(proxyMemoryFloor, proxyGCPercent)
		defer tuner.stop()
	}
	logs := newLogBuffer(stderr, logFlushInterval)
	defer logs.Close()
	logger := newProxyLogger(logs, cfg)
	p, err := newProxy(cfg, logger)
	if err != nil {
		return err
	}
	if cfg.logFormat == "json" {
		p.lines = logs
	}
	defer p.close()
	ln, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "ratecord proxy listening on http://%s, forwarding to %s\n", ln.Addr(), cfg.upstream)
	fmt.Fprintf(stdout, "Point a bot at it by using http://%s/api/v10 as the API base URL.\n", ln.Addr())
	return p.serve(ctx, ln)
}

// proxy is the handler of "ratecord proxy": the reverse proxy, /healthz and
// /metrics.
type proxy struct {
	cfg       *proxyConfig
	log       *slog.Logger
	lines     io.Writer // where the JSON log goes, for writeRequestLine; nil with a text log
	upstream  *http.Transport
	transport *ratecord.Transport
	redis     redis.UniversalClient // nil without -redis
	store     *redisstore.Store     // nil without -redis
	meters    *sdkmetric.MeterProvider
	metrics   http.Handler
	rp        *httputil.ReverseProxy // forwards the requests that ask to switch protocols
	authValue []string               // the Authorization value of -default-token, or nil
	inFlight  chan struct{}          // a token per request being forwarded
	buffered  atomic.Int64           // bytes of request bodies buffered now
}

// newProxy builds the proxy: the upstream transport, the store, the meter
// provider exporting to Prometheus, and ratecord's transport over them.
func newProxy(cfg *proxyConfig, logger *slog.Logger) (*proxy, error) {
	p := &proxy{cfg: cfg, log: logger, upstream: newUpstreamTransport(cfg), inFlight: make(chan struct{}, cfg.maxInFlight)}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	p.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	p.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)})

	opts := []ratecord.Option{
		ratecord.WithMeterProvider(p.meters),
		ratecord.WithLogger(logger),
		ratecord.WithMaxWait(cfg.maxWait),
		ratecord.WithRetries(cfg.retries),
	}
	if cfg.hashKey != "" {
		opts = append(opts, ratecord.WithHashKey([]byte(cfg.hashKey)))
	}
	if len(cfg.redisAddrs) > 0 {
		p.redis = newRedisClient(cfg)
		p.store = redisstore.New(p.redis,
			redisstore.WithPrefix(cfg.redisPrefix),
			redisstore.WithFailurePolicy(cfg.redisFail),
			redisstore.WithLogger(logger),
			redisstore.WithPolicy(store.Policy{GlobalLimit: cfg.globalLimit}))
		opts = append(opts, ratecord.WithStore(p.store))
		p.checkRedis()
	} else {
		opts = append(opts, ratecord.WithGlobalLimit(cfg.globalLimit, time.Second))
	}
	if cfg.detectLimit {
		opts = append(opts, ratecord.WithGlobalLimitDetection(true))
	}
	p.transport = ratecord.NewTransport(p.upstream, opts...)

	p.rp = &httputil.ReverseProxy{
		Rewrite:      p.rewrite,
		Transport:    p.transport,
		ErrorHandler: p.handleError,
		ErrorLog:     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	if cfg.defaultAuth != "" {
		p.authValue = []string{cfg.defaultAuth}
	}
	return p, nil
}

// newUpstreamTransport returns the transport ratecord sends through: keeps
// enough idle connections for a busy proxy, with a timeout on every phase.
// It leaves the encoding to the client: a client's Accept-Encoding goes
// upstream as sent and the answer comes back as encoded, and the proxy
// neither asks for gzip itself nor decompresses.
func newUpstreamTransport(cfg *proxyConfig) *http.Transport {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		DisableCompression:    true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: cfg.upstreamTimeout,
	}
}

// newRedisClient returns a plain client for one address or URL, and a
// cluster client for several addresses or with -redis-cluster.
func newRedisClient(cfg *proxyConfig) redis.UniversalClient {
	t := cfg.redisTimeout
	if len(cfg.redisAddrs) == 1 && strings.Contains(cfg.redisAddrs[0], "://") {
		if cfg.redisCluster {
			if o, err := redis.ParseClusterURL(cfg.redisAddrs[0]); err == nil {
				o.DialTimeout, o.ReadTimeout, o.WriteTimeout = t, t, t
				setCredentials(&o.Username, &o.Password, cfg)
				return redis.NewClusterClient(o)
			}
		} else if o, err := redis.ParseURL(cfg.redisAddrs[0]); err == nil {
			o.DialTimeout, o.ReadTimeout, o.WriteTimeout = t, t, t
			setCredentials(&o.Username, &o.Password, cfg)
			return redis.NewClient(o)
		}
	}
	if len(cfg.redisAddrs) > 1 || cfg.redisCluster {
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: cfg.redisAddrs, Username: cfg.redisUser, Password: cfg.redisPass,
			DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
		})
	}
	return redis.NewClient(&redis.Options{
		Addr: cfg.redisAddrs[0], Username: cfg.redisUser, Password: cfg.redisPass,
		DialTimeout: t, ReadTimeout: t, WriteTimeout: t,
	})
}

// setCredentials lets the flags override a URL's credentials.
func setCredentials(user, pass *string, cfg *proxyConfig) {
	if cfg.redisUser != "" {
		*user = cfg.redisUser
	}
	if cfg.redisPass != "" {
		*pass = cfg.redisPass
	}
}

// checkRedis pings Redis once, so that a wrong address shows at start. The
// proxy starts anyway: the failure policy decides what requests get.
func (p *proxy) checkRedis() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*p.cfg.redisTimeout)
	defer cancel()
	if err := p.redis.Ping(ctx).Err(); err != nil {
		p.log.Warn("redis unreachable at start", slog.String("policy", p.cfg.redisFail.String()), slog.Any("error", err))
	}
}

// serve answers on ln, at most -max-conns connections at a time, until ctx is cancelled, then shuts down gracefully:
// no new connections, requests in flight finish within -shutdown-timeout.
func (p *proxy) serve(ctx context.Context, ln net.Listener) error {
	ln = newLimitListener(ln, p.cfg.maxConns)
	srv := &http.Server{
		MaxHeaderBytes:    p.cfg.maxHeaderBytes,
		Handler:           p,
		ReadHeaderTimeout: p.cfg.readHeaderTimeout,
		ReadTimeout:       p.cfg.readTimeout,
		WriteTimeout:      p.cfg.writeTimeout,
		IdleTimeout:       p.cfg.idleTimeout,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	p.log.Info("listening", slog.String("addr", ln.Addr().String()), slog.String("upstream", p.cfg.upstream.String()),
		slog.String("store", p.storeName()))
	if p.cfg.allowRemote && !p.cfg.auth.enabled() {
		p.log.Warn("no client authentication: whoever reaches the proxy can send through it, and spend this address's invalid-request budget (see -client-secret)")
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}

	p.log.Info("shutting down", slog.Duration("timeout", p.cfg.shutdownTimeout))
	sctx, cancel := context.WithTimeout(context.Background(), p.cfg.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still waiting for a slot are answered 503, and the
		// connections of the others are cut.
		p.log.Warn("requests outlasted the shutdown timeout", slog.Any("error", err))
		p.transport.Close()
		srv.Close()
	}
	<-served
	p.log.Info("stopped")
	return nil
}

func (p *proxy) storeName() string {
	if p.store == nil {
		return "memory"
	}
	return "redis"
}

// close releases the transport, the store, Redis and the meter provider.
func (p *proxy) close() {
	p.transport.Close()
	if p.store != nil {
		p.store.Close()
		p.redis.Close()
	}
	p.upstream.CloseIdleConnections()
	p.meters.Shutdown(context.Background())
}
