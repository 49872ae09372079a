package memstore

import (
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/model"
)

// TestKeptSlotOfAnOverdueProbe: a known bucket keeps a slot for a probe of
// its major only while the probe may still count: once its answer is
// overdue (its process stopped or died before it could report), the slot
// goes without an answer.
func TestKeptSlotOfAnOverdueProbe(t *testing.T) {
	s, clk := newFake(t)
	create := claim("POST /channels/:id/messages", "channels/1")
	update(t, s, acquire(t, s, create), headers(create, "h", 3, 2, time.Hour))
	acquire(t, s, create) // one slot left
	acquire(t, s, claim("GET /channels/:id/messages", "channels/1"))

	last := acquireAsync(t, s, create)
	pending(t, last, "last slot while the probe is in flight")
	overdue := time.Duration(s.hold+model.ReportSlack) * time.Millisecond
	clk.Advance(overdue - time.Millisecond)
	pending(t, last, "last slot just before the probe is overdue")
	clk.Advance(time.Millisecond)
	granted(t, last, "last slot once the probe is overdue")
}

// TestProbeOfAnotherMajorKeepsNothing: a probe keeps a slot only in the
// buckets of its own major, and of its own credential.
func TestProbeOfAnotherMajorKeepsNothing(t *testing.T) {
	s, _ := newFake(t)
	create := claim("POST /channels/:id/messages", "channels/1")
	update(t, s, acquire(t, s, create), headers(create, "h", 2, 1, time.Hour))
	acquire(t, s, claim("GET /channels/:id/messages", "channels/2"))
	other := store.Claim{Credential: "other", Route: "GET /channels/:id/messages", Major: "channels/1"}
	acquire(t, s, other)
	acquire(t, s, create) // the last slot: no probe of channels/1 of this credential is in flight
}
