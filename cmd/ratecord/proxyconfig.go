package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"time"

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
	defaultAuth  string      // the Authorization value to inject, or ""
	auth         *clientAuth // who may use the proxy
	hashKey      string
	globalLimit  int
	detectLimit  bool
	maxWait      time.Duration
	retries      int
	maxBody      int64
	replayBody   int64
	maxBuffered  int64 // bytes of request bodies buffered at once, all requests together

	maxConns       int // client connections open at once
	maxHeaderBytes int // request line and headers
	maxAuthBytes   int // the Authorization header
	maxInFlight    int // requests being forwarded at once

	upstreamTimeout   time.Duration
	readHeaderTimeout time.Duration
	readTimeout       time.Duration
	writeTimeout      time.Duration
	idleTimeout       time.Duration
	shutdownTimeout   time.Duration

	logFormat string
	logLevel  slog.Level
}

// logFlushInterval is how long a log line may wait in the buffer.
const logFlushInterval = 100 * time.Millisecond

// proxyUsage is printed by "ratecord proxy -h" before the flags.
const proxyUsage = `Usage: ratecord proxy [flags]

Serves a reverse proxy to Discord's API that sends every request through
ratecord, so that any number of bots, in any language, stay inside Discord's
rate limits. Point a bot's API base URL at http://<addr>/api/v10 instead of
https://discord.com/api/v10. Each request's own Authorization header is its
credential: one proxy serves many bots.

Memory: unless GOGC or GOMEMLIMIT is set, the proxy runs the garbage
collector by a soft memory limit of 14 MiB, raised with the live heap to a
quarter over it (the resident size stays under 25 MB under load). With either
set, Go's own rules apply.

Endpoints:
  /api/...   forwarded to -upstream with path, query, method, body and
             headers intact (hop-by-hop headers removed, Host set to the
             upstream's). The path is checked before anything else: a
             dot-segment in any encoding, an encoded slash or percent
             sign, an empty segment, a backslash, ";", a control byte, a
             target that is not a path (absolute-form, authority-form) or
             a path outside /api/ is answered 400 and never forwarded
  /healthz   200 "ok" while the process serves
  /metrics   ratecord's OpenTelemetry metrics in Prometheus text format,
             with Go runtime and process metrics

When the proxy answers itself (ratecord gave up, or the proxy refused the
request), the answer is a JSON error:
  429  the wait would exceed -max-wait, or the invalid-request guard or a
       401/404 cooldown refused the request
  503  the rate-limit store failed (Redis down under -redis-fail closed) or
       the proxy is shutting down
  502  the upstream could not be reached
  413  the request body exceeds -max-body
  400  the request target is not a clean /api/ path (reason bad_path), or
       Authorization is too long or sent twice (bad_authorization)
  401  client authentication failed (client_auth)
  503  -max-in-flight requests are in flight already (overloaded)
with Retry-After and X-Ratecord-Reason, -Scope, -Bucket and -Retry-After
headers, and a body such as
  {"message":"ratecord: wait exceeds the maximum","code":0,"retry_after":1.25,
   "global":false,"ratecord":{"reason":"wait_too_long","scope":"user",
   "bucket":"abcd1234","route":"POST /channels/:id/messages","retry_after":1.25}}

Who may use the proxy: by default, whoever reaches it, and it listens on a
loopback address unless -allow-remote is given. -client-secret makes every
request to /api/ carry that secret in the X-Ratecord-Client-Secret header
(removed before forwarding); -allowed-tokens lets requests whose own
Authorization is one of those tokens through without it. Anything else is
answered 401 (reason client_auth). Only a request with the client secret
(or any request, without client authentication) gets -default-token, so
-default-token with -allow-remote needs -client-secret. /healthz and
/metrics answer without authentication.

Caps: -max-conns client connections (more wait in the listen queue),
-max-header-bytes of request headers (431), -max-auth-bytes of
Authorization (400, reason bad_authorization) and -max-in-flight requests
being forwarded (503, reason overloaded, with Retry-After).

Logs (one line per request at level info) carry redacted paths and errors,
never a token.

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
	fs.BoolVar(&cfg.allowRemote, "allow-remote", false, "allow a non-loopback -addr (with -default-token, -client-secret is required)")
	upstream := fs.String("upstream", "https://discord.com", "`URL` of Discord's API; request paths such as /api/v10/... are appended")
	redisList := fs.String("redis", "", "comma-separated Redis `addresses` (host:port; several make a cluster client) or one redis:// or rediss:// URL; replicas using the same Redis share limits. Empty: limits are kept in this process")
	fs.BoolVar(&cfg.redisCluster, "redis-cluster", false, "use a Redis Cluster client even with a single -redis address")
	fs.StringVar(&cfg.redisUser, "redis-username", "", "Redis ACL user `name`")
	fs.StringVar(&cfg.redisPass, "redis-password", "", "Redis `password` (prefer the environment variable: command lines are visible to other users)")
	fs.StringVar(&cfg.redisPrefix, "redis-prefix", redisstore.DefaultPrefix, "`prefix` of the Redis keys; replicas sharing limits use the same")
	redisFail := fs.String("redis-fail", "open", "`policy` when Redis cannot be reached: open (go on with a conservative share of every limit in this process) or closed (answer 503)")
	fs.DurationVar(&cfg.redisTimeout, "redis-timeout", time.Second, "timeout of each Redis dial, read and write")
	defaultToken := fs.String("default-token", "", "`token` (\"Bot ...\", or bare for a bot token) sent with requests that carry no Authorization header, except on webhook and interaction routes, whose token is in the path (prefer the environment variable)")
	clientSecret := fs.String("client-secret", "", fmt.Sprintf("shared `secret` (at least %d bytes) every request to /api/ must carry in the %s header, removed before forwarding; requests without it get 401 (prefer the environment variable)", minClientSecret, hdrClientSecret))
	allowedTokens := fs.String("allowed-tokens", "", "comma-separated bot `tokens` (\"Bot ...\", or bare) whose requests need no client secret; others get 401. Kept only as keyed hashes (prefer the environment variable)")
	fs.IntVar(&cfg.maxConns, "max-conns", 1024, "client connections open at once; more wait in the listen queue until one closes")
	fs.IntVar(&cfg.maxHeaderBytes, "max-header-bytes", 32<<10, "largest request line and headers in `bytes`; larger ones get 431")
	fs.IntVar(&cfg.maxAuthBytes, "max-auth-bytes", 512, "largest Authorization header in `bytes`; larger ones get 400")
	fs.IntVar(&cfg.maxInFlight, "max-in-flight", 512, "requests forwarded or waiting for a rate-limit slot at once; more get 503 with Retry-After")
	fs.StringVar(&cfg.hashKey, "hash-key", "", "secret `key` of the hash that replaces tokens in rate-limit keys; replicas sharing Redis must use the same. Empty: a fixed key")
	fs.IntVar(&cfg.globalLimit, "global-limit", ratecord.DefaultGlobalLimit, "requests per second each credential may send (Discord's global limit)")
	fs.BoolVar(&cfg.detectLimit, "detect-global-limit", false, "find each bot's global limit from GET /gateway/bot (max_concurrency); -global-limit stays the default until it is found")
	fs.DurationVar(&cfg.maxWait, "max-wait", 30*time.Second, "longest a request may wait for a slot; a longer wait is answered 429 at once")
	fs.IntVar(&cfg.retries, "retries", ratecord.DefaultRetries, "times a 429, a 5xx or a network error is sent again (5xx and network errors: idempotent requests only)")
	fs.Int64Var(&cfg.maxBody, "max-body", 25<<20, "largest request body in `bytes` (Discord's upload limit); larger ones get 413")
	fs.Int64Var(&cfg.replayBody, "replay-body", 1<<20, "request bodies of up to this many `bytes` are buffered so that a 429 can be retried; larger ones are streamed and their 429s reach the client")
	fs.Int64Var(&cfg.maxBuffered, "max-buffered", 64<<20, "`bytes` of request bodies buffered at once, all requests together; a body that does not fit is streamed, and its 429s reach the client")
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
	return cfg, cfg.finish(rawFlags{
		upstream: *upstream, redisList: *redisList, redisFail: *redisFail, defaultToken: *defaultToken,
		logLevel: *logLevel, clientSecret: *clientSecret, allowedTokens: *allowedTokens,
	})
}

// rawFlags are the flags that finish turns into fields of a proxyConfig.
type rawFlags struct {
	upstream, redisList, redisFail, defaultToken, logLevel string
	clientSecret, allowedTokens                            string
}

// finish checks the flags and sets the fields derived from them.
func (cfg *proxyConfig) finish(f rawFlags) error {
	upstream, redisList, redisFail, logLevel := f.upstream, f.redisList, f.redisFail, f.logLevel
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
	cfg.defaultAuth = authorization(f.defaultToken)
	if err := cfg.finishAuth(f.clientSecret, f.allowedTokens); err != nil {
		return err
	}
	if err := cfg.logLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return &usageError{msg: fmt.Sprintf("-log-level %q: want debug, info, warn or error", logLevel)}
	}
	if cfg.logFormat != "json" && cfg.logFormat != "text" {
		return &usageError{msg: fmt.Sprintf("-log-format %q: want json or text", cfg.logFormat)}
	}
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"-max-body", cfg.maxBody}, {"-max-conns", int64(cfg.maxConns)}, {"-max-header-bytes", int64(cfg.maxHeaderBytes)},
		{"-max-auth-bytes", int64(cfg.maxAuthBytes)}, {"-max-in-flight", int64(cfg.maxInFlight)},
		{"-max-buffered", cfg.maxBuffered},
	} {
		if c.v <= 0 {
			return &usageError{msg: c.name + " must be positive"}
		}
	}
	if cfg.writeTimeout > 0 && cfg.maxWait > 0 && cfg.writeTimeout <= cfg.maxWait {
		return &usageError{msg: fmt.Sprintf("-write-timeout %v must exceed -max-wait %v", cfg.writeTimeout, cfg.maxWait)}
	}
	return nil
}

// finishAuth checks the client authentication flags and builds cfg.auth.
// The tokens are hashed at once and not kept.
func (cfg *proxyConfig) finishAuth(secret, tokenList string) error {
	if secret != "" && len(secret) < minClientSecret {
		return &usageError{msg: fmt.Sprintf("-client-secret must be at least %d bytes", minClientSecret)}
	}
	var tokens []string
	for _, tok := range splitList(tokenList) {
		tokens = append(tokens, authorization(tok))
	}
	if cfg.defaultAuth != "" && secret == "" {
		switch {
		case cfg.allowRemote:
			return &usageError{msg: "-allow-remote with -default-token needs -client-secret: anyone who reaches the proxy could send with the default token"}
		case len(tokens) > 0:
			return &usageError{msg: "-default-token with -allowed-tokens needs -client-secret: only requests with the client secret get the default token"}
		}
	}
	cfg.auth = newClientAuth(secret, tokens)
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
