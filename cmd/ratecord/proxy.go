package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/store/redisstore"
)

// proxyConfig is what the flags of "ratecord proxy" set.
type proxyConfig struct {
	addr         string
	allowRemote  bool
	upstream     *url.URL
	redisAddrs   []string
	redisCluster bool
	redisUser    string
	redisPass    string
	redisPrefix  string
	redisFail    redisstore.FailurePolicy
	redisTimeout time.Duration
	defaultAuth  string // the Authorization value to inject, or ""
	hashKey      string
	globalLimit  int
	maxWait      time.Duration
	retries      int
	maxBody      int64
	replayBody   int64

	upstreamTimeout   time.Duration
	readHeaderTimeout time.Duration
	readTimeout       time.Duration
	writeTimeout      time.Duration
	idleTimeout       time.Duration
	shutdownTimeout   time.Duration

	logFormat string
	logLevel  slog.Level
}

// runProxy serves a reverse proxy to Discord's API that sends every request
// through a ratecord Transport, until ctx is cancelled; it then stops
// accepting connections and lets the requests in flight finish.
func runProxy(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, err := parseProxyFlags(args, stderr, os.LookupEnv)
	if err != nil {
		return err
	}
	if _, set := os.LookupEnv("GOGC"); !set {
		// A proxy holds little live memory; collecting more often keeps
		// its resident size small at a small cost in CPU.
		debug.SetGCPercent(proxyGCPercent)
	}
	logs := newLogBuffer(stderr, logFlushInterval)
	defer logs.Close()
	logger := newProxyLogger(logs, cfg)
	p, err := newProxy(cfg, logger)
	if err != nil {
		return err
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

// proxyGCPercent is the proxy's garbage-collection target unless GOGC is
// set in the environment.
const proxyGCPercent = 25

// logFlushInterval is how long a log line may wait in the buffer.
const logFlushInterval = 100 * time.Millisecond

// proxyUsage is printed by "ratecord proxy -h" before the flags.
const proxyUsage = `Usage: ratecord proxy [flags]

Serves a reverse proxy to Discord's API that sends every request through
ratecord, so that any number of bots, in any language, stay inside Discord's
rate limits. Point a bot's API base URL at http://<addr>/api/v10 instead of
https://discord.com/api/v10. Each request's own Authorization header is its
credential: one proxy serves many bots.

Memory: unless GOGC is set, the proxy runs the garbage collector at GOGC=25
(resident size stays near 25 MB under load, for a little CPU).

Endpoints:
  /api/...   forwarded to -upstream with path, query, method, body and
             headers intact (hop-by-hop headers removed, Host set to the
             upstream's)
  /healthz   200 "ok" while the process serves
  /metrics   ratecord's OpenTelemetry metrics in Prometheus text format,
             with Go runtime and process metrics

When ratecord gives up instead of sending, the answer is a JSON error:
  429  the wait would exceed -max-wait, or the invalid-request guard or a
       401/404 cooldown refused the request
  503  the rate-limit store failed (Redis down under -redis-fail closed) or
       the proxy is shutting down
  502  the upstream could not be reached
  413  the request body exceeds -max-body
with Retry-After and X-Ratecord-Reason, -Scope, -Bucket and -Retry-After
headers, and a body such as
  {"message":"ratecord: wait exceeds the maximum","code":0,"retry_after":1.25,
   "global":false,"ratecord":{"reason":"wait_too_long","scope":"user",
   "bucket":"abcd1234","route":"POST /channels/:id/messages","retry_after":1.25}}

The proxy has no authentication of its own: it listens on a loopback address
unless -allow-remote is given, for deployments where a firewall or a private
network decides who may reach it. Logs (one line per request at level info)
carry redacted paths, never a token.

Every flag can be set by the environment variable named after it; a flag on
the command line wins.

Flags:
`

// parseProxyFlags reads the flags, then the environment variables for the
// flags not given.
func parseProxyFlags(args []string, stderr io.Writer, lookup func(string) (string, bool)) (*proxyConfig, error) {
	fs := flag.NewFlagSet("ratecord proxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := &proxyConfig{}
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:8080", "`address` to listen on; a non-loopback address needs -allow-remote")
	fs.BoolVar(&cfg.allowRemote, "allow-remote", false, "allow a non-loopback -addr (the proxy has no authentication: put it behind a firewall)")
	upstream := fs.String("upstream", "https://discord.com", "`URL` of Discord's API; request paths such as /api/v10/... are appended")
	redisList := fs.String("redis", "", "comma-separated Redis `addresses` (host:port; several make a cluster client) or one redis:// or rediss:// URL; replicas using the same Redis share limits. Empty: limits are kept in this process")
	fs.BoolVar(&cfg.redisCluster, "redis-cluster", false, "use a Redis Cluster client even with a single -redis address")
	fs.StringVar(&cfg.redisUser, "redis-username", "", "Redis ACL user `name`")
	fs.StringVar(&cfg.redisPass, "redis-password", "", "Redis `password` (prefer the environment variable: command lines are visible to other users)")
	fs.StringVar(&cfg.redisPrefix, "redis-prefix", redisstore.DefaultPrefix, "`prefix` of the Redis keys; replicas sharing limits use the same")
	redisFail := fs.String("redis-fail", "open", "`policy` when Redis cannot be reached: open (go on with a conservative share of every limit in this process) or closed (answer 503)")
	fs.DurationVar(&cfg.redisTimeout, "redis-timeout", time.Second, "timeout of each Redis dial, read and write")
	defaultToken := fs.String("default-token", "", "`token` (\"Bot ...\", or bare for a bot token) sent with requests that carry no Authorization header, except on webhook and interaction routes, whose token is in the path (prefer the environment variable)")
	fs.StringVar(&cfg.hashKey, "hash-key", "", "secret `key` of the hash that replaces tokens in rate-limit keys; replicas sharing Redis must use the same. Empty: a fixed key")
	fs.IntVar(&cfg.globalLimit, "global-limit", ratecord.DefaultGlobalLimit, "requests per second each credential may send (Discord's global limit)")
	fs.DurationVar(&cfg.maxWait, "max-wait", 30*time.Second, "longest a request may wait for a slot; a longer wait is answered 429 at once")
	fs.IntVar(&cfg.retries, "retries", ratecord.DefaultRetries, "times a 429, a 5xx or a network error is sent again (5xx and network errors: idempotent requests only)")
	fs.Int64Var(&cfg.maxBody, "max-body", 25<<20, "largest request body in `bytes` (Discord's upload limit); larger ones get 413")
	fs.Int64Var(&cfg.replayBody, "replay-body", 1<<20, "request bodies of up to this many `bytes` are buffered so that a 429 can be retried; larger ones are streamed and their 429s reach the client")
	fs.DurationVar(&cfg.upstreamTimeout, "upstream-timeout", 30*time.Second, "longest wait for the upstream's response headers, per attempt")
	fs.DurationVar(&cfg.readHeaderTimeout, "read-header-timeout", 10*time.Second, "longest time to read a request's headers")
	fs.DurationVar(&cfg.readTimeout, "read-timeout", time.Minute, "longest time to read a whole request, body included")
	fs.DurationVar(&cfg.writeTimeout, "write-timeout", 2*time.Minute, "longest time from the end of a request's headers to the end of its response; must exceed -max-wait")
	fs.DurationVar(&cfg.idleTimeout, "idle-timeout", 2*time.Minute, "how long an idle keep-alive connection is kept")
	fs.DurationVar(&cfg.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGINT or SIGTERM, how long requests in flight may take before their connections are closed")
	fs.StringVar(&cfg.logFormat, "log-format", "json", "log `format`: json or text")
	logLevel := fs.String("log-level", "info", "log `level`: debug, info (a line per request), warn or error")
	annotateEnv(fs)
	fs.Usage = func() {
		fmt.Fprint(stderr, proxyUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, &usageError{msg: err.Error(), reported: true}
	}
	if fs.NArg() > 0 {
		return nil, &usageError{msg: fmt.Sprintf("unexpected arguments %q", fs.Args())}
	}
	if err := applyEnv(fs, lookup); err != nil {
		return nil, err
	}
	return cfg, cfg.finish(*upstream, *redisList, *redisFail, *defaultToken, *logLevel)
}

// finish checks the flags and sets the fields derived from them.
func (cfg *proxyConfig) finish(upstream, redisList, redisFail, defaultToken, logLevel string) error {
	if !cfg.allowRemote && !isLoopback(cfg.addr) {
		return &usageError{msg: fmt.Sprintf("-addr %q is not a loopback address; add -allow-remote to listen on it", cfg.addr)}
	}
	u, err := url.Parse(upstream)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return &usageError{msg: fmt.Sprintf("-upstream %q is not an http or https URL", upstream)}
	}
	cfg.upstream = u
	cfg.redisAddrs = splitList(redisList)
	switch redisFail {
	case "open":
		cfg.redisFail = redisstore.FailOpen
	case "closed":
		cfg.redisFail = redisstore.FailClosed
	default:
		return &usageError{msg: fmt.Sprintf("-redis-fail %q: want open or closed", redisFail)}
	}
	if tok := strings.TrimSpace(defaultToken); tok != "" {
		if !strings.Contains(tok, " ") {
			tok = "Bot " + tok
		}
		cfg.defaultAuth = tok
	}
	if err := cfg.logLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return &usageError{msg: fmt.Sprintf("-log-level %q: want debug, info, warn or error", logLevel)}
	}
	if cfg.logFormat != "json" && cfg.logFormat != "text" {
		return &usageError{msg: fmt.Sprintf("-log-format %q: want json or text", cfg.logFormat)}
	}
	if cfg.maxBody <= 0 {
		return &usageError{msg: "-max-body must be positive"}
	}
	if cfg.writeTimeout > 0 && cfg.maxWait > 0 && cfg.writeTimeout <= cfg.maxWait {
		return &usageError{msg: fmt.Sprintf("-write-timeout %v must exceed -max-wait %v", cfg.writeTimeout, cfg.maxWait)}
	}
	return nil
}

// isLoopback reports whether addr (host:port) names a loopback address.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func newProxyLogger(w io.Writer, cfg *proxyConfig) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.logLevel}
	if cfg.logFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// proxy is the handler of "ratecord proxy": the reverse proxy, /healthz and
// /metrics.
type proxy struct {
	cfg       *proxyConfig
	log       *slog.Logger
	upstream  *http.Transport
	transport *ratecord.Transport
	redis     redis.UniversalClient // nil without -redis
	store     *redisstore.Store     // nil without -redis
	meters    *sdkmetric.MeterProvider
	metrics   http.Handler
	rp        *httputil.ReverseProxy
}

// newProxy builds the proxy: the upstream transport, the store, the meter
// provider exporting to Prometheus, and ratecord's transport over them.
func newProxy(cfg *proxyConfig, logger *slog.Logger) (*proxy, error) {
	p := &proxy{cfg: cfg, log: logger, upstream: newUpstreamTransport(cfg)}

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
		ratecord.WithGlobalLimit(cfg.globalLimit, time.Second),
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
			redisstore.WithLogger(logger))
		opts = append(opts, ratecord.WithStore(p.store))
		p.checkRedis()
	}
	p.transport = ratecord.NewTransport(p.upstream, opts...)

	p.rp = &httputil.ReverseProxy{
		Rewrite:      p.rewrite,
		Transport:    p.transport,
		ErrorHandler: p.handleError,
		ErrorLog:     slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		BufferPool:   &bufferPool{},
	}
	return p, nil
}

// newUpstreamTransport returns the transport ratecord sends through: keeps
// enough idle connections for a busy proxy, with a timeout on every phase.
func newUpstreamTransport(cfg *proxyConfig) *http.Transport {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
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

// serve answers on ln until ctx is cancelled, then shuts down gracefully:
// no new connections, requests in flight finish within -shutdown-timeout.
func (p *proxy) serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: p.cfg.readHeaderTimeout,
		ReadTimeout:       p.cfg.readTimeout,
		WriteTimeout:      p.cfg.writeTimeout,
		IdleTimeout:       p.cfg.idleTimeout,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelWarn),
	}
	p.log.Info("listening", slog.String("addr", ln.Addr().String()), slog.String("upstream", p.cfg.upstream.String()),
		slog.String("store", p.storeName()))
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

// ServeHTTP answers /healthz and /metrics, and forwards /api/... upstream.
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
		return
	case "/metrics":
		p.metrics.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	rec := &recorder{ResponseWriter: w}
	p.forward(rec, w, r)
	p.logRequest(r, rec, time.Since(start))
}

// forward checks the request's body and hands the request to the reverse
// proxy.
func (p *proxy) forward(rec *recorder, w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/api" && !strings.HasPrefix(r.URL.Path, "/api/") {
		rec.reason = "not_found"
		writeJSONError(rec, http.StatusNotFound, errorBody{Message: "ratecord proxy: only /api/... is forwarded", Ratecord: errorDetail{Reason: "not_found"}})
		return
	}
	if r.ContentLength > p.cfg.maxBody {
		rec.reason = "body_too_large"
		writeJSONError(rec, http.StatusRequestEntityTooLarge, bodyTooLarge(p.cfg.maxBody))
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, p.cfg.maxBody)
		if r.ContentLength > 0 && r.ContentLength <= p.cfg.replayBody {
			if !p.bufferBody(rec, r) {
				return
			}
		}
	}
	p.rp.ServeHTTP(rec, r)
}

// bufferBody reads a small body into memory, so that ratecord can send the
// request again after a 429.
func (p *proxy) bufferBody(rec *recorder, r *http.Request) bool {
	body := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(r.Body, body); err != nil {
		rec.reason = "bad_body"
		rec.err = err.Error()
		writeJSONError(rec, http.StatusBadRequest, errorBody{Message: "ratecord proxy: could not read the request body", Ratecord: errorDetail{Reason: "bad_body"}})
		return false
	}
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return true
}

// rewrite points the outgoing request at the upstream, keeping the
// client's path and query, and adds the default token where one is
// allowed. The reverse proxy has already removed hop-by-hop and
// X-Forwarded headers.
func (p *proxy) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.cfg.upstream)
	if p.cfg.defaultAuth != "" && pr.Out.Header.Get("Authorization") == "" && !tokenInPath(pr.In.URL.Path) {
		pr.Out.Header.Set("Authorization", p.cfg.defaultAuth)
	}
}

// tokenInPath reports whether an API path authenticates with a token in
// the path: webhooks/{id}/{token}... and interactions/{id}/{token}/....
// Such requests must not carry the bot's token.
func tokenInPath(path string) bool {
	path = strings.TrimPrefix(path, "/api")
	segs := strings.SplitN(strings.TrimPrefix(path, "/"), "/", 4)
	if len(segs) > 0 && len(segs[0]) > 1 && segs[0][0] == 'v' && isNumber(segs[0][1:]) {
		segs = segs[1:]
	}
	if len(segs) < 3 || segs[2] == "" {
		return false
	}
	return segs[0] == "webhooks" || segs[0] == "interactions"
}

func isNumber(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// logRequest writes the request's log line: method, redacted path, status,
// duration and, for an error response, why.
func (p *proxy) logRequest(r *http.Request, rec *recorder, d time.Duration) {
	level := slog.LevelInfo
	if rec.reason != "" && rec.status >= 500 {
		level = slog.LevelWarn
	}
	ctx := r.Context()
	if !p.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs,
		slog.String("method", r.Method),
		slog.String("path", redactPath(r.URL)),
		slog.Int("status", rec.status),
		slog.Float64("duration_ms", float64(d.Microseconds())/1000),
		slog.Int64("bytes", rec.bytes))
	if rec.reason != "" {
		attrs = append(attrs, slog.String("reason", rec.reason))
	}
	if rec.giveUp != nil {
		attrs = append(attrs, slog.String("route", rec.giveUp.Route), slog.String("scope", string(rec.giveUp.Scope)),
			slog.String("bucket", rec.giveUp.Bucket), slog.Duration("retry_after", rec.giveUp.RetryAfter))
	}
	if rec.err != "" {
		attrs = append(attrs, slog.String("error", p.redactError(rec.err, r)))
	}
	p.log.LogAttrs(ctx, level, "request", attrs...)
}

// redactPath returns the URL's path with webhook and interaction tokens
// replaced; the query is left out.
func redactPath(u *url.URL) string {
	return ratecord.RedactURL(&url.URL{Path: u.Path, RawPath: u.RawPath})
}

// redactError removes from an error's text anything secret it may quote:
// the request's path (webhook tokens) and Authorization values.
func (p *proxy) redactError(msg string, r *http.Request) string {
	if path := r.URL.EscapedPath(); len(path) > 1 {
		msg = strings.ReplaceAll(msg, path, redactPath(r.URL))
	}
	if len(r.URL.Path) > 1 {
		msg = strings.ReplaceAll(msg, r.URL.Path, redactPath(r.URL))
	}
	for _, secret := range []string{r.Header.Get("Authorization"), p.cfg.defaultAuth} {
		if secret != "" {
			msg = strings.ReplaceAll(msg, secret, "REDACTED")
			if _, tok, ok := strings.Cut(secret, " "); ok && tok != "" {
				msg = strings.ReplaceAll(msg, tok, "REDACTED")
			}
		}
	}
	return msg
}

// recorder notes what the proxy answered, for the request's log line.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
	reason string                   // why the proxy answered itself, or ""
	giveUp *ratecord.RateLimitError // when ratecord gave up
	err    string                   // the error's text, not yet redacted
}

func (rec *recorder) WriteHeader(code int) {
	if rec.status == 0 && code >= 200 {
		rec.status = code
	}
	rec.ResponseWriter.WriteHeader(code)
}

func (rec *recorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	n, err := rec.ResponseWriter.Write(b)
	rec.bytes += int64(n)
	return n, err
}

// Unwrap lets [http.ResponseController] reach the connection's writer.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }

// bufferPool lends the reverse proxy its copy buffers.
type bufferPool struct{ pool sync.Pool }

func (b *bufferPool) Get() []byte {
	if buf, ok := b.pool.Get().(*[]byte); ok {
		return *buf
	}
	return make([]byte, 32<<10)
}

func (b *bufferPool) Put(buf []byte) { b.pool.Put(&buf) }
