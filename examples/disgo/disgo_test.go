// Package disgo_test shows ratecord under disgo: a disgo REST client given
// an *http.Client whose transport is a ratecord Transport (rest.WithHTTPClient)
// and the Discord emulator's URL (rest.WithURL) delivers every message sent
// from several goroutines without a single 429, both with ratecord as the
// only limiter and, without the race detector, with disgo's own rate limiter
// in front of it.
package disgo_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/disgoorg/disgo/discord"
	"github.com/disgoorg/disgo/rest"
	"github.com/disgoorg/snowflake/v2"
	"go.uber.org/goleak"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
)

// TestMain checks for leaked goroutines, except the cleanup loop of disgo's
// rate limiter: disgo starts it in rest.NewRateLimiter and nothing stops it,
// not even Client.Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/disgoorg/disgo/rest.(*rateLimiterImpl).cleanup"))
}

// token is the bot token every test sends (disgo adds "Bot "); the emulator
// accepts any token.
const token = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.examples-disgo-token"

// TestCreateMessage sends 36 messages to three channels from four
// goroutines per channel with ratecord as the only limiter: disgo's is
// replaced by rest.NewNoopRateLimiter. disgo v0.19.6's own limiter reads a
// bucket's fields before locking it and sets its global deadline without a
// lock, so the race detector reports it as soon as two goroutines share a
// bucket, with or without ratecord; TestCreateMessageDisgoLimiter, built
// without the race detector, keeps it in place.
func TestCreateMessage(t *testing.T) {
	sendMessages(t, rest.WithRateLimiter(rest.NewNoopRateLimiter()))
}

// sendMessages sends 36 messages to three channels from four goroutines per
// channel through a disgo REST client configured with opts and ratecord, and
// checks that the emulator delivered all of them without a 429. The
// emulator runs every window ten times shorter, so the bucket allows 5
// messages per 0.5 s per channel and most of them wait.
func sendMessages(t *testing.T, opts ...rest.ClientConfigOpt) {
	t.Helper()
	srv := discordtest.NewServer(discordtest.WithTimeScale(0.1))
	t.Cleanup(srv.Close)
	tr := ratecord.NewTransport(nil)
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })

	client := rest.NewClient(token, append([]rest.ClientConfigOpt{
		rest.WithHTTPClient(&http.Client{Transport: tr}),
		rest.WithURL(srv.URL() + "/api/v10"),
		rest.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
	}, opts...)...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		client.Close(ctx)
	})
	channels := rest.NewChannels(client, discord.AllowedMentions{})

	chans := []snowflake.ID{100000000000000001, 100000000000000002, 100000000000000003}
	const workers, perWorker = 4, 3
	var (
		mu  sync.Mutex // guards ids
		ids = make(map[snowflake.ID]bool)
		wg  sync.WaitGroup
	)
	for _, ch := range chans {
		for w := range workers {
			wg.Go(func() {
				for i := range perWorker {
					content := fmt.Sprintf("worker %d message %d", w, i)
					msg, err := channels.CreateMessage(ch, discord.MessageCreate{Content: content}, rest.WithCtx(t.Context()))
					if err != nil {
						t.Errorf("CreateMessage(%s, %q): %v", ch, content, ratecord.RedactError(err))
						return
					}
					if msg.ChannelID != ch || msg.Content != content || msg.ID == 0 {
						t.Errorf("CreateMessage(%s, %q) = message %s in %s with %q; want a new message with that channel and content",
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

	if want := len(chans) * workers * perWorker; len(ids) != want {
		t.Errorf("got %d distinct message IDs; want %d", len(ids), want)
	}
	st := srv.Stats()
	if st.ByStatus[http.StatusTooManyRequests] != 0 || st.Avoidable != 0 {
		t.Errorf("emulator answered %d 429s (by scope %v, %d avoidable); want none",
			st.ByStatus[http.StatusTooManyRequests], st.ByScope, st.Avoidable)
	}
	delivered := make(map[string]int)
	for k, n := range st.Successes {
		delivered[k.Major] += n
	}
	for _, ch := range chans {
		if got := delivered["channels/"+ch.String()]; got != workers*perWorker {
			t.Errorf("emulator delivered %d messages to channel %s; want %d", got, ch, workers*perWorker)
		}
	}
}
