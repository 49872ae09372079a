// Package discordgo_test shows ratecord under discordgo: a Session whose
// Client sends through a ratecord Transport, with discordgo's own limiter
// left in place, delivers every message sent from several goroutines to the
// Discord emulator (discordtest) without a single 429. It then shows two
// processes of one bot sharing their limits through a Redis store: together
// they send as one would, again without a 429.
//
// discordgo builds its URLs from package variables (EndpointAPI,
// EndpointChannels, ...), so the tests point them at the emulator and
// restore them afterwards; the tests of this package do not run in
// parallel.
package discordgo_test

import (
	"fmt"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"
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

// token is the bot token every test sends; the emulator accepts any token.
const token = "Bot MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.examples-discordgo-token"

// Environment of the helper process started by TestTwoProcessesShareRedis.
const (
	envHelper   = "RATECORD_EXAMPLE_HELPER" // "1" in a helper process
	envEmulator = "RATECORD_EXAMPLE_EMULATOR"
	envRedis    = "RATECORD_EXAMPLE_REDIS"
	envPrefix   = "RATECORD_EXAMPLE_PREFIX"
	envProcess  = "RATECORD_EXAMPLE_PROCESS"
)

// newEmulator starts the Discord emulator with every window ten times
// shorter (a 5 s bucket lasts 0.5 s), closed when t ends.
func newEmulator(t *testing.T) *discordtest.Server {
	t.Helper()
	srv := discordtest.NewServer(discordtest.WithTimeScale(0.1))
	t.Cleanup(srv.Close)
	return srv
}

// useEmulator points discordgo's endpoints at the emulator at base (its
// URL) until t ends. The endpoint functions such as EndpointChannelMessages
// read EndpointChannels and its siblings when called, so setting the
// variables below redirects them too.
func useEmulator(t *testing.T, base string) {
	t.Helper()
	vars := []*string{
		&discordgo.EndpointDiscord, &discordgo.EndpointAPI, &discordgo.EndpointGuilds,
		&discordgo.EndpointChannels, &discordgo.EndpointUsers, &discordgo.EndpointGateway,
		&discordgo.EndpointGatewayBot, &discordgo.EndpointWebhooks, &discordgo.EndpointApplications,
	}
	saved := make([]string, len(vars))
	for i, v := range vars {
		saved[i] = *v
	}
	t.Cleanup(func() {
		for i, v := range vars {
			*v = saved[i]
		}
	})
	discordgo.EndpointDiscord = base + "/"
	discordgo.EndpointAPI = discordgo.EndpointDiscord + "api/v" + discordgo.APIVersion + "/"
	discordgo.EndpointGuilds = discordgo.EndpointAPI + "guilds/"
	discordgo.EndpointChannels = discordgo.EndpointAPI + "channels/"
	discordgo.EndpointUsers = discordgo.EndpointAPI + "users/"
	discordgo.EndpointGateway = discordgo.EndpointAPI + "gateway"
	discordgo.EndpointGatewayBot = discordgo.EndpointGateway + "/bot"
	discordgo.EndpointWebhooks = discordgo.EndpointAPI + "webhooks/"
	discordgo.EndpointApplications = discordgo.EndpointAPI + "applications"
}

// newSession returns a discordgo Session sending through tr.
func newSession(t *testing.T, tr *ratecord.Transport) *discordgo.Session {
	t.Helper()
	session, err := discordgo.New(token)
	if err != nil {
		t.Fatalf("discordgo.New: %v", err)
	}
	session.Client = &http.Client{Transport: tr}
	return session
}

// load is how many messages a test sends: workers goroutines on each of
// channels, each sending perWorker messages one after another.
type load struct {
	channels  []string
	workers   int
	perWorker int
}

func (l load) total() int { return len(l.channels) * l.workers * l.perWorker }

// send sends l through session, tagging each message's content with tag,
// and checks that every message came back with the channel and content it
// was sent with and an ID of its own. It returns the IDs.
func send(t *testing.T, session *discordgo.Session, l load, tag string) map[string]bool {
	t.Helper()
	var (
		mu  sync.Mutex // guards ids
		ids = make(map[string]bool)
		wg  sync.WaitGroup
	)
	for _, channel := range l.channels {
		for w := range l.workers {
			wg.Go(func() {
				for i := range l.perWorker {
					content := fmt.Sprintf("%s worker %d message %d", tag, w, i)
					msg, err := session.ChannelMessageSend(channel, content, discordgo.WithContext(t.Context()))
					if err != nil {
						t.Errorf("ChannelMessageSend(%s, %q): %v", channel, content, ratecord.RedactError(err))
						return
					}
					if msg.ChannelID != channel || msg.Content != content || msg.ID == "" {
						t.Errorf("ChannelMessageSend(%s, %q) = message %q in %s with %q; want a new message with that channel and content",
							channel, content, msg.ID, msg.ChannelID, msg.Content)
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
func checkStats(t *testing.T, srv *discordtest.Server, channels []string, want int) {
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
	for _, c := range channels {
		if got := delivered["channels/"+c]; got != want {
			t.Errorf("emulator delivered %d messages to channel %s; want %d", got, c, want)
		}
	}
}

var channels = []string{"100000000000000001", "100000000000000002", "100000000000000003"}

// TestChannelMessageSend sends 36 messages to three channels from four
// goroutines per channel. The bucket allows 5 messages per 0.5 s per
// channel, so most of them wait: in discordgo's limiter or in ratecord.
func TestChannelMessageSend(t *testing.T) {
	srv := newEmulator(t)
	useEmulator(t, srv.URL())
	tr := ratecord.NewTransport(nil)
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })
	session := newSession(t, tr)

	l := load{channels: channels, workers: 4, perWorker: 3}
	ids := send(t, session, l, "single")
	if len(ids) != l.total() {
		t.Errorf("got %d distinct message IDs; want %d", len(ids), l.total())
	}
	checkStats(t, srv, l.channels, l.workers*l.perWorker)
}

// twoProcessLoad is what each helper process sends.
var twoProcessLoad = load{channels: channels, workers: 2, perWorker: 4}

// TestTwoProcessesShareRedis runs this test binary twice more as two
// processes of one bot (one token), each with its own discordgo Session and
// ratecord Transport, both on one Redis store under one prefix. Each
// process alone believes it has the whole bucket; the store makes them
// share it.
func TestTwoProcessesShareRedis(t *testing.T) {
	addr := testredis.Addr(t)
	srv := newEmulator(t)
	prefix := fmt.Sprintf("ratecord-examples-discordgo:%d", time.Now().UnixNano())

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
	useEmulator(t, os.Getenv(envEmulator))
	client := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, redisstore.WithPrefix(os.Getenv(envPrefix)))
	t.Cleanup(func() { store.Close() })
	tr := ratecord.NewTransport(nil, ratecord.WithStore(store))
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })
	session := newSession(t, tr)

	l := twoProcessLoad
	ids := send(t, session, l, "process "+os.Getenv(envProcess))
	if len(ids) != l.total() {
		t.Errorf("got %d distinct message IDs; want %d", len(ids), l.total())
	}
}
