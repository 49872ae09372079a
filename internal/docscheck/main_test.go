package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestSlug(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"Limits no header announces", "limits-no-header-announces"},
		{"Large bots' global limit", "large-bots-global-limit"},
		{"When could this go? (job queues)", "when-could-this-go-job-queues"},
		{"Sharing limits across processes and hosts: the Redis store", "sharing-limits-across-processes-and-hosts-the-redis-store"},
		{"`-latency` and [the emulator](emulator.md)", "-latency-and-the-emulator"},
		{"Against go-redis/redis_rate", "against-go-redisredis_rate"},
	}
	for _, tc := range tests {
		if got := slug(tc.in); got != tc.want {
			t.Errorf("slug(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

func TestAnchorsOfRepeatedHeadings(t *testing.T) {
	t.Parallel()
	a := anchors("# Title\n## Notes\n```sh\n# not a heading\n```\n### Notes\n<a id=\"Custom\"></a>\n")
	for _, want := range []string{"title", "notes", "notes-1", "custom"} {
		if !a[want] {
			t.Errorf("anchors: no %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Errorf("anchors: a comment in a code block became a heading: %v", a)
	}
}

func TestShellWords(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []string
	}{
		{`go test -run '^$' -bench 'A|B' .   # comment`, []string{"go", "test", "-run", "^$", "-bench", "A|B", "."}},
		{`go run ./cmd/ratecord proxy -upstream http://127.0.0.1:8090 2>proxy.log &`, []string{"go", "run", "./cmd/ratecord", "proxy", "-upstream", "http://127.0.0.1:8090"}},
		{`cd examples && REDIS_ADDR=x go test ./y`, []string{"cd", "examples", "&&", "REDIS_ADDR=x", "go", "test", "./y"}},
		{`grep VmHWM /proc/x/status | head`, []string{"grep", "VmHWM", "/proc/x/status", "|", "head"}},
	}
	for _, tc := range tests {
		if got := shellWords(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("shellWords(%q) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

func TestParseCommand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, dir  string
		ok       bool
		wantDir  string
		wantArgs string
	}{
		{"go run ./cmd/ratecord bench -check", "", true, "", "go run ./cmd/ratecord bench -check"},
		{"cd examples && go run ./cmd/bench", "", true, "examples", "go run ./cmd/bench"},
		{"go run ./cmd/loadgen -clients 64", "examples", true, "examples", "go run ./cmd/loadgen -clients 64"},
		{"cd examples", "", false, "examples", ""},
		{"ratecord proxy -h", "examples", true, "", "go run ./cmd/ratecord proxy -h"},
		{"./ratecord proxy -redis 127.0.0.1:6379", "", true, "", "go run ./cmd/ratecord proxy -redis 127.0.0.1:6379"},
		{"REDIS_ADDR=127.0.0.1:6379 go test -bench . ./x", "", true, "", "go test -bench . ./x"},
		{"go run", "", false, "", ""},
		{"go get github.com/ratecord/ratecord", "", false, "", ""},
		{"ratecord.NewTransport(nil)", "", false, "", ""},
		{"GOGC=25", "", false, "", ""},
	}
	for _, tc := range tests {
		dir := tc.dir
		cmd, ok := parseCommand(tc.in, &dir)
		if ok != tc.ok || ok && (cmd.dir != tc.wantDir || strings.Join(cmd.args, " ") != tc.wantArgs) {
			t.Errorf("parseCommand(%q) in %q = %q in %q, %v; want %q in %q, %v",
				tc.in, tc.dir, strings.Join(cmd.args, " "), cmd.dir, ok, tc.wantArgs, tc.wantDir, tc.ok)
		}
	}
}

// TestCheck runs the checker on a small repository of its own, with a
// page that has one mistake of every kind it finds.
func TestCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go command")
	}
	root := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.25\n")
	write("cmd/tool/main.go", "package main\n\nimport \"flag\"\n\nfunc main() {\n\tflag.Bool(\"good\", false, \"a flag\")\n\tflag.Parse()\n}\n")
	write("m.go", "package m\n")
	write("m_test.go", "package m\n\nimport \"testing\"\n\nfunc TestSomething(t *testing.T) {}\n\nfunc BenchmarkSomething(b *testing.B) {}\n")
	write("docs/a.md", "# A page\n\n## A section\n")
	write("README.md", strings.Join([]string{
		"# Readme",
		"[fine](docs/a.md#a-section) [fine](#readme) [fine](https://example.com/x#y)",
		"[missing](docs/b.md) [no anchor](docs/a.md#nowhere) [here](#nowhere)",
		"```sh",
		"go run ./cmd/tool -good",
		"go run ./cmd/tool -bad",
		"go test -run TestSomething -bench Something .",
		"go test -run TestNothing .",
		"go test -frobnicate .",
		"go build ./cmd/none",
		"```",
		"Run `go run ./cmd/missing`.",
		"",
		"<!-- docscheck: flags of go run ./cmd/tool -->",
		"| flag | what |",
		"| --- | --- |",
		"| `-good` | fine |",
		"| `-gone` | not a flag |",
		"",
		"| flag | what |",
		"| --- | --- |",
		"| `-good` | a table without its comment |",
	}, "\n"))

	c := newChecker(root)
	c.checkFile("README.md")
	c.checkCommands()
	want := []string{
		`README.md:3: link "docs/b.md": no such file or directory`,
		`README.md:3: link "docs/a.md#nowhere": no heading with that anchor`,
		`README.md:3: link "#nowhere": no heading with that anchor`,
		`README.md:6: go run ./cmd/tool -bad: no flag -bad in ./cmd/tool -h`,
		`README.md:8: go test -run TestNothing .: -run "TestNothing" matches nothing in .`,
		`README.md:9: go test -frobnicate .: go test has no flag -frobnicate`,
		`README.md:10: go build ./cmd/none: go list`,
		`README.md:12: go run ./cmd/missing: go build ./cmd/missing`,
		`README.md:18: table of ./cmd/tool -h: no flag -gone in its -h`,
		`README.md:20: a table of flags without a <!-- docscheck: flags of COMMAND --> comment before it`,
	}
	for _, w := range want {
		if !slices.ContainsFunc(c.problems, func(p string) bool { return strings.HasPrefix(p, w) }) {
			t.Errorf("no problem %q; got:\n%s", w, strings.Join(c.problems, "\n"))
		}
	}
	if len(c.problems) != len(want) {
		t.Errorf("%d problems; want %d:\n%s", len(c.problems), len(want), strings.Join(c.problems, "\n"))
	}
}
