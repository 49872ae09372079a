package lane

import (
	"slices"
	"strings"
	"testing"
)

// simulate runs a line where arrivals[i] joins before grant i, "u…" names
// being urgent, and returns the grant order.
func simulate(initial []string, arrivals [][]string) []string {
	urgent := func(s string) bool { return strings.HasPrefix(s, "u") }
	q := append([]string(nil), initial...)
	streak := 0
	var out []string
	for i := 0; len(q) > 0 || i < len(arrivals); i++ {
		if i < len(arrivals) {
			for _, a := range arrivals[i] {
				q = Insert(q, Place(q, 0, urgent(a), urgent, streak), a)
			}
		}
		if len(q) == 0 {
			continue
		}
		w := q[0]
		q = q[1:]
		streak = Granted(streak, urgent(w))
		out = append(out, w)
	}
	return out
}

func TestPlace(t *testing.T) {
	for _, tc := range []struct {
		name     string
		initial  []string
		arrivals [][]string
		want     []string
	}{
		{
			name:     "urgent ahead of normal, arrival order within lanes",
			initial:  []string{"n1", "n2"},
			arrivals: [][]string{{"u1", "n3", "u2"}},
			want:     []string{"u1", "u2", "n1", "n2", "n3"},
		},
		{
			name:     "a backlog keeps one slot in five",
			initial:  []string{"n1", "n2", "n3"},
			arrivals: [][]string{{"u1", "u2", "u3", "u4", "u5", "u6"}},
			want:     []string{"u1", "u2", "u3", "u4", "n1", "u5", "u6", "n2", "n3"},
		},
		{
			name:     "urgent traffic arriving one at a time does not starve the backlog",
			initial:  []string{"n1", "n2"},
			arrivals: [][]string{{"u1"}, {"u2"}, {"u3"}, {"u4"}, {"u5"}, {"u6"}},
			want:     []string{"u1", "u2", "u3", "u4", "n1", "u5", "u6", "n2"},
		},
		{
			name:     "an urgent request never waits behind the whole backlog",
			initial:  []string{"n1", "n2", "n3", "n4", "n5", "n6"},
			arrivals: [][]string{{"u1"}, {"u2"}, {"u3"}, {"u4"}, {"u5"}, {"u6"}, {"u7"}},
			want:     []string{"u1", "u2", "u3", "u4", "n1", "u5", "u6", "u7", "n2", "n3", "n4", "n5", "n6"},
		},
	} {
		if got := simulate(tc.initial, tc.arrivals); !slices.Equal(got, tc.want) {
			t.Errorf("%s: grant order %v; want %v", tc.name, got, tc.want)
		}
	}
}

func TestPlaceRetry(t *testing.T) {
	urgent := func(s string) bool { return strings.HasPrefix(s, "u") }
	retry := func(s string) bool { return strings.HasSuffix(s, "r") }
	for _, tc := range []struct {
		name string
		q    []string
		add  string
		want []string
	}{
		{"a normal retry goes ahead of the normal waiters", []string{"u1", "n1", "n2"}, "n0r", []string{"u1", "n0r", "n1", "n2"}},
		{"behind the retries already there", []string{"n1r", "n2", "n3"}, "n0r", []string{"n1r", "n0r", "n2", "n3"}},
		{"an urgent retry goes to the front", []string{"u1", "n1"}, "u0r", []string{"u0r", "u1", "n1"}},
		{"behind the urgent retries", []string{"u1r", "n1r", "u2"}, "u0r", []string{"u1r", "u0r", "n1r", "u2"}},
		{"an empty line", nil, "n0r", []string{"n0r"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Insert(slices.Clone(tc.q), PlaceRetry(tc.q, 0, urgent(tc.add), urgent, retry), tc.add)
			if !slices.Equal(got, tc.want) {
				t.Errorf("PlaceRetry(%q, %q) gives %q; want %q", tc.q, tc.add, got, tc.want)
			}
		})
	}
}
