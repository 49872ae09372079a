package discordtest

import (
	"net/http"
	"strconv"
	"time"
)

// edgeBlockBody is the body of a block by Discord's edge ([EdgeLimit]), as
// Cloudflare sends it: static JSON without retry_after.
const edgeBlockBody = `{"code": 0, "message": "You are being blocked from accessing our API temporarily due to exceeding our rate limits frequently. Please read our docs at https://discord.com/developers/docs/topics/rate-limits to prevent this moving forward."}`

// probeGap is how long, before the time scale, a client is expected to wait
// after a block response before it probes whether the block has ended.
const probeGap = time.Second

// maxEdgeAnswers bounds the block responses an episode remembers one by
// one; older ones are folded into one time.
const maxEdgeAnswers = 256

// edgeLimit is an EdgeLimit with its route template parsed.
type edgeLimit struct {
	EdgeLimit
	tmpl *template // nil matches every route
}

// newEdgeLimits checks and parses the edge limits.
func newEdgeLimits(ls []EdgeLimit) ([]edgeLimit, error) {
	out := make([]edgeLimit, 0, len(ls))
	for _, l := range ls {
		if l.Limit <= 0 || l.Window <= 0 || l.Block < 0 {
			return nil, errEdgeLimit
		}
		if l.BanAfter == 0 {
			l.BanAfter = defaultEdgeBanAfter
		}
		e := edgeLimit{EdgeLimit: l}
		if l.Route != "" {
			t, err := parseTemplate(l.Route)
			if err != nil {
				return nil, err
			}
			e.tmpl = &t
		}
		out = append(out, e)
	}
	return out, nil
}

// match reports whether q counts towards the limit.
func (e *edgeLimit) match(q *request) bool {
	return e.tmpl == nil || e.tmpl.match(q.method, q.segs)
}

// blocks reports whether a block of the limit covers q.
func (e *edgeLimit) blocks(q *request) bool {
	return e.Block > 0 && (e.Everywhere || e.match(q))
}

// body returns the Content-Type and body of the limit's 429s.
func (e *edgeLimit) body() (contentType, body string) {
	if e == nil || e.Body == "" {
		return "application/json", edgeBlockBody
	}
	if e.ContentType == "" {
		return "text/plain; charset=utf-8", e.Body
	}
	return e.ContentType, e.Body
}

// edgeKey names the block of one edge limit for one client IP.
type edgeKey struct {
	ip    string
	limit int // index in Server.edge
}

// edgeAnswer is one block response: when its request was sent, and when
// the response reached which process of the client.
type edgeAnswer struct {
	sent time.Time
	reached
}

// edgeEpisode is one block of an IP by an edge limit: from the request that
// exceeded the limit to the end of the block. For a limit without a block,
// it is the refusals of the IP until a second (times the time scale) after
// the latest of them reached the client, kept to judge the next.
type edgeEpisode struct {
	until   time.Time
	answers []*edgeAnswer // oldest first
	folded  reached       // the latest delivery of answers dropped from the list; zero when none
}

// edgeAvoidable reports whether q, arriving during the block, could have been
// avoided: a block response had reached q's process before q was sent (at
// least the reaction time before when it reached that process, at least the
// propagation allowance before when it reached another process behind the
// IP), and q is not a lone probe, that is, it was sent less than gap after
// the latest block response its process knew of, or while an earlier request
// into the block was still awaiting its response. A request awaits its
// response until the reaction time after the response reached its process,
// whichever process sent it: the allowance forgives a process for not yet
// knowing a response, and does not make it wait longer for one.
func (s *Server) edgeAvoidable(ep *edgeEpisode, q *request, gap time.Duration) bool {
	var last time.Time
	told := false
	if !ep.folded.at.IsZero() && s.knew(ep.folded, q) {
		told, last = true, ep.folded.at
	}
	for _, a := range ep.answers {
		if s.knew(a.reached, q) {
			told = true
			if a.at.After(last) {
				last = a.at
			}
		}
	}
	if !told {
		return false
	}
	if q.sent.Sub(last) < gap {
		return true
	}
	for _, a := range ep.answers {
		if !a.lost && !a.sent.After(q.sent) && a.at.Add(reaction).After(q.sent) {
			return true
		}
	}
	return false
}

// answer remembers a block response to q, planned to reach its process at
// delivered, and moves it to the moment it is written.
func (ep *edgeEpisode) answer(res *result, q *request, delivered time.Time) {
	if len(ep.answers) >= maxEdgeAnswers {
		if a := ep.answers[0]; a.at.After(ep.folded.at) {
			ep.folded = a.reached
		}
		ep.answers = append(ep.answers[:0], ep.answers[1:]...)
	}
	a := &edgeAnswer{sent: q.sent, reached: reached{at: delivered, by: q.process}}
	ep.answers = append(ep.answers, a)
	onWrite(res, &a.reached)
}

// judgeEdge applies the edge limits to a request. It returns true when a
// block refuses it, with res set to the edge's 429.
func (s *Server) judgeEdge(q *request, res *result, now time.Time, back time.Duration) bool {
	if len(s.edge) == 0 {
		return false
	}
	for i := range s.edge {
		e := &s.edge[i]
		if !e.blocks(q) {
			continue
		}
		ep := s.edgeBlocks[edgeKey{ip: q.ip, limit: i}]
		if ep == nil || !now.Before(ep.until) {
			continue
		}
		res.status, res.edge, res.edgeBody = http.StatusTooManyRequests, true, e
		res.avoidable = s.edgeAvoidable(ep, q, s.scale(probeGap))
		ep.answer(res, q, now.Add(back))
		s.edgeStrike(q.ip, i, now)
		return true
	}
	// No block: count the request on every edge limit it falls under, unless
	// one of them is full, which starts a block, or for a limit without
	// one refuses the request alone.
	for i := range s.edge {
		e := &s.edge[i]
		if !e.match(q) {
			continue
		}
		key := counterKey{kind: kindEdge, cred: q.ip, hash: strconv.Itoa(i)}
		if ok, _ := s.counter(key, false).check(now, s.limitsFor(key)); ok {
			continue
		}
		res.status, res.edge, res.edgeBody = http.StatusTooManyRequests, true, e
		k := edgeKey{ip: q.ip, limit: i}
		if e.Block > 0 {
			ep := &edgeEpisode{until: now.Add(s.scale(e.Block))}
			ep.answer(res, q, now.Add(back))
			s.edgeBlocks[k] = ep
			return true
		}
		gap := s.scale(probeGap)
		ep := s.edgeBlocks[k]
		if ep != nil && now.Before(ep.until) {
			res.avoidable = s.edgeAvoidable(ep, q, gap)
		} else {
			ep = &edgeEpisode{}
			s.edgeBlocks[k] = ep
		}
		if end := now.Add(back + gap); end.After(ep.until) {
			ep.until = end
		}
		ep.answer(res, q, now.Add(back))
		return true
	}
	for i := range s.edge {
		if s.edge[i].match(q) {
			key := counterKey{kind: kindEdge, cred: q.ip, hash: strconv.Itoa(i)}
			s.counter(key, false).add(now, s.limitsFor(key))
		}
	}
	return false
}

// edgeStrike counts a request sent into an active block of edge limit i and
// bans the IP once it has sent more than the limit's BanAfter within Block.
func (s *Server) edgeStrike(ip string, i int, now time.Time) {
	if s.edge[i].BanAfter < 0 {
		return
	}
	key := counterKey{kind: kindEdgeStrike, cred: ip, hash: strconv.Itoa(i)}
	l := s.limitsFor(key)
	log := s.counter(key, false).(*slidingLog)
	log.add(now, l)
	if log.count(now, l) > l.limit {
		s.ban(ip, now)
	}
}

// ban bans a client IP for the ban duration.
func (s *Server) ban(ip string, now time.Time) {
	if until, ok := s.bans[ip]; ok && now.Before(until) {
		return
	}
	s.bans[ip] = now.Add(s.scale(s.cfg.banDuration))
	s.stats.bans++
}
