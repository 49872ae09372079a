// Command docscheck checks the project's Markdown (README.md and docs/*.md)
// against the repository, as CI runs it from the repository's root:
//
//	go run ./internal/docscheck
//
// It checks that
//
//   - every relative link resolves: the file or directory exists and, for
//     a link with a fragment into a Markdown file, a heading of that file
//     has that anchor (as GitHub derives anchors from headings);
//   - every command the pages show that runs this repository's code
//     parses: in sh code blocks and in inline code, each `go run`,
//     `go test` and `go build` (after an optional `cd examples &&`, or a
//     `cd examples` line earlier in the block) and each `ratecord` or
//     `./ratecord` command (the binary of ./cmd/ratecord). For `go run`
//     and `ratecord`, the program is built, the subcommand named must be
//     one its -h lists, `PROGRAM [SUBCOMMAND] -h` must succeed, and every
//     flag named must be in that help. For `go test`, the flags must be
//     flags of go test, the packages must exist, and the -run, -bench and
//     -fuzz patterns must match at least one test, benchmark or fuzz
//     target of them (`go test -list`). For `go build`, the packages must
//     exist;
//   - every table whose first column is headed "flag" follows a comment
//     naming the command whose flags it lists,
//     <!-- docscheck: flags of go run ./cmd/ratecord proxy -->, and every
//     flag in its first column is one of that command's.
//
// It prints each problem as FILE:LINE: message and exits 1 if there was
// any.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"unicode"
)

func main() {
	root := flag.String("root", ".", "the repository's root")
	flag.Parse()
	abs, err := filepath.Abs(*root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docscheck:", err)
		os.Exit(2)
	}
	files := []string{"README.md"}
	docs, err := filepath.Glob(filepath.Join(abs, "docs", "*.md"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "docscheck:", err)
		os.Exit(2)
	}
	for _, d := range docs {
		rel, _ := filepath.Rel(abs, d)
		files = append(files, rel)
	}
	c := newChecker(abs)
	for _, f := range files {
		c.checkFile(f)
	}
	c.checkCommands()
	for _, p := range c.problems {
		fmt.Println(p)
	}
	fmt.Printf("docscheck: %d files, %d links, %d commands, %d flag tables: %d problems\n",
		len(files), c.links, len(c.commands), len(c.tables), len(c.problems))
	if len(c.problems) > 0 {
		os.Exit(1)
	}
}

// checker collects what the pages show and the problems found.
type checker struct {
	root     string
	problems []string
	links    int
	commands []command
	tables   []flagTable
	anchors  map[string]map[string]bool // Markdown file (absolute) -> its anchors
	builds   map[string]*program        // dir + package -> the built program
	tmp      string
	lists    map[string][]string // dir + package -> go test -list output
}

func newChecker(root string) *checker {
	return &checker{
		root:    root,
		anchors: make(map[string]map[string]bool),
		builds:  make(map[string]*program),
		lists:   make(map[string][]string),
	}
}

func (c *checker) problem(file string, line int, format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf("%s:%d: %s", file, line, fmt.Sprintf(format, args...)))
}

// A command is one command line shown in a page.
type command struct {
	file string
	line int
	dir  string   // relative to the root: "" or "examples"
	args []string // from "go" or "ratecord" on, environment assignments left out
}

// A flagTable is a table of a command's flags.
type flagTable struct {
	file  string
	line  int
	of    command // the command whose flags it lists
	flags map[string]int
}

var (
	fenceRE   = regexp.MustCompile("^\\s*(```+|~~~+)\\s*([\\w+-]*)")
	headingRE = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
	linkRE    = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refDefRE  = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$`)
	htmlIDRE  = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	markerRE  = regexp.MustCompile(`<!--\s*docscheck:\s*flags of\s+(.+?)\s*-->`)
	schemeRE  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	flagRE    = regexp.MustCompile("`(-[A-Za-z0-9][\\w-]*)")
	helpRE    = regexp.MustCompile(`(?m)^\s+-([A-Za-z0-9][\w.-]*)`)
)

// checkFile checks the links of one page and collects its commands and flag
// tables.
func (c *checker) checkFile(rel string) {
	path := filepath.Join(c.root, rel)
	data, err := os.ReadFile(path)
	if err != nil {
		c.problem(rel, 0, "%v", err)
		return
	}
	lines := strings.Split(string(data), "\n")
	var (
		fence     string // the open fence, "" outside a code block
		fenceLang string
		dir       string // the directory a "cd" line in the block moved to
		marker    *command
		table     *flagTable
	)
	for i, line := range lines {
		n := i + 1
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			switch {
			case fence == "":
				fence, fenceLang, dir = m[1], m[2], ""
				continue
			case strings.HasPrefix(m[1], fence) && m[2] == "":
				fence = ""
				continue
			}
		}
		if fence != "" {
			if fenceLang == "sh" || fenceLang == "bash" || fenceLang == "shell" {
				if cmd, ok := parseCommand(line, &dir); ok {
					cmd.file, cmd.line = rel, n
					c.commands = append(c.commands, cmd)
				}
			}
			continue
		}

		if m := markerRE.FindStringSubmatch(line); m != nil {
			d := ""
			cmd, ok := parseCommand(m[1], &d)
			if !ok {
				c.problem(rel, n, "docscheck marker names no command: %q", m[1])
				continue
			}
			cmd.file, cmd.line = rel, n
			marker = &cmd
			continue
		}
		cells := tableCells(line)
		switch {
		case cells == nil:
			table = nil
		case table == nil && strings.EqualFold(strings.TrimSpace(cells[0]), "flag"):
			if marker == nil {
				c.problem(rel, n, "a table of flags without a <!-- docscheck: flags of COMMAND --> comment before it")
				table = &flagTable{flags: map[string]int{}} // collect and drop
				continue
			}
			c.tables = append(c.tables, flagTable{file: rel, line: n, of: *marker, flags: map[string]int{}})
			table = &c.tables[len(c.tables)-1]
			marker = nil
		case table != nil:
			for _, m := range flagRE.FindAllStringSubmatch(cells[0], -1) {
				table.flags[m[1]] = n
			}
		}

		spans, text := codeSpans(line)
		for _, code := range spans {
			d := ""
			if cmd, ok := parseCommand(code, &d); ok {
				cmd.file, cmd.line = rel, n
				c.commands = append(c.commands, cmd)
			}
		}
		var targets []string
		for _, m := range linkRE.FindAllStringSubmatch(text, -1) {
			targets = append(targets, m[1])
		}
		if m := refDefRE.FindStringSubmatch(text); m != nil {
			targets = append(targets, m[1])
		}
		for _, t := range targets {
			c.checkLink(rel, n, t)
		}
	}
	if fence != "" {
		c.problem(rel, len(lines), "code block left open")
	}
}

// tableCells returns the cells of a Markdown table row, or nil when line is
// not one.
func tableCells(line string) []string {
	s := strings.TrimSpace(line)
	if !strings.HasPrefix(s, "|") {
		return nil
	}
	s = strings.Trim(s, "|")
	return strings.Split(s, "|")
}

// codeSpans returns the contents of the inline code spans of line, and
// line without them.
func codeSpans(line string) (spans []string, rest string) {
	var b strings.Builder
	for {
		i := strings.IndexByte(line, '`')
		if i < 0 {
			b.WriteString(line)
			return spans, b.String()
		}
		ticks := 1
		for i+ticks < len(line) && line[i+ticks] == '`' {
			ticks++
		}
		delim := strings.Repeat("`", ticks)
		after := line[i+ticks:]
		j := strings.Index(after, delim)
		if j < 0 {
			b.WriteString(line)
			return spans, b.String()
		}
		b.WriteString(line[:i])
		spans = append(spans, strings.TrimSpace(after[:j]))
		line = after[j+ticks:]
	}
}

// checkLink checks one link target of a page.
func (c *checker) checkLink(rel string, line int, target string) {
	if schemeRE.MatchString(target) || strings.HasPrefix(target, "//") {
		return // not relative: nothing here can check it
	}
	c.links++
	pathPart, frag, _ := strings.Cut(target, "#")
	file := filepath.Join(c.root, rel)
	if pathPart != "" {
		p, err := url.PathUnescape(pathPart)
		if err != nil {
			c.problem(rel, line, "link %q: %v", target, err)
			return
		}
		file = filepath.Join(filepath.Dir(file), filepath.FromSlash(p))
		if !strings.HasPrefix(file, c.root+string(filepath.Separator)) && file != c.root {
			c.problem(rel, line, "link %q leaves the repository", target)
			return
		}
		st, err := os.Stat(file)
		if err != nil {
			c.problem(rel, line, "link %q: no such file or directory", target)
			return
		}
		if st.IsDir() {
			if frag != "" {
				c.problem(rel, line, "link %q: a directory has no anchors", target)
			}
			return
		}
	}
	if frag == "" {
		return
	}
	if !strings.HasSuffix(file, ".md") {
		c.problem(rel, line, "link %q: anchors are checked only in Markdown files", target)
		return
	}
	anchors, err := c.anchorsOf(file)
	if err != nil {
		c.problem(rel, line, "link %q: %v", target, err)
		return
	}
	if !anchors[strings.ToLower(frag)] {
		c.problem(rel, line, "link %q: no heading with that anchor", target)
	}
}

// anchorsOf returns the anchors of the headings of a Markdown file.
func (c *checker) anchorsOf(file string) (map[string]bool, error) {
	if a, ok := c.anchors[file]; ok {
		return a, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	a := anchors(string(data))
	c.anchors[file] = a
	return a, nil
}

// anchors returns the anchors GitHub gives the headings of a Markdown
// text, and those of <a name> or <a id> tags.
func anchors(text string) map[string]bool {
	a := make(map[string]bool)
	seen := make(map[string]int)
	fence := ""
	for _, line := range strings.Split(text, "\n") {
		if m := fenceRE.FindStringSubmatch(line); m != nil {
			switch {
			case fence == "":
				fence = m[1]
				continue
			case strings.HasPrefix(m[1], fence) && m[2] == "":
				fence = ""
				continue
			}
		}
		if fence != "" {
			continue
		}
		for _, m := range htmlIDRE.FindAllStringSubmatch(line, -1) {
			a[strings.ToLower(m[1])] = true
		}
		m := headingRE.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		s := slug(m[2])
		if k := seen[s]; k > 0 {
			seen[s]++
			s = fmt.Sprintf("%s-%d", s, k)
		} else {
			seen[s] = 1
		}
		a[s] = true
	}
	return a
}

// slug derives a heading's anchor as GitHub does: the heading's text,
// without its Markdown, lower-cased, with every character but letters,
// digits, marks, spaces, hyphens and underscores dropped and spaces made
// hyphens.
func slug(heading string) string {
	heading = linkRE.ReplaceAllStringFunc(heading, func(l string) string {
		i := strings.Index(l, "](")
		return strings.TrimPrefix(strings.TrimPrefix(l[:i], "!"), "[")
	})
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// parseCommand reads a shell line and reports whether it runs this
// repository's code: go run, go test or go build, or the ratecord binary.
// dir is the directory earlier "cd" lines moved to; a "cd" line itself
// moves it and is no command.
func parseCommand(line string, dir *string) (command, bool) {
	words := shellWords(line)
	for len(words) > 0 {
		switch {
		case words[0] == "cd" && len(words) >= 2:
			*dir = filepath.ToSlash(filepath.Clean(filepath.Join(*dir, words[1])))
			if *dir == "." {
				*dir = ""
			}
			words = words[2:]
			if len(words) > 0 && words[0] == "&&" {
				words = words[1:]
			}
			continue
		case isAssignment(words[0]):
			words = words[1:]
			continue
		}
		break
	}
	if i := indexOf(words, "&&"); i >= 0 {
		words = words[:i] // what follows is another command, not shown to be ours
	}
	if i := indexOf(words, "|"); i >= 0 {
		words = words[:i]
	}
	if len(words) == 0 {
		return command{}, false
	}
	switch {
	case words[0] == "go" && len(words) >= 2 && (words[1] == "test" || words[1] == "build"),
		words[0] == "go" && len(words) >= 3 && words[1] == "run": // "go run" alone names the command, runs nothing
		return command{dir: *dir, args: words}, true
	case words[0] == "ratecord" || words[0] == "./ratecord":
		// The binary of ./cmd/ratecord, from the root.
		return command{args: append([]string{"go", "run", "./cmd/ratecord"}, words[1:]...)}, true
	}
	return command{}, false
}

func indexOf(words []string, w string) int {
	for i, x := range words {
		if x == w {
			return i
		}
	}
	return -1
}

func isAssignment(w string) bool {
	name, _, ok := strings.Cut(w, "=")
	if !ok || name == "" {
		return false
	}
	for i, r := range name {
		if !(r == '_' || unicode.IsLetter(r) || i > 0 && unicode.IsDigit(r)) {
			return false
		}
	}
	return true
}

// shellWords splits a shell line into words: quotes removed, a comment, a
// redirection and a trailing "&" dropped, "&&" and "|" kept as words.
func shellWords(line string) []string {
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote rune
	)
	flush := func() {
		if in {
			words = append(words, cur.String())
		}
		cur.Reset()
		in = false
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == '#' && !in:
			i = len(rs) // a comment
		case r == ' ' || r == '\t':
			flush()
		case r == '&' || r == '|' || r == ';':
			flush()
			if i+1 < len(rs) && rs[i+1] == r {
				words = append(words, string(r)+string(r))
				i++
			} else if r == '|' {
				words = append(words, "|")
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	flush()
	out := words[:0]
	for _, w := range words {
		if strings.Contains(w, ">") || strings.HasPrefix(w, "<") {
			continue // a redirection
		}
		out = append(out, w)
	}
	return out
}

// A program is a command built from a package of this repository.
type program struct {
	bin      string
	err      error
	commands map[string]bool            // its subcommands, when -h lists any
	flags    map[string]map[string]bool // subcommand ("" for none) -> its flags
	helpErr  map[string]error
}

// goTestValueFlags are the flags of go test (and the build flags it takes)
// that take a value; goTestBoolFlags those that do not.
var (
	goTestValueFlags = set("run", "bench", "benchtime", "count", "cpu", "fuzz", "fuzztime", "fuzzminimizetime",
		"timeout", "list", "skip", "tags", "parallel", "coverprofile", "cpuprofile", "memprofile", "blockprofile",
		"mutexprofile", "trace", "o", "exec", "p", "covermode", "coverpkg", "outputdir", "shuffle", "ldflags", "gcflags")
	goTestBoolFlags = set("race", "v", "benchmem", "short", "cover", "json", "failfast", "x", "n", "c", "vet", "a", "trimpath", "msan", "asan")
)

func set(words ...string) map[string]bool {
	m := make(map[string]bool, len(words))
	for _, w := range words {
		m[w] = true
	}
	return m
}

// checkCommands checks every command collected, and the flag tables.
func (c *checker) checkCommands() {
	tmp, err := os.MkdirTemp("", "docscheck")
	if err != nil {
		c.problem("docscheck", 0, "%v", err)
		return
	}
	defer os.RemoveAll(tmp)
	c.tmp = tmp
	for _, cmd := range c.commands {
		switch cmd.args[1] {
		case "run":
			c.checkRun(cmd, nil, 0)
		case "test":
			c.checkTest(cmd)
		case "build":
			c.checkBuild(cmd)
		}
	}
	for _, t := range c.tables {
		if t.of.args[1] != "run" {
			c.problem(t.file, t.line, "the docscheck comment before this table names no go run command")
			continue
		}
		c.checkRun(t.of, t.flags, t.line)
	}
}

// goFlags splits the words after "go run", "go test" or "go build" into
// the go command's flags and the rest, the first of which is the package.
func goFlags(words []string) (flags, rest []string) {
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !strings.HasPrefix(w, "-") {
			return flags, words[i:]
		}
		flags = append(flags, w)
		name := strings.TrimLeft(w, "-")
		if !strings.Contains(name, "=") && goTestValueFlags[name] && i+1 < len(words) {
			i++
			flags = append(flags, words[i])
		}
	}
	return flags, nil
}

// checkRun checks a go run command: its program builds, its subcommand
// exists, and the flags it names (and those of a table, listed in table)
// are in the help of the program or subcommand.
func (c *checker) checkRun(cmd command, table map[string]int, tableLine int) {
	_, rest := goFlags(cmd.args[2:])
	if len(rest) == 0 {
		c.problem(cmd.file, cmd.line, "%s: no package", strings.Join(cmd.args, " "))
		return
	}
	pkg, args := rest[0], rest[1:]
	p := c.build(cmd.dir, pkg)
	if p.err != nil {
		c.problem(cmd.file, cmd.line, "%s: %v", strings.Join(cmd.args, " "), p.err)
		return
	}
	sub := ""
	if p.commands != nil {
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			if table != nil {
				c.problem(cmd.file, cmd.line, "%s: the table's command names no subcommand", strings.Join(cmd.args, " "))
				return
			}
			if len(args) == 0 {
				return // the program's own usage
			}
		} else {
			sub, args = args[0], args[1:]
			if !p.commands[sub] {
				c.problem(cmd.file, cmd.line, "%s: %s has no subcommand %q", strings.Join(cmd.args, " "), pkg, sub)
				return
			}
		}
	}
	flags, err := c.help(p, sub)
	if err != nil {
		c.problem(cmd.file, cmd.line, "%s: %v", strings.Join(cmd.args, " "), err)
		return
	}
	for _, a := range args {
		if !strings.HasPrefix(a, "-") || a == "-" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name == "h" || name == "help" {
			continue
		}
		if !flags[name] {
			c.problem(cmd.file, cmd.line, "%s: no flag -%s in %s", strings.Join(cmd.args, " "), name, helpName(pkg, sub))
		}
	}
	names := make([]string, 0, len(table))
	for f := range table {
		names = append(names, f)
	}
	sort.Strings(names)
	for _, f := range names {
		if !flags[strings.TrimLeft(f, "-")] {
			c.problem(cmd.file, table[f], "table of %s: no flag %s in its -h", helpName(pkg, sub), f)
		}
	}
}

func helpName(pkg, sub string) string {
	if sub == "" {
		return pkg + " -h"
	}
	return pkg + " " + sub + " -h"
}

// build builds the program of package pkg in dir, once.
func (c *checker) build(dir, pkg string) *program {
	key := dir + "\x00" + pkg
	if p, ok := c.builds[key]; ok {
		return p
	}
	p := &program{bin: filepath.Join(c.tmp, fmt.Sprintf("prog%d", len(c.builds))), flags: map[string]map[string]bool{}, helpErr: map[string]error{}}
	c.builds[key] = p
	out, err := c.goCmd(dir, "build", "-o", p.bin, pkg)
	if err != nil {
		p.err = fmt.Errorf("go build %s in %q: %v\n%s", pkg, dir, err, out)
		return p
	}
	help, err := run(p.bin, "-h")
	if err != nil {
		p.err = fmt.Errorf("%s -h: %v\n%s", pkg, err, help)
		return p
	}
	if _, list, ok := strings.Cut(help, "\nCommands:\n"); ok {
		p.commands = map[string]bool{}
		for _, l := range strings.Split(list, "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || !strings.HasPrefix(l, " ") {
				break
			}
			p.commands[f[0]] = true
		}
	} else {
		p.flags[""] = helpFlags(help)
	}
	return p
}

// help returns the flags of a program or of one of its subcommands.
func (c *checker) help(p *program, sub string) (map[string]bool, error) {
	if f, ok := p.flags[sub]; ok {
		return f, p.helpErr[sub]
	}
	out, err := run(p.bin, sub, "-h")
	if err != nil {
		err = fmt.Errorf("%s -h: %v\n%s", sub, err, out)
	}
	p.flags[sub], p.helpErr[sub] = helpFlags(out), err
	return p.flags[sub], err
}

func helpFlags(help string) map[string]bool {
	flags := map[string]bool{}
	for _, m := range helpRE.FindAllStringSubmatch(help, -1) {
		flags[m[1]] = true
	}
	return flags
}

// checkTest checks a go test command: its flags are go test's, its packages
// exist, and its -run, -bench and -fuzz patterns match something in them.
func (c *checker) checkTest(cmd command) {
	flags, pkgs := goFlags(cmd.args[2:])
	what := strings.Join(cmd.args, " ")
	patterns := map[string]string{}
	for i := 0; i < len(flags); i++ {
		name, val, hasVal := strings.Cut(strings.TrimLeft(flags[i], "-"), "=")
		switch {
		case goTestValueFlags[name]:
			if !hasVal {
				i++
				if i >= len(flags) {
					c.problem(cmd.file, cmd.line, "%s: -%s needs a value", what, name)
					return
				}
				val = flags[i]
			}
			if name == "run" || name == "bench" || name == "fuzz" {
				patterns[name] = val
			}
		case goTestBoolFlags[name]:
		default:
			c.problem(cmd.file, cmd.line, "%s: go test has no flag -%s", what, name)
		}
	}
	for _, p := range pkgs {
		if strings.HasPrefix(p, "-") {
			c.problem(cmd.file, cmd.line, "%s: flag %s after the packages", what, p)
			return
		}
	}
	if len(pkgs) == 0 {
		pkgs = []string{"."}
	}
	if out, err := c.goCmd(cmd.dir, append([]string{"list"}, pkgs...)...); err != nil {
		c.problem(cmd.file, cmd.line, "%s: go list: %v\n%s", what, err, out)
		return
	}
	for _, kind := range []string{"run", "bench", "fuzz"} {
		pat, ok := patterns[kind]
		if !ok || pat == "^$" {
			continue
		}
		re, err := regexp.Compile(strings.Split(pat, "/")[0])
		if err != nil {
			c.problem(cmd.file, cmd.line, "%s: -%s %q: %v", what, kind, pat, err)
			continue
		}
		found := false
		for _, p := range pkgs {
			names, err := c.testNames(cmd.dir, p)
			if err != nil {
				c.problem(cmd.file, cmd.line, "%s: %v", what, err)
				return
			}
			for _, n := range names {
				if re.MatchString(n) && fitsKind(kind, n) {
					found = true
				}
			}
		}
		if !found {
			c.problem(cmd.file, cmd.line, "%s: -%s %q matches nothing in %s", what, kind, pat, strings.Join(pkgs, " "))
		}
	}
}

// fitsKind reports whether a test's name is one a -run, -bench or -fuzz
// pattern selects.
func fitsKind(kind, name string) bool {
	switch kind {
	case "bench":
		return strings.HasPrefix(name, "Benchmark")
	case "fuzz":
		return strings.HasPrefix(name, "Fuzz")
	}
	return !strings.HasPrefix(name, "Benchmark")
}

// testNames lists the tests, benchmarks, fuzz targets and examples of the
// packages matched by pkg in dir.
func (c *checker) testNames(dir, pkg string) ([]string, error) {
	key := dir + "\x00" + pkg
	if names, ok := c.lists[key]; ok {
		return names, nil
	}
	out, err := c.goCmd(dir, "test", "-list", ".", pkg)
	if err != nil {
		return nil, fmt.Errorf("go test -list . %s: %v\n%s", pkg, err, out)
	}
	var names []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 1 && !strings.HasPrefix(l, "ok") {
			names = append(names, f[0])
		}
	}
	c.lists[key] = names
	return names, nil
}

// checkBuild checks that the packages of a go build command exist.
func (c *checker) checkBuild(cmd command) {
	_, pkgs := goFlags(cmd.args[2:])
	if len(pkgs) == 0 {
		pkgs = []string{"."}
	}
	if out, err := c.goCmd(cmd.dir, append([]string{"list"}, pkgs...)...); err != nil {
		c.problem(cmd.file, cmd.line, "%s: go list: %v\n%s", strings.Join(cmd.args, " "), err, out)
	}
}

// goCmd runs the go command in dir, relative to the root.
func (c *checker) goCmd(dir string, args ...string) (string, error) {
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(c.root, dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// run runs a built program and returns what it printed.
func run(bin string, args ...string) (string, error) {
	var clean []string
	for _, a := range args {
		if a != "" {
			clean = append(clean, a)
		}
	}
	cmd := exec.Command(bin, clean...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}
