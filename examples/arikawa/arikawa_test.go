// Package arikawa_test shows ratecord under arikawa (v3.6.0): an api.Client
// whose HTTP client sends through a ratecord Transport delivers every message
// sent from several goroutines to the Discord emulator (discordtest) without
// a single 429, both with arikawa's own limiter left in place and with
// ratecord as the only limiter. It then shows two processes of one bot
// sharing their limits through a Redis store: together they send as one
// would, again without a 429.
//
// arikawa's limiter (api/rate) keys requests by path and holds a lock per
// path from before a request is sent until its response arrives, so with it
// in place one request per path is in flight at a time, whatever ratecord
// allows; it learns the global limit only from a global 429, and its bucket
// map never shrinks. Its hooks can be replaced through the public API
// (withoutArikawaLimiter): ratecord then sends requests on a bucket with
// slots left concurrently, which TestSendMessageRatecordOnly measures.
//
// arikawa builds its URLs from package variables set at initialisation
// (api.Endpoint, api.EndpointChannels, ...), so the tests leave them alone:
// ratecord sends through a base transport that carries requests meant for
// discord.com to the emulator instead.
package arikawa_test

import (
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/diamondburned/arikawa/v3/api"
	"github.com/diamondburned/arikawa/v3/discord"
	"github.com/diamondburned/arikawa/v3/utils/httputil"
	"github.com/diamondburned/arikawa/v3/utils/httputil/httpdriver"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
	"github.com/ratecord/ratecord/examples/internal/testproc"
	"github.com/ratecord/ratecord/examples/internal/testredis"
	"github.com/ratecord/ratecord/store/redisstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// token is the bot token every test sends; arikawa sends it as given, so it
// carries its "Bot " prefix. The emulator accepts any token.
const token = "Bot MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.examples-arikawa-token"

// Environment of the helper process started by TestTwoProcessesShareRedis.
const (
	envHelper   = "RATECORD_EXAMPLE_HELPER" // "1" in a helper process
	envEmulator = "RATECORD_EXAMPLE_EMULATOR"
	envRedis    = "RATECORD_EXAMPLE_REDIS"
	envPrefix   = "RATECORD_EXAMPLE_PREFIX"
	envProcess  = "RATECORD_EXAMPLE_PROCESS"
)

// newEmulator starts the Discord emulator with every window ten times
// shorter (a 5 s bucket lasts 0.5 s) and 40 ms of latency per round trip,
// so requests sent together are in flight together; closed when t ends.
func newEmulator(t *testing.T) *discordtest.Server {
	t.Helper()
	srv := discordtest.NewServer(discordtest.WithTimeScale(0.1), discordtest.WithLatency(40*time.Millisecond, 0))
	t.Cleanup(srv.Close)
	return srv
}

// toEmulator is the transport beneath ratecord in these tests: it sends each
// request meant for discord.com to the emulator instead, and records the
// most requests to one path that were in flight at once.
type toEmulator struct {
	base   *http.Transport
	target *url.URL

	mu       sync.Mutex // guards inFlight and peak
	inFlight map[string]int
	peak     map[string]int
}

// newToEmulator returns a toEmulator sending to the emulator at base (its
// URL), whose idle connections are closed when t ends.
func newToEmulator(t *testing.T, base string) *toEmulator {
	t.Helper()
	target, err := url.Parse(base)
	if err != nil {
		t.Fatalf("emulator URL %q: %v", base, err)
	}
	e := &toEmulator{base: &http.Transport{}, target: target, inFlight: make(map[string]int), peak: make(map[string]int)}
	t.Cleanup(e.base.CloseIdleConnections)
	return e
}

// RoundTrip sends a copy of req to the emulator.
func (e *toEmulator) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host, r.Host = e.target.Scheme, e.target.Host, ""
	path := req.URL.Path
	e.mu.Lock()
	e.inFlight[path]++
	e.peak[path] = max(e.peak[path], e.inFlight[path])
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.inFlight[path]--
		e.mu.Unlock()
	}()
	return e.base.RoundTrip(r)
}

// CloseIdleConnections closes the idle connections to the emulator.
func (e *toEmulator) CloseIdleConnections() { e.base.CloseIdleConnections() }

// peakInFlight returns the most requests to path that were in flight at once.
func (e *toEmulator) peakInFlight(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peak[path]
}

// newClient returns an arikawa API client sending through tr, with arikawa's
// own limiter in place.
func newClient(tr http.RoundTripper) *api.Client {
	hc := httputil.NewClient()
	hc.Client = httpdriver.WrapClient(http.Client{Transport: tr})
	return api.NewCustomClient(token, hc)
}

// withoutArikawaLimiter makes ratecord the only limiter of c: arikawa's
// request hook, which sets the Authorization and User-Agent headers and
// acquires its limiter, is replaced by one that only sets the headers, and
// its response hook, which releases the limiter, is dropped. arikawa's
// retries (c.Client.Retries, 5 by default) stay: arikawa streams JSON bodies
// through a pipe that ratecord cannot replay, so ratecord hands a 429 on a
// POST back instead of sending it again, and arikawa's next attempt, a new
// request, waits in ratecord as long as Discord asked. It returns c.
func withoutArikawaLimiter(c *api.Client) *api.Client {
	c.Client.OnRequest = []httputil.RequestOption{httputil.WithHeaders(http.Header{
		"Authorization": {c.Token},
		"User-Agent":    {c.UserAgent},
	})}
	c.Client.OnResponse = nil
	return c
}

// load is how many messages a test sends: workers goroutines on each of
// channels, each sending perWorker messages one after another.
type load struct {
	channels  []discord.ChannelID
	workers   int
	perWorker int
}

func (l load) total() int { return len(l.channels) * l.workers * l.perWorker }

// send sends l through c, tagging each message's content with tag, and
// checks that every message came back with the channel and content it was
// sent with and an ID of its own. It returns the IDs.
func send(t *testing.T, c *api.Client, l load, tag string) map[discord.MessageID]bool {
	t.Helper()
	c = c.WithContext(t.Context())
	var (
		mu  sync.Mutex // guards ids
		ids = make(map[discord.MessageID]bool)
		wg  sync.WaitGroup
	)
	for _, ch := range l.channels {
		for w := range l.workers {
			wg.Go(func() {
				for i := range l.perWorker {
					content := fmt.Sprintf("%s worker %d message %d", tag, w, i)
					msg, err := c.SendMessage(ch, content)
					if err != nil {
						t.Errorf("SendMessage(%s, %q): %v", ch, content, ratecord.RedactError(err))
						return
					}
					if msg.ChannelID != ch || msg.Content != content || !msg.ID.IsValid() {
						t.Errorf("SendMessage(%s, %q) = message %s in %s with %q; want a new message with that channel and content",
							ch, content, msg.ID, msg.ChannelID, msg.Content)
					}
					mu.Lock()
					ids[msg.ID] = true
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return ids
}

// checkStats fails t unless the emulator answered no 429 and delivered
// want messages to each of channels.
func checkStats(t *testing.T, srv *discordtest.Server, channels []discord.ChannelID, want int) {
	t.Helper()
	st := srv.Stats()
	if st.ByStatus[http.StatusTooManyRequests] != 0 || st.Avoidable != 0 {
		t.Errorf("emulator answered %d 429s (by scope %v, %d avoidable); want none",
			st.ByStatus[http.StatusTooManyRequests], st.ByScope, st.Avoidable)
	}
	delivered := make(map[string]int)
	for k, n := range st.Successes {
		delivered[k.Major] += n
	}
	for _, ch := range channels {
		if got := delivered["channels/"+ch.String()]; got != want {
			t.Errorf("emulator delivered %d messages to channel %s; want %d", got, ch, want)
		}
	}
}

// messagesPath is the path arikawa sends a channel's messages to.
func messagesPath(ch discord.ChannelID) string {
	return "/api/v" + api.Version + "/channels/" + ch.String() + "/messages"
}

var channels = []discord.ChannelID{100000000000000001, 100000000000000002, 100000000000000003}

// TestSendMessage sends 36 messages to three channels from four goroutines
// per channel with arikawa's limiter in place. The bucket allows 5 messages
// per 0.5 s per channel, so most of them wait: in arikawa's limiter or in
// ratecord. arikawa's limiter lets one request per channel be in flight at a
// time.
func TestSendMessage(t *testing.T) {
	t.Parallel()
	srv := newEmulator(t)
	base := newToEmulator(t, srv.URL())
	tr := ratecord.NewTransport(base)
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })

	l := load{channels: channels, workers: 4, perWorker: 3}
	ids := send(t, newClient(tr), l, "limiter")
	if len(ids) != l.total() {
		t.Errorf("got %d distinct message IDs; want %d", len(ids), l.total())
	}
	checkStats(t, srv, l.channels, l.workers*l.perWorker)
	for _, ch := range l.channels {
		if got := base.peakInFlight(messagesPath(ch)); got != 1 {
			t.Errorf("channel %s: at most %d requests in flight at once; want 1, arikawa's limiter holding the path's lock", ch, got)
		}
	}
}

// TestSendMessageRatecordOnly is TestSendMessage with ratecord as the only
// limiter: requests on a channel whose bucket has slots left go out
// together.
func TestSendMessageRatecordOnly(t *testing.T) {
	t.Parallel()
	srv := newEmulator(t)
	base := newToEmulator(t, srv.URL())
	tr := ratecord.NewTransport(base)
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })

	l := load{channels: channels, workers: 4, perWorker: 3}
	ids := send(t, withoutArikawaLimiter(newClient(tr)), l, "ratecord")
	if len(ids) != l.total() {
		t.Errorf("got %d distinct message IDs; want %d", len(ids), l.total())
	}
	checkStats(t, srv, l.channels, l.workers*l.perWorker)
	for _, ch := range l.channels {
		got := base.peakInFlight(messagesPath(ch))
		t.Logf("channel %s: at most %d requests in flight at once", ch, got)
		if got < 2 {
			t.Errorf("channel %s: at most %d requests in flight at once; want several, the bucket having slots for them", ch, got)
		}
	}
}

// twoProcessLoad is what each helper process sends.
var twoProcessLoad = load{channels: channels, workers: 2, perWorker: 4}

// TestTwoProcessesShareRedis runs this test binary twice more as two
// processes of one bot (one token), each with its own arikawa client and
// ratecord Transport, both on one Redis store under one prefix, arikawa's
// limiter left in place as in most bots. Each process alone believes it has
// the whole bucket; the store makes them share it.
func TestTwoProcessesShareRedis(t *testing.T) {
	addr := testredis.Addr(t)
	srv := newEmulator(t)
	prefix := fmt.Sprintf("ratecord-examples-arikawa:%d", time.Now().UnixNano())

	const processes = 2
	testproc.Run(t, processes, "TestHelperProcess", envProcess,
		envHelper+"=1", envEmulator+"="+srv.URL(), envRedis+"="+addr, envPrefix+"="+prefix)
	checkStats(t, srv, twoProcessLoad.channels, processes*twoProcessLoad.workers*twoProcessLoad.perWorker)
}

// TestHelperProcess is one process of TestTwoProcessesShareRedis; run
// directly it skips.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(envHelper) != "1" {
		t.Skip("run by TestTwoProcessesShareRedis")
	}
	client := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, redisstore.WithPrefix(os.Getenv(envPrefix)))
	t.Cleanup(func() { store.Close() })
	tr := ratecord.NewTransport(newToEmulator(t, os.Getenv(envEmulator)), ratecord.WithStore(store))
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })

	l := twoProcessLoad
	ids := send(t, newClient(tr), l, "process "+os.Getenv(envProcess))
	if len(ids) != l.total() {
		t.Errorf("got %d distinct message IDs; want %d", len(ids), l.total())
	}
}
