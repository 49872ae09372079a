package ratecord

import (
	"errors"
	"net/http"
	"time"

	"github.com/ratecord/ratecord/store"
)

// ErrNoEstimate means the transport's store cannot estimate waits (it does
// not implement [store.Estimator]).
var ErrNoEstimate = errors.New("ratecord: the store does not estimate waits")

// Estimate returns how long req would wait for a slot if it were sent now,
// without sending it and without taking a slot: for job systems that
// schedule a request at its ready time instead of parking a worker on it.
// It is an estimate, a lower bound from what the store knows: the
// credential's pauses, its global window, the bucket's reset or drip, and
// the requests queued ahead (in every process, with the Redis store); a
// wait that only a response can end (the first request of a route still
// out) counts as zero, and other clients may take the slot first. A request
// the store would refuse (guard, 401 or webhook cooldown) gets the
// [*RateLimitError] RoundTrip would return. req's context bounds the call;
// the memory store answers at once, the Redis store in one round trip.
func (t *Transport) Estimate(req *http.Request) (time.Duration, error) {
	est, ok := t.store.(store.Estimator)
	if !ok {
		return 0, ErrNoEstimate
	}
	key := t.keyer.key(req, t.cfg.clock.Now)
	c := t.claim(key, req, control{})
	if req.GetBody == nil && req.Body != nil && req.Body != http.NoBody {
		if key.route == routeChannelEdit {
			c.Kind = kindRename // the body cannot be read without taking it
		}
	} else {
		c.Kind, _ = kindOf(req, key.route)
	}
	d, err := est.Estimate(req.Context(), c)
	if err != nil {
		return 0, refusal(key.route, err)
	}
	return d, nil
}
